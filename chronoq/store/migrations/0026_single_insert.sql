-- The single keyed submit's insert (insert_task_once in queries.sql) as a function with one
-- generic plan per session, as 0025 made the hand-off's. The store plans every statement with
-- its arguments (plan_cache_mode force_custom_plan, chronoq.store.connection); this one was
-- insert_tasks over its 24 column arrays for one row, with its key checked in the same
-- statement, and planning it took about as long as running it, on every single Submit not
-- handed to a waiting stream. Its plan does not depend on its arguments: one row, refused by
-- equality on the key's unique index in tasks and in the history, so a generic plan is the
-- custom one once tasks has statistics. (A session's plan made while tasks is nearly empty and
-- not yet analyzed, as in a fresh database, may probe the key through another index led by
-- the namespace, a scan of the namespace's rows, until the next ANALYZE of tasks replans it.)
-- Scalars, not arrays: a generic plan of an unnest would guess its rows.
--
-- Semantics as the statement had them: VOLATILE, so its one INSERT takes its own snapshot, in
-- which the NOT EXISTS on tasks and chronoq_key_retired (STABLE, migration 0024) read the key;
-- a task the sweep moves meanwhile is seen in exactly one of the two. chronoq_hold fences its
-- partition at map_version first, whether or not the key is taken. READY (fired by the submit
-- at created) or SCHEDULED, as task_state says. No row when the key is taken.
CREATE FUNCTION chronoq_insert_task_once(
    task uuid, ns text, queue_name text, part smallint, bucket_no bigint, due timestamptz,
    task_state smallint, prio integer, body bytea, idem_key text, attempts_max integer,
    backoff_first bigint, backoff_cap bigint, lease_ms bigint, misfire smallint,
    misfire_grace bigint, ctype text, trace jsonb, conc_key text, uniq_key text,
    uniq_until timestamptz, deb_key text, deb_until timestamptz, task_labels jsonb,
    created timestamptz, map_version bigint
) RETURNS SETOF tasks
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    row_out tasks;
BEGIN
    -- The fence first, whether or not the key is taken, as the statement's one-time filter
    -- ran it: in one statement the planner may test the key (its NOT EXISTS reads only
    -- arguments here) first and skip the fence. Its lock is the transaction's, so it still
    -- covers the insert.
    PERFORM chronoq_hold(ARRAY[part], map_version);
    INSERT INTO tasks AS t (id, namespace, queue, partition, bucket, run_at, state, priority,
                       payload, idempotency_key, max_attempts, backoff_initial_ms,
                       backoff_max_ms, lease_timeout_ms, misfire_policy, misfire_grace_ms,
                       created_at, fired_at, fired_by, content_type, trace_context,
                       concurrency_key, unique_key, unique_until, debounce_key, debounce_until,
                       labels)
    SELECT task, ns, queue_name, part, bucket_no, due, u.state, prio, body, idem_key,
           attempts_max, backoff_first, backoff_cap, lease_ms, misfire, misfire_grace, created,
           CASE WHEN u.state = 1 THEN created END,
           CASE WHEN u.state = 1 THEN 'submit' END,
           ctype, trace, conc_key, uniq_key, uniq_until, deb_key, deb_until, task_labels
    FROM (VALUES (task_state)) AS u(state)
    WHERE NOT EXISTS (SELECT 1 FROM tasks k
                      WHERE k.namespace = ns AND k.idempotency_key = idem_key)
      AND NOT chronoq_key_retired(ns, idem_key)
    ON CONFLICT (namespace, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING t.* INTO row_out;
    IF FOUND THEN
        RETURN NEXT row_out;
    END IF;
END
$$;
