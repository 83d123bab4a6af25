-- The submit's hand-off insert (insert_task_leased in queries.sql) as a function with one
-- generic plan per session. The store plans every statement with its arguments (plan_cache_mode
-- force_custom_plan, chronoq.store.connection); for this one, the insert of a task due now
-- leased to a waiting stream, planning took ~0.37 ms of its ~0.65 ms, on the one round trip
-- that lies between a submit and its handler. Its plan does not depend on its arguments: one
-- row, found or refused by equality on unique or leading index columns (the key in tasks and
-- in the history, the head of its queue in tasks_ready, its queue's settings), so a generic
-- plan is the custom one, whatever the table held when it was made. Scalars, not arrays: a
-- generic plan of an unnest would guess its rows.
--
-- Semantics as the statement had them: VOLATILE, so its one INSERT takes its own snapshot, in
-- which the NOT EXISTS on tasks and chronoq_key_retired (STABLE, migration 0024) read the key;
-- a task the sweep moves meanwhile is seen in exactly one of the two. chronoq_hold fences its
-- partition at map_version. No row when the key is taken or the task is not due at created.
CREATE FUNCTION chronoq_insert_task_leased(
    task uuid, ns text, queue_name text, part smallint, bucket_no bigint, due timestamptz,
    prio integer, body bytea, idem_key text, attempts_max integer, backoff_first bigint,
    backoff_cap bigint, lease_ms bigint, misfire smallint, misfire_grace bigint, ctype text,
    trace jsonb, conc_key text, uniq_key text, uniq_until timestamptz, deb_key text,
    deb_until timestamptz, task_labels jsonb, created timestamptz, worker text,
    lease_min_ms bigint, lease_max_ms bigint, map_version bigint
) RETURNS SETOF tasks
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    row_out tasks;
BEGIN
    INSERT INTO tasks AS t (id, namespace, queue, partition, bucket, run_at, state, priority,
                       payload, idempotency_key, max_attempts, backoff_initial_ms,
                       backoff_max_ms, lease_timeout_ms, misfire_policy, misfire_grace_ms,
                       created_at, fired_at, fired_by, content_type, trace_context,
                       concurrency_key, unique_key, unique_until, debounce_key, debounce_until,
                       labels, attempt, worker_id, lease_until)
    SELECT task, ns, queue_name, part, bucket_no, due, CASE WHEN w.waits THEN 1 ELSE 2 END,
           prio, body, idem_key, attempts_max, backoff_first, backoff_cap, lease_ms, misfire,
           misfire_grace, created, created, 'submit', ctype, trace, conc_key, uniq_key,
           uniq_until, deb_key, deb_until, task_labels,
           (NOT w.waits)::integer,
           CASE WHEN NOT w.waits THEN worker END,
           CASE WHEN NOT w.waits
                THEN created + least(greatest(lease_ms, lease_min_ms), lease_max_ms)
                               * interval '1 ms'
           END
    FROM (
        -- the head of the queue in claim order, one probe of tasks_ready whatever the
        -- backlog; a gated queue (paused, or limited per key) is never handed off, whatever
        -- the node's gate said: the task goes READY for claims
        SELECT coalesce(bool_or(h.priority > prio
                                OR (h.priority = prio AND h.run_at <= due)), false)
               OR EXISTS (SELECT 1 FROM queue_settings s
                          WHERE s.namespace = ns AND s.queue = queue_name
                            AND (s.paused OR s.max_running_per_key > 0
                                 OR s.max_starts_per_key > 0))
               AS waits
        FROM (SELECT r.priority, r.run_at FROM tasks r
              WHERE r.namespace = ns AND r.queue = queue_name AND r.state = 1
              ORDER BY r.priority DESC, r.run_at
              LIMIT 1) h
    ) w
    WHERE due <= created
      AND NOT EXISTS (SELECT 1 FROM tasks k
                      WHERE k.namespace = ns AND k.idempotency_key = idem_key)
      AND NOT chronoq_key_retired(ns, idem_key)
      AND (SELECT chronoq_hold(ARRAY[part], map_version))
    ON CONFLICT (namespace, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING t.* INTO row_out;
    IF FOUND THEN
        RETURN NEXT row_out;
    END IF;
END
$$;
