-- Retention purges finished tasks oldest first, per partition, without scanning live ones.
CREATE INDEX tasks_finished ON tasks (partition, finished_at) WHERE state >= 3;
