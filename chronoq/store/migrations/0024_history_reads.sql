-- Reads of the task history (migration 0022) for the statements of every submit and every
-- read by id. The store plans each execution with its arguments (plan_cache_mode
-- force_custom_plan, chronoq.store.connection), which for a table of time slices means
-- planning every slice and its indexes each time: 0.5 ms a statement at 9 slices, 2 ms at 32,
-- where the read of tasks by id takes 0.06 ms. These functions keep one generic plan per
-- session instead. STABLE: their reads use the snapshot of the statement that calls them, so
-- a statement reading tasks and one of these sees a row that the sweep moves in exactly one
-- of the two.

-- A task of the history by id, in its namespace.
CREATE FUNCTION chronoq_history_task(task uuid, ns text) RETURNS SETOF task_history
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY SELECT * FROM task_history h WHERE h.id = task AND h.namespace = ns;
END
$$;

-- The tasks of the history holding some idempotency keys of a namespace.
CREATE FUNCTION chronoq_history_keys(ns text, keys text[]) RETURNS SETOF task_history
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN QUERY SELECT * FROM task_history h
        WHERE h.namespace = ns AND h.idempotency_key = ANY(keys);
END
$$;

-- Whether one idempotency key of a namespace has its task in the history (for a statement
-- that tests it row by row, as a NOT EXISTS would).
CREATE FUNCTION chronoq_key_retired(ns text, key text) RETURNS boolean
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    RETURN key IS NOT NULL AND EXISTS (
        SELECT 1 FROM task_history h WHERE h.namespace = ns AND h.idempotency_key = key);
END
$$;
