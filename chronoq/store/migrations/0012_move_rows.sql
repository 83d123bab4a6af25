-- What a partition move copied to this shard (chronoq.store.mover): per copied row of a
-- moving partition, the source row's xmin at the copy. A catch-up round compares it with the
-- source's rows now: a different xmin is a row changed since (xmin changes with every update
-- and survives freezing and failover), a missing one is new, an entry the source no longer
-- lists is a row deleted there. Only incoming partitions have entries; they go once the
-- partition is live here and the source cleaned up, or with the rows on a rollback.
CREATE TABLE move_rows (
    partition   smallint NOT NULL,
    kind        smallint NOT NULL,  -- 0 tasks, 1 schedules
    id          uuid     NOT NULL,
    source_xmin bigint   NOT NULL,
    PRIMARY KEY (partition, kind, id)
);
