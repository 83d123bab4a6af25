-- Counts by (namespace, queue, state) that the partition owners keep (chronoq.node.queue_counts):
-- each owner recounts its partitions from tasks_partition_states alone (an index-only scan
-- of one partition's live entries) every few seconds, off the firing tick, and the
-- QueueCounts RPC sums these rows instead of reading tasks, whatever the backlog.
CREATE INDEX tasks_partition_states ON tasks (partition, state, namespace, queue)
    WHERE state IN (0, 1, 2, 4);

-- One partition's counts as of its last recount. A (partition, namespace, state) with more
-- queues than the recount keeps (chronoq.limits.MAX_KEPT_QUEUES) sums the rest under queue ''
-- (no queue has that name), so totals stay exact.
CREATE TABLE queue_state_counts (
    partition smallint NOT NULL,
    namespace text     NOT NULL,
    state     smallint NOT NULL,
    queue     text     NOT NULL,
    n         bigint   NOT NULL,
    PRIMARY KEY (partition, namespace, state, queue)
);
CREATE INDEX queue_state_counts_namespace ON queue_state_counts (namespace, state, queue);

-- When each partition was last recounted (and by whom): an answer is as fresh as the
-- oldest of the partitions it sums. READY and RUNNING (a few index entries per partition:
-- the index keeps each state's entries together) are recounted more often than every state.
CREATE TABLE queue_counts_at (
    partition  smallint    PRIMARY KEY,
    counted_at timestamptz,           -- every state (NULL: not yet)
    live_at    timestamptz NOT NULL,  -- READY and RUNNING
    counter    text        NOT NULL DEFAULT ''
);
