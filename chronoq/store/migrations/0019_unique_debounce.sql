-- Unique tasks and debounce (docs/unique-and-debounce.md). Each rule is a unique partial
-- index, so concurrent submits on any nodes are decided by PostgreSQL, never by a read
-- before the insert. The key's partition is part of each index: a key's tasks are placed in
-- one partition (chronoq.routing.spec_routing_key), so the rule holds among the tasks placed
-- alike whatever the shards, and a partition moved into another shard never collides there.

-- A task whose unique_for window a later submit found over: it no longer holds its key's
-- window (NULL while it does, or when it has none). Internal; not part of the Task.
ALTER TABLE tasks ADD COLUMN unique_closed boolean;

-- At most one pending task per unique key: SCHEDULED, READY or RUNNING. RUNNING counts
-- because a running task goes back to SCHEDULED or READY on a retry, a release or an
-- expired lease; a second task admitted meanwhile would make that write fail.
CREATE UNIQUE INDEX tasks_unique_pending ON tasks (namespace, partition, unique_key)
    WHERE unique_key IS NOT NULL AND state IN (0, 1, 2);

-- At most one task per unique key holding an open unique_for window, whatever its state.
CREATE UNIQUE INDEX tasks_unique_window ON tasks (namespace, partition, unique_key)
    WHERE unique_key IS NOT NULL AND unique_until IS NOT NULL AND unique_closed IS NULL;

-- At most one debounced task per key that has not started yet: SCHEDULED at attempt 0 (a
-- retry waiting SCHEDULED has run once, so it is out, and a retry never collides here).
CREATE UNIQUE INDEX tasks_debounce_pending ON tasks (namespace, partition, debounce_key)
    WHERE debounce_key IS NOT NULL AND state = 0 AND attempt = 0;
