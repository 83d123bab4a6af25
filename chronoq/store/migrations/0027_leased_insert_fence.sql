-- chronoq_insert_task_leased (migration 0025) checks its partition's fence in a statement of
-- its own before its insert, as chronoq_insert_task_once (0026) does. In the insert the fence
-- was one condition among those of the key, whose NOT EXISTS reads only the function's
-- arguments: the planner tested the key first, so a leased submit of a taken key on a
-- partition this shard does not hold live answered the key's first task instead of being
-- refused, as the statement before 0025 (its key tested row by row, after the fence) refused
-- it. The lock chronoq_hold takes is the transaction's, so it covers the insert after it. The
-- rest is 0025's function unchanged.
CREATE OR REPLACE FUNCTION chronoq_insert_task_leased(
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
    -- the fence first, whether or not the key is taken (see above)
    PERFORM chronoq_hold(ARRAY[part], map_version);
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
    ON CONFLICT (namespace, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING t.* INTO row_out;
    IF FOUND THEN
        RETURN NEXT row_out;
    END IF;
END
$$;
