-- The history of finished tasks (SUCCEEDED, CANCELLED, SKIPPED) away from the live table.
-- Retention moves a finished row out of tasks into task_history (one statement: a DELETE
-- feeding an INSERT), and task_history is ranged by retire_at, the moment the row may go: a
-- slice whose upper bound has passed is dropped whole (DROP TABLE), so history leaves no dead
-- tuples and its size is bounded by the retention window. tasks keeps what is live, DEAD
-- letters (an operator's work list: counted, requeued) and rows that hold an open unique_for
-- window (tasks_unique_window decides those). Rows here are never updated. The columns are
-- tasks' own, in tasks' order, then retire_at; a migration that adds a column to tasks adds it
-- here too (tests/integration/test_task_history.py compares the two).
-- INCLUDING STORAGE: trace_context and labels stay uncompressed, as in tasks (0015, 0016), so a
-- listing's byte budget (task_bytes) reads their full size here too.
CREATE TABLE task_history (LIKE tasks INCLUDING DEFAULTS INCLUDING STORAGE,
                           retire_at timestamptz NOT NULL)
    PARTITION BY RANGE (retire_at);

-- Kept forever (no retention): never dropped. Time slices are made by the node as needed.
CREATE TABLE task_history_forever PARTITION OF task_history
    FOR VALUES FROM ('infinity') TO (MAXVALUE);

-- By id (GetTask), by idempotency key (a keyed submit answers its first task until the
-- task's slice is dropped), by state (listings, keyset by id) and by partition (moves).
CREATE INDEX task_history_id ON task_history (id);
CREATE INDEX task_history_idempotency ON task_history (namespace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX task_history_listing ON task_history (namespace, state, id);
CREATE INDEX task_history_partition ON task_history (partition, id);

-- The sweep's pick (retire_finished): the finished rows that move, per partition by finish,
-- without the DEAD letters, which stay in tasks and would otherwise be walked past on every
-- batch (tasks_finished holds both).
CREATE INDEX tasks_retiring ON tasks (partition, finished_at) WHERE state IN (3, 5, 6);
