-- Rows from before routing (docs/design/shards.md): a keyed task made before routing sits in
-- the partition of its id's hash, while a submit of its key now goes to the key's partition.
-- While one shard holds every partition its unique index sees both; once partitions move, a
-- repeated submit must find the old task through an entry here (chronoq.store.legacy).
-- An entry lives in the key's partition (`partition`: the one a submit of the key reaches),
-- so a move carries it with the key; it names the old row (`id`, in `row_partition`).
CREATE TABLE legacy_routes (
    id            uuid     PRIMARY KEY,  -- the task made before routing
    partition     smallint NOT NULL,     -- its key's partition: the entry moves with it
    kind          smallint NOT NULL,     -- which routing key: 0 the idempotency key
    namespace     text     NOT NULL,
    key           text     NOT NULL,
    row_partition smallint NOT NULL,     -- the partition of the task's row (its id's hash)
    UNIQUE (namespace, kind, key)
);
-- A move lists and copies one partition's entries (kind 2 in move_rows).
CREATE INDEX legacy_routes_partition ON legacy_routes (partition, id);

-- Progress of the one build of the routes on the shard that held every partition before the
-- first move: resumed after a crash from tasks_after, skipped once finished_at is set.
CREATE TABLE legacy_build (
    only_row     boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    tasks_after  uuid        NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
    routes       bigint      NOT NULL DEFAULT 0,
    rehomed      bigint      NOT NULL DEFAULT 0,
    finished_at  timestamptz
);
