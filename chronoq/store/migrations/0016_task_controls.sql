-- Queue controls. A task's keys (NULL: none): concurrency_key (at most max_running_per_key of
-- a key's tasks run at once), unique_key (no second pending task of the key; until
-- unique_until when set), debounce_key (a repeated submit postpones the pending task, up to
-- debounce_until); and labels, a small JSON object of strings (NULL: none). All NULL by
-- default: no rewrite of existing rows.
ALTER TABLE tasks
    ADD COLUMN concurrency_key text,
    ADD COLUMN unique_key text,
    ADD COLUMN unique_until timestamptz,
    ADD COLUMN debounce_key text,
    ADD COLUMN debounce_until timestamptz,
    ADD COLUMN labels jsonb;

-- Per (namespace, queue): paused, and the per-key limits (0: no limit). With store shards a
-- row is written to every shard, so each shard's claim statement reads its own copy.
CREATE TABLE queue_settings (
    namespace text NOT NULL,
    queue text NOT NULL,
    paused boolean NOT NULL DEFAULT false,
    paused_at timestamptz,
    max_running_per_key integer NOT NULL DEFAULT 0,
    max_starts_per_key double precision NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (namespace, queue)
);

-- Labels kept uncompressed, as trace_context (0015): pg_column_size in the task_bytes
-- fragment then reads their full size, so answer byte budgets hold.
ALTER TABLE tasks ALTER COLUMN labels SET STORAGE EXTERNAL;
