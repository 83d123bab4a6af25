-- Tasks, partition fences and the indexes of the hot paths.
--
-- Stays within what PostgreSQL-compatible distributed SQL engines support: plain tables,
-- partial indexes, FOR UPDATE SKIP LOCKED, unnest(); no server-side functions or triggers.
-- `partition` is the natural shard key.

CREATE TABLE tasks (
    id                 uuid        PRIMARY KEY,
    namespace          text        NOT NULL,
    queue              text        NOT NULL,
    partition          smallint    NOT NULL,
    bucket             bigint      NOT NULL,
    run_at             timestamptz NOT NULL,
    state              smallint    NOT NULL,  -- chronoq.models.TaskState
    priority           integer     NOT NULL DEFAULT 0,
    payload            bytea       NOT NULL DEFAULT '\x',
    idempotency_key    text,
    attempt            integer     NOT NULL DEFAULT 0,  -- claims so far; the lease token
    max_attempts       integer     NOT NULL,
    retry_base         integer     NOT NULL DEFAULT 0,  -- attempts before it do not count
    backoff_initial_ms bigint      NOT NULL,
    backoff_max_ms     bigint      NOT NULL,
    lease_timeout_ms   bigint      NOT NULL,
    misfire_policy     smallint    NOT NULL DEFAULT 0,
    misfire_grace_ms   bigint      NOT NULL,
    lease_until        timestamptz,
    worker_id          text,
    last_error         text,
    created_at         timestamptz NOT NULL,
    fired_at           timestamptz,
    finished_at        timestamptz
);

-- Submit is idempotent on (namespace, idempotency_key).
CREATE UNIQUE INDEX tasks_idempotency ON tasks (namespace, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The firing path: one partition, a range of buckets, pending rows only.
CREATE INDEX tasks_due ON tasks (partition, bucket, run_at) WHERE state = 0;

-- Worker claims: ready rows of one queue, highest priority first, then oldest.
CREATE INDEX tasks_ready ON tasks (namespace, queue, priority DESC, run_at) WHERE state = 1;

-- The reaper: running rows of one partition by lease deadline.
CREATE INDEX tasks_leases ON tasks (partition, lease_until) WHERE state = 2;

-- Listing by state (and the dead-letter queue), keyset-paginated by id.
CREATE INDEX tasks_listing ON tasks (namespace, state, id);

-- One row per partition: the fencing token of its current owner, and the watermark below
-- which every bucket of the partition has been fired.
CREATE TABLE partition_fences (
    partition   smallint    PRIMARY KEY,
    token       bigint      NOT NULL,
    cluster_id  text        NOT NULL DEFAULT '',
    owner       text        NOT NULL DEFAULT '',
    watermark   bigint      NOT NULL DEFAULT 0,
    acquired_at timestamptz NOT NULL DEFAULT now()
);
