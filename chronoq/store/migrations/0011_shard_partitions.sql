-- Store-side fencing of the shard map (docs/design/shards.md): the partitions this shard
-- holds, and since which map version. Every write of a partition checks it, so a node that
-- routes by a stale map cannot write a moved partition's tasks into its old shard.
CREATE TABLE shard_partitions (
    partition     smallint PRIMARY KEY,
    state         smallint NOT NULL,  -- 0 live, 1 frozen (moving out), 2 incoming, 3 gone
    since_version bigint   NOT NULL,  -- the map version from which this shard holds it
    move_id       text,               -- the move that last changed it
    move_token    bigint,             -- that mover's etcd token (a stale mover is refused)
    CHECK (state BETWEEN 0 AND 3)
);

-- Every write of a partition calls one of these functions once (an InitPlan) before it
-- writes a row. Each takes a shared transaction-level advisory lock (class 0x63687271,
-- "chrq"; one of 8 stripes, by backend) and then reads shard_partitions in a snapshot of its
-- own (a volatile PL/pgSQL function takes one per statement): the freeze of a move takes the
-- 8 stripes exclusively for its UPDATE, so it waits for every write in flight to commit, and a
-- write that starts after the freeze committed reads the frozen state. No row lock is taken
-- on shard_partitions: FOR SHARE by many concurrent writers would make MultiXacts and write
-- each lock into the table's rows.

-- The listed partitions must all be live here since a version <= map_version; otherwise the
-- statement fails with SQLSTATE CQ001 and the refused partitions in DETAIL (the store raises
-- PartitionMoved), and nothing of it is written.
CREATE FUNCTION chronoq_hold(parts smallint[], map_version bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
-- Its two statements have one good plan whatever the arguments (a set difference of the
-- partitions against at most P rows): planned once per session, not at every call.
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    refused smallint[];
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1667789425, pg_backend_pid() % 8);
    refused := ARRAY(
        SELECT u.p FROM unnest(parts) AS u(p) WHERE u.p IS NOT NULL
        EXCEPT
        SELECT h.partition FROM shard_partitions h
        WHERE h.state = 0 AND h.since_version <= map_version
    );
    IF cardinality(refused) > 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'CQ001',
            MESSAGE = 'partitions not held live by this store shard at map version '
                      || map_version,
            DETAIL = array_to_string(ARRAY(SELECT r FROM unnest(refused) r ORDER BY r), ',');
    END IF;
    RETURN true;
END
$$;

-- The same for the writes that name their tasks by id: a task's partition is read off a
-- version 8 id (bytes 9-10, chronoq.routing), else off the stored row (an id minted before
-- routing; such an id with no row here names no partition and writes nothing).
CREATE FUNCTION chronoq_hold_ids(ids uuid[], map_version bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    refused smallint[];
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1667789425, pg_backend_pid() % 8);
    refused := ARRAY(
        SELECT p FROM (
            SELECT CASE WHEN get_byte(uuid_send(i), 6) = 129
                        THEN (get_byte(uuid_send(i), 9) * 256
                              + get_byte(uuid_send(i), 10))::smallint
                        ELSE (SELECT t.partition FROM tasks t WHERE t.id = i) END AS p
            FROM unnest(ids) AS i
        ) u WHERE u.p IS NOT NULL
        EXCEPT
        SELECT h.partition FROM shard_partitions h
        WHERE h.state = 0 AND h.since_version <= map_version
    );
    IF cardinality(refused) > 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'CQ001',
            MESSAGE = 'partitions not held live by this store shard at map version '
                      || map_version,
            DETAIL = array_to_string(ARRAY(SELECT r FROM unnest(refused) r ORDER BY r), ',');
    END IF;
    RETURN true;
END
$$;

-- The partitions live here since a version <= map_version, for the writes that find their
-- rows by queue (claims): NULL when no row of the table is anything else (then every row of
-- this shard is of a live partition: the common case, and the caller's filter a constant).
-- An empty table (a shard added and not yet given partitions) has no rows to claim either.
CREATE FUNCTION chronoq_live(map_version bigint) RETURNS smallint[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1667789425, pg_backend_pid() % 8);
    IF NOT EXISTS (
        SELECT 1 FROM shard_partitions h WHERE h.state <> 0 OR h.since_version > map_version
    ) THEN
        RETURN NULL;
    END IF;
    RETURN ARRAY(
        SELECT h.partition FROM shard_partitions h
        WHERE h.state = 0 AND h.since_version <= map_version ORDER BY h.partition
    );
END
$$;
