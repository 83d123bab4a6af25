-- Claims of queues limited per concurrency key (chronoq.store.key_claims).
--
-- The READY tasks of each key in claim order: a key's head is its first entry, and a walk
-- from key to key (one probe each) lists the keys with ready work, however many tasks each
-- has waiting. Only tasks with a key are in it: a queue without keys pays nothing.
CREATE INDEX tasks_ready_keys ON tasks (namespace, queue, concurrency_key, priority DESC, run_at)
    WHERE state = 1 AND concurrency_key IS NOT NULL;

-- The RUNNING tasks of each key: a key's running count is read from at most its limit of
-- entries.
CREATE INDEX tasks_running_keys ON tasks (namespace, queue, concurrency_key)
    WHERE state = 2 AND concurrency_key IS NOT NULL;

-- Starts per key and second (queue_settings.max_starts_per_key): a token bucket per key of
-- burst 1, taken by the claim that starts the key's task, in its transaction. A key without
-- a row has a full bucket, so rows whose bucket has refilled are deleted (key_tokens_refilled
-- finds them) and the table holds the keys started lately only.
CREATE TABLE key_tokens (
    namespace       text             NOT NULL,
    queue           text             NOT NULL,
    concurrency_key text             NOT NULL,
    tokens          double precision NOT NULL,
    refilled_at     timestamptz      NOT NULL,
    PRIMARY KEY (namespace, queue, concurrency_key)
);
CREATE INDEX key_tokens_refilled ON key_tokens (refilled_at);
