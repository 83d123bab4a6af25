-- Counters of a namespace that must hold across store shards (docs/design/shards.md): its
-- schedules and the tasks/s they reserve, kept on the map's first shard (shard-0), which is
-- never removed. The rows have no partition, so no move carries them. Used only while the map
-- names more than one shard; with one shard, the inserting statement counts the rows itself.
CREATE TABLE namespace_counts (
    namespace    text        PRIMARY KEY,
    schedules    bigint      NOT NULL,  -- schedules, plus creates taken and not yet given back
    reserved     float8      NOT NULL,  -- the active ones' max_rate (tasks/s), likewise
    epoch        bigint      NOT NULL DEFAULT 0,  -- + 1 at every recount: stale releases skip
    recounted_at timestamptz NOT NULL   -- the seed's or last recount's instant
);
CREATE INDEX namespace_counts_recounted ON namespace_counts (recounted_at);

-- One row per create (or resume) that took from its namespace's counter and has not yet said
-- how it ended: dropped when it succeeded, given back (row and counts) when it was refused.
-- One left behind (an outcome unknown) keeps counting until a recount once it is stale.
CREATE TABLE namespace_takes (
    token     uuid        PRIMARY KEY,
    namespace text        NOT NULL,
    schedules integer     NOT NULL,
    reserved  float8      NOT NULL,
    taken_at  timestamptz NOT NULL
);
CREATE INDEX namespace_takes_namespace ON namespace_takes (namespace, taken_at);
