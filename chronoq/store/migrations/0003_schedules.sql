-- Recurring schedules. The owner of a schedule's partition materialises its occurrences as
-- tasks whose idempotency key is (schedule, fire time): a failover never creates one twice.
CREATE TABLE schedules (
    id                 uuid        PRIMARY KEY,
    namespace          text        NOT NULL,
    name               text        NOT NULL,
    partition          smallint    NOT NULL,
    queue              text        NOT NULL,
    cron               text,                 -- exactly one of cron and interval_ms
    interval_ms        bigint,
    timezone           text        NOT NULL DEFAULT 'UTC',
    anchor             timestamptz NOT NULL,  -- intervals count from here
    catchup            smallint    NOT NULL DEFAULT 1,  -- chronoq.recurrence.CatchUp
    payload            bytea       NOT NULL DEFAULT '\x',
    priority           integer     NOT NULL DEFAULT 0,
    max_attempts       integer     NOT NULL,
    backoff_initial_ms bigint      NOT NULL,
    backoff_max_ms     bigint      NOT NULL,
    lease_timeout_ms   bigint      NOT NULL,
    paused             boolean     NOT NULL DEFAULT false,
    next_fire_at       timestamptz NOT NULL,
    last_fire_at       timestamptz,
    created_total      bigint      NOT NULL DEFAULT 0,
    skipped_total      bigint      NOT NULL DEFAULT 0,
    created_at         timestamptz NOT NULL,
    CONSTRAINT schedules_one_rule CHECK ((cron IS NULL) <> (interval_ms IS NULL)),
    UNIQUE (namespace, name)
);

-- The owner's materialising scan: one partition, active schedules by next occurrence.
CREATE INDEX schedules_due ON schedules (partition, next_fire_at) WHERE NOT paused;
