-- Counts of one namespace's tasks by (state, queue), and the oldest run_at of each, read from
-- the index alone (an index-only scan): the console's Queues page and the CountTasks RPC,
-- without reading tasks. Live states and the dead letters only: finished rows grow forever.
CREATE INDEX tasks_queue_states ON tasks (namespace, state, queue, run_at)
    WHERE state IN (0, 1, 2, 4);
