-- Fair firing across namespaces: the firing index gains the namespace after the bucket, so an
-- owner can list the (bucket, namespace) lanes of its due window with one index probe per lane
-- (a loose index scan) and give each lane a share of its batch. Same name, same rows (pending
-- only); every reader of the old (partition, bucket, run_at) prefix still finds it.
DROP INDEX tasks_due;
CREATE INDEX tasks_due ON tasks (partition, bucket, namespace, run_at) WHERE state = 0;

-- The most tasks per second a schedule can make (chronoq.ratelimit.schedule_rate): the active
-- schedules of a namespace together may not pass its submit quota. Rows from before: one per
-- interval, and one a minute for cron (five fields: a minute is its finest unit).
ALTER TABLE schedules ADD COLUMN max_rate double precision NOT NULL DEFAULT 0;
UPDATE schedules
SET max_rate = CASE WHEN cron IS NOT NULL THEN 1.0 / 60
                    ELSE 1000.0 / greatest(interval_ms, 1000) END;
