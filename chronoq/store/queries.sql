-- Named queries of the store. Every state change is one conditional UPDATE whose rows
-- affected decide who won. `now` always comes in as a parameter from the node's Clock.
--
-- A statement that names its tasks by id tests their state as `t.state + 0` (and, in a
-- batch, their namespace as `t.namespace || ''`): its plan must follow the ids through the
-- primary key, whatever the statistics say. A queue's states change by the thousand a
-- second; an ANALYZE that caught few RUNNING rows, or none yet on a new table, made
-- complete a scan of the namespace's rows (tasks_listing) and the wheel's fire a rescan of
-- its id list once per owned partition: statements of 100-600 ms at 5,000 due/s. The
-- rewritten conditions keep the partial indexes (whose predicates are the states) and the
-- listing index out of such plans; the planner's remaining choice, the ids against a scan
-- of the whole table, follows the table's size, which it reads as it plans. Fenced by-id
-- statements check the partition against the fence rows' partitions as an array computed
-- once (an InitPlan), never as a join the planner may turn around. For the same reason a lane of the firing index (partition, bucket, namespace) is
-- read as a row-comparison range over (namespace, run_at): `namespace = x AND state = 0`
-- would let a plan walk every SCHEDULED row of the namespace (tasks_listing) when the
-- statistics say there are few.

-- fragment: owned_fences
-- The fencing clause of every owner statement: the caller's partitions ($1) whose stored
-- token is still the caller's ($2), share-locked for the statement, so a new owner's token
-- bump waits for it and a stale token matches nothing. Used as {{owned_fences}}. This store
-- shard must hold every one of them live at the caller's map version (chronoq_hold,
-- migration 0011), else the statement fails whole (PartitionMoved).
WITH fence AS (
    SELECT f.partition, f.watermark
    FROM partition_fences f
    JOIN unnest($1::smallint[], $2::bigint[]) AS o(partition, token)
      ON o.partition = f.partition AND o.token = f.token
    WHERE (SELECT chronoq_hold($1::smallint[], {{map_version}}))
    FOR SHARE OF f
)

-- fragment: task_row
-- A task's columns as the Task mapping reads them (from `tasks t`). Instants are clamped to
-- the years 1..9999 that a client can decode: one row written out of that range (by an older
-- version's overflowing lease arithmetic, or by hand) must not fail a claim or a whole page.
t.id, t.namespace, t.queue, t.partition, t.bucket,
CASE WHEN t.run_at > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00'
     WHEN t.run_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'
     ELSE t.run_at END AS run_at,
t.state, t.priority, t.payload, t.idempotency_key, t.attempt, t.max_attempts, t.retry_base,
t.backoff_initial_ms, t.backoff_max_ms, t.lease_timeout_ms, t.misfire_policy,
t.misfire_grace_ms,
CASE WHEN t.lease_until > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00'
     WHEN t.lease_until < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'
     ELSE t.lease_until END AS lease_until,
t.worker_id, t.last_error,
CASE WHEN t.created_at > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00'
     WHEN t.created_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'
     ELSE t.created_at END AS created_at,
CASE WHEN t.fired_at > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00'
     WHEN t.fired_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'
     ELSE t.fired_at END AS fired_at,
CASE WHEN t.finished_at > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00'
     WHEN t.finished_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'
     ELSE t.finished_at END AS finished_at,
t.fired_by, t.fire_token, t.content_type, t.trace_context, t.concurrency_key, t.unique_key,
CASE WHEN t.unique_until > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00'
     WHEN t.unique_until < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'
     ELSE t.unique_until END AS unique_until,
t.debounce_key,
CASE WHEN t.debounce_until > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00'
     WHEN t.debounce_until < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'
     ELSE t.debounce_until END AS debounce_until,
t.labels

-- fragment: task_bytes
-- What a task's variable-length columns (of `t`) cost in an answer, in bytes; the caller adds
-- the fixed part. octet_length and pg_column_size read a stored value's size without
-- fetching it, so a statement can stop at a byte budget before it reads a payload.
octet_length(t.payload) + octet_length(t.namespace) + octet_length(t.queue)
+ coalesce(octet_length(t.last_error), 0) + coalesce(octet_length(t.idempotency_key), 0)
+ coalesce(octet_length(t.worker_id), 0) + coalesce(octet_length(t.fired_by), 0)
+ coalesce(octet_length(t.content_type), 0) + coalesce(pg_column_size(t.trace_context), 0)
+ coalesce(octet_length(t.concurrency_key), 0) + coalesce(octet_length(t.unique_key), 0)
+ coalesce(octet_length(t.debounce_key), 0) + coalesce(pg_column_size(t.labels), 0)

-- fragment: fired_row
-- What firing answers: no instant, only the lateness in seconds, so that no stored value
-- can fail the answer of a statement that has already committed.
t.partition, t.namespace, t.queue, t.state,
extract(epoch FROM $4::timestamptz - t.run_at)::float8 AS lateness, t.trace_context

-- fragment: fire_set
-- What firing writes: READY, or SKIPPED when the misfire policy says skip and the task is
-- later than its grace. The grace is saturated at the horizon ($7 ms) before it becomes an
-- interval, so no stored value can overflow the statement ("interval out of range").
SET state = CASE WHEN t.misfire_policy = 1
                  AND t.run_at < $4::timestamptz
                      - least(greatest(t.misfire_grace_ms, 0), $7::bigint) * interval '1 ms'
                 THEN 6 ELSE 1 END,
    fired_at = $4,
    fired_by = $6,
    fire_token = (SELECT f.token FROM partition_fences f WHERE f.partition = t.partition),
    finished_at = CASE WHEN t.misfire_policy = 1
                        AND t.run_at < $4::timestamptz
                            - least(greatest(t.misfire_grace_ms, 0), $7::bigint) * interval '1 ms'
                       THEN $4 END,
    last_error = CASE WHEN t.misfire_policy = 1
                       AND t.run_at < $4::timestamptz
                           - least(greatest(t.misfire_grace_ms, 0), $7::bigint) * interval '1 ms'
                      THEN 'skipped by misfire policy: fired later than its grace period'
                      ELSE t.last_error END

-- fragment: insert_tasks
-- New tasks from column arrays ($1..$24, created at $25). A column other than the ids ($1)
-- may hold one value that stands for every row (an array of one, spread once per statement):
-- what a batch shares (namespace, queue, retry policy, ...) is sent once, which halves the
-- driver's encoding of a submit. A conflict on (namespace, idempotency_key) inserts nothing:
-- the statements answer with the rows they inserted only, and the caller looks the first
-- task of a repeated key up.
INSERT INTO tasks AS t (id, namespace, queue, partition, bucket, run_at, state, priority, payload,
                   idempotency_key, max_attempts, backoff_initial_ms, backoff_max_ms,
                   lease_timeout_ms, misfire_policy, misfire_grace_ms, created_at, fired_at,
                   fired_by, content_type, trace_context, concurrency_key, unique_key,
                   unique_until, debounce_key, debounce_until, labels)
SELECT u.id, u.namespace, u.queue, u.partition, u.bucket, u.run_at, u.state, u.priority,
       u.payload, u.idempotency_key, u.max_attempts, u.backoff_initial_ms, u.backoff_max_ms,
       u.lease_timeout_ms, u.misfire_policy, u.misfire_grace_ms, $25::timestamptz,
       CASE WHEN u.state = 1 THEN $25::timestamptz END,
       CASE WHEN u.state = 1 THEN 'submit' END,
       u.content_type, u.trace_context, u.concurrency_key, u.unique_key, u.unique_until,
       u.debounce_key, u.debounce_until, u.labels
FROM unnest($1::uuid[],
            CASE WHEN cardinality($2::text[]) = 1
                 THEN array_fill(($2::text[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $2::text[] END,
            CASE WHEN cardinality($3::text[]) = 1
                 THEN array_fill(($3::text[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $3::text[] END,
            CASE WHEN cardinality($4::smallint[]) = 1
                 THEN array_fill(($4::smallint[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $4::smallint[] END,
            CASE WHEN cardinality($5::bigint[]) = 1
                 THEN array_fill(($5::bigint[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $5::bigint[] END,
            CASE WHEN cardinality($6::timestamptz[]) = 1
                 THEN array_fill(($6::timestamptz[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $6::timestamptz[] END,
            CASE WHEN cardinality($7::smallint[]) = 1
                 THEN array_fill(($7::smallint[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $7::smallint[] END,
            CASE WHEN cardinality($8::integer[]) = 1
                 THEN array_fill(($8::integer[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $8::integer[] END,
            CASE WHEN cardinality($9::bytea[]) = 1
                 THEN array_fill(($9::bytea[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $9::bytea[] END,
            CASE WHEN cardinality($10::text[]) = 1
                 THEN array_fill(($10::text[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $10::text[] END,
            CASE WHEN cardinality($11::integer[]) = 1
                 THEN array_fill(($11::integer[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $11::integer[] END,
            CASE WHEN cardinality($12::bigint[]) = 1
                 THEN array_fill(($12::bigint[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $12::bigint[] END,
            CASE WHEN cardinality($13::bigint[]) = 1
                 THEN array_fill(($13::bigint[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $13::bigint[] END,
            CASE WHEN cardinality($14::bigint[]) = 1
                 THEN array_fill(($14::bigint[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $14::bigint[] END,
            CASE WHEN cardinality($15::smallint[]) = 1
                 THEN array_fill(($15::smallint[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $15::smallint[] END,
            CASE WHEN cardinality($16::bigint[]) = 1
                 THEN array_fill(($16::bigint[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $16::bigint[] END,
            CASE WHEN cardinality($17::text[]) = 1
                 THEN array_fill(($17::text[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $17::text[] END,
            CASE WHEN cardinality($18::jsonb[]) = 1
                 THEN array_fill(($18::jsonb[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $18::jsonb[] END,
            CASE WHEN cardinality($19::text[]) = 1
                 THEN array_fill(($19::text[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $19::text[] END,
            CASE WHEN cardinality($20::text[]) = 1
                 THEN array_fill(($20::text[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $20::text[] END,
            CASE WHEN cardinality($21::timestamptz[]) = 1
                 THEN array_fill(($21::timestamptz[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $21::timestamptz[] END,
            CASE WHEN cardinality($22::text[]) = 1
                 THEN array_fill(($22::text[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $22::text[] END,
            CASE WHEN cardinality($23::timestamptz[]) = 1
                 THEN array_fill(($23::timestamptz[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $23::timestamptz[] END,
            CASE WHEN cardinality($24::jsonb[]) = 1
                 THEN array_fill(($24::jsonb[])[1], ARRAY[cardinality($1::uuid[])])
                 ELSE $24::jsonb[] END)
     AS u(id, namespace, queue, partition, bucket, run_at, state, priority, payload,
          idempotency_key, max_attempts, backoff_initial_ms, backoff_max_ms, lease_timeout_ms,
          misfire_policy, misfire_grace_ms, content_type, trace_context, concurrency_key,
          unique_key, unique_until, debounce_key, debounce_until, labels)
-- every partition of the rows held live here at the caller's map version, else nothing
WHERE (SELECT chronoq_hold($4::smallint[], {{map_version}}))
ON CONFLICT (namespace, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING

-- name: insert_task_ids
{{insert_tasks}}
RETURNING t.id;

-- name: insert_tasks_counted
-- The rows inserted counted, not sent back: a batch all inserted needs nothing else, and
-- decoding an id per row cost the node more than a sixth of its driver's work on a submit.
{{insert_tasks}};

-- name: insert_tasks
{{insert_tasks}}
RETURNING {{task_row}};

-- name: insert_task_once
-- One task with an idempotency key, its columns as insert_tasks takes them for one row but
-- scalars ($1..$24: id .. labels), created at $25: a single submit, in no transaction of its
-- own. It goes in only when the insert's snapshot finds its key in neither tasks nor
-- task_history, and a concurrent insert of the key that takes it first (ON CONFLICT) leaves
-- nothing either; no row then, and the caller reads the key's first task. One snapshot sees a
-- task that the sweep moves meanwhile in exactly one of the two tables, so it needs no later
-- check of the history (the batch inserts' check_fresh). Its partition held live, as in
-- insert_tasks, whether or not its key is taken. The insert itself is
-- chronoq_insert_task_once (migration 0026): one generic plan per session, where insert_tasks
-- over one row's arrays plans at every call.
SELECT {{task_row}}
FROM chronoq_insert_task_once($1::uuid, $2::text, $3::text, $4::smallint, $5::bigint,
                              $6::timestamptz, $7::smallint, $8::integer, $9::bytea, $10::text,
                              $11::integer, $12::bigint, $13::bigint, $14::bigint,
                              $15::smallint, $16::bigint, $17::text, $18::jsonb, $19::text,
                              $20::text, $21::timestamptz, $22::text, $23::timestamptz,
                              $24::jsonb, $25::timestamptz, {{map_version}}) t;

-- name: insert_task_leased
-- One task due now, its columns as insert_tasks takes them for one row but scalars and without
-- the state ($1..$23: id .. labels), created at $24, leased in the same write to the worker
-- ($25) of a stream waiting on this node: the submit's hand-off. RUNNING at attempt 1, leased
-- as claim leases (its lease timeout saturated into [$26, $27] ms); no claim follows. Unless a
-- READY task of its queue would be claimed before it (a higher priority, or the same and not
-- later): then it goes READY, as insert_tasks makes it, and waits its turn. A repeated key
-- inserts nothing (its first task is not leased): one that the insert's snapshot finds in tasks
-- or in task_history, and one that a concurrent insert takes first (ON CONFLICT). One snapshot
-- sees a task that the sweep moves meanwhile in exactly one of the two tables, so this one
-- statement, in no transaction of its own, needs no later check of the history (the batch
-- inserts' check_fresh). Its partition held live, as in insert_tasks, whether or not its key
-- is taken. The insert itself is chronoq_insert_task_leased (migrations 0025, 0027): one
-- generic plan per session, where this statement as a whole plans at every call.
SELECT {{task_row}}
FROM chronoq_insert_task_leased($1::uuid, $2::text, $3::text, $4::smallint, $5::bigint,
                                $6::timestamptz, $7::integer, $8::bytea, $9::text,
                                $10::integer, $11::bigint, $12::bigint, $13::bigint,
                                $14::smallint, $15::bigint, $16::text, $17::jsonb, $18::text,
                                $19::text, $20::timestamptz, $21::text, $22::timestamptz,
                                $23::jsonb, $24::timestamptz, $25::text, $26::bigint,
                                $27::bigint, {{map_version}}) t;

-- name: task_ids_by_idempotency_key
-- The first task of each key, in tasks or, moved there by the sweep, in task_history: one
-- statement, so one snapshot sees a row that moves meanwhile in exactly one of the two.
-- (chronoq_history_keys: the history's read with its one generic plan, migration 0024)
SELECT idempotency_key, id FROM tasks WHERE namespace = $1 AND idempotency_key = ANY($2::text[])
UNION ALL
SELECT idempotency_key, id FROM chronoq_history_keys($1, $2::text[]);

-- name: tasks_by_idempotency_key
-- As task_ids_by_idempotency_key, the whole rows.
SELECT {{task_row}} FROM tasks t WHERE t.namespace = $1 AND t.idempotency_key = ANY($2::text[])
UNION ALL
SELECT {{task_row}} FROM chronoq_history_keys($1, $2::text[]) t;

-- name: retired_by_idempotency_key
-- The keys of $2 whose first task is in task_history: a keyed submit asks it after its insert,
-- in a later statement of the insert's transaction (a fresh snapshot), and a hit among the keys
-- it inserted means the sweep moved the key's first task meanwhile (task_inserts).
SELECT {{task_row}} FROM chronoq_history_keys($1, $2::text[]) t;

-- name: get_task
-- In tasks, else in task_history: one statement (one snapshot) finds a row the sweep moves
-- meanwhile in exactly one of the two; the history is read only when tasks has no row, by
-- chronoq_history_task (one generic plan, migration 0024: planning every slice each time
-- cost ten times the read).
(SELECT {{task_row}} FROM tasks t WHERE t.id = $1 AND t.namespace = $2)
UNION ALL
(SELECT {{task_row}} FROM chronoq_history_task($1, $2) t)
LIMIT 1;

-- name: take_fences_local
-- Single-node ownership: bump every partition's token by one, so any older holder is fenced.
INSERT INTO partition_fences AS f (partition, token, owner, cluster_id)
SELECT p, 1, $2, $3 FROM unnest($1::smallint[]) AS p
ON CONFLICT (partition) DO UPDATE
    SET token = f.token + 1, owner = EXCLUDED.owner, cluster_id = EXCLUDED.cluster_id,
        acquired_at = now()
RETURNING partition, token, watermark;

-- name: take_fence
-- Cluster ownership: record the etcd-issued token; refused unless newer than the stored one
-- (or the etcd cluster itself changed, whose revisions restart at 1).
INSERT INTO partition_fences AS f (partition, token, owner, cluster_id)
VALUES ($1, $2, $3, $4)
ON CONFLICT (partition) DO UPDATE
    SET token = EXCLUDED.token, owner = EXCLUDED.owner, cluster_id = EXCLUDED.cluster_id,
        acquired_at = now()
    WHERE f.token < EXCLUDED.token OR f.cluster_id <> EXCLUDED.cluster_id
       -- the same claim again (its first answer was lost): idempotent
       OR (f.token = EXCLUDED.token AND f.owner = EXCLUDED.owner)
RETURNING partition, token, watermark;

-- name: fences
SELECT partition, token, cluster_id, owner, watermark FROM partition_fences ORDER BY partition;

-- fragment: fair_due
-- The due rows an owner takes in one statement, shared fairly across namespaces; follows
-- {{owned_fences}} ($3 the current bucket, $4 now, $5 the batch of each partition). Per
-- partition, a loose index scan of tasks_due lists the (bucket, namespace) lanes with pending
-- rows in [watermark - 1, $3], one index probe per lane, never one per row, and stops after
-- $5 due lanes. Each due lane then takes an equal share of the batch, oldest first, through
-- its own index range: one namespace's flood gets its share of a statement, never all of it,
-- and rows examined = rows due (plus one probe per lane). `more`: the lane filled its share
-- or the list stopped early, so the partition may have more due rows.
lane AS (
    SELECT fence.partition, l.bucket, l.namespace, greatest(1, $5 / l.lanes) AS share,
           l.lanes >= $5 AS capped,
           CASE WHEN l.bucket < $3 THEN 'infinity'::timestamptz ELSE $4 END AS upto
    FROM fence CROSS JOIN LATERAL (
        WITH RECURSIVE walk (bucket, namespace, first_run_at, due_lanes) AS (
            (SELECT t.bucket, t.namespace, t.run_at,
                    ((t.bucket, t.run_at) <= ($3::bigint, $4::timestamptz))::integer
             FROM tasks t
             WHERE t.state = 0 AND t.partition = fence.partition
               AND t.bucket >= fence.watermark - 1 AND t.bucket <= $3
             ORDER BY t.bucket, t.namespace, t.run_at
             LIMIT 1)
            UNION ALL
            SELECT n.bucket, n.namespace, n.run_at,
                   w.due_lanes + ((n.bucket, n.run_at) <= ($3::bigint, $4::timestamptz))::integer
            FROM walk w CROSS JOIN LATERAL (
                SELECT t.bucket, t.namespace, t.run_at FROM tasks t
                WHERE t.state = 0 AND t.partition = fence.partition
                  AND (t.bucket, t.namespace) > (w.bucket, w.namespace) AND t.bucket <= $3
                ORDER BY t.bucket, t.namespace, t.run_at
                LIMIT 1
            ) n
            WHERE w.due_lanes < $5
        )
        SELECT bucket, namespace, count(*) OVER () AS lanes
        FROM walk
        WHERE (bucket, first_run_at) <= ($3::bigint, $4::timestamptz)
    ) l
), due AS (
    SELECT d.id, lane.partition,
           lane.capped OR count(*) OVER (PARTITION BY lane.partition, lane.bucket, lane.namespace)
                          >= lane.share AS more
    FROM lane CROSS JOIN LATERAL (
        SELECT t.id FROM tasks t
        WHERE t.state = 0 AND t.partition = lane.partition AND t.bucket = lane.bucket
          AND (t.namespace, t.run_at) >= (lane.namespace, '-infinity'::timestamptz)
          AND (t.namespace, t.run_at) <= (lane.namespace, lane.upto)
        ORDER BY t.namespace, t.run_at
        LIMIT lane.share
        FOR UPDATE SKIP LOCKED
    ) d
)

-- name: fire_due
-- Moves due SCHEDULED tasks of the caller's partitions to READY (or SKIPPED by misfire
-- policy), each namespace with due work taking its share (see fair_due). The fence rows are
-- share-locked, so a new owner's token bump waits for this statement and a stale token
-- matches no fence row: nothing fires. The ids are computed once (an InitPlan), so a
-- nested-loop rescan with SKIP LOCKED can never take more than the shares; so are the
-- partitions that may have more (a few hundred at most, against which each row is checked).
{{owned_fences}}, {{fair_due}}
UPDATE tasks t
{{fire_set}}
WHERE t.id = ANY(ARRAY(SELECT id FROM due)) AND t.state + 0 = 0
RETURNING {{fired_row}},
          t.partition = ANY(ARRAY(SELECT DISTINCT partition FROM due WHERE more)) AS more;

-- name: due_task_ids
-- The rows fire_due would take ($3..$5 as there, the same fair shares), changing none: when
-- that statement fails on a row's data, these are fired in smaller sets to find the row.
{{owned_fences}}, {{fair_due}}
SELECT id, partition, more FROM due;

-- name: fire_ids
-- fire_due for the listed due tasks only ($5), fenced the same way.
{{owned_fences}}
UPDATE tasks t
{{fire_set}}
WHERE t.id = ANY($5::uuid[]) AND t.partition = ANY(ARRAY(SELECT partition FROM fence))
  AND t.state + 0 = 0 AND (t.bucket, t.run_at) <= ($3::bigint, $4::timestamptz)
RETURNING {{fired_row}};

-- name: fire_ids_leasing
-- fire_ids, handing some of the listed tasks straight to workers: those in $8 (each with
-- its worker in $9, the same position) go SCHEDULED -> RUNNING, leased as by claim (lease
-- timeout saturated into [$10, $11] ms), in the same write that fires them: the hand-off to
-- a worker stream waiting on this node. A task its misfire policy skips is skipped, never
-- leased; the others fire READY as in fire_ids. Each lease names its stream ($12, same
-- position) and that stream's byte budget ($13): a stream's tasks are leased, in the order
-- listed, while their size (as claim counts it, $14 the fixed part) fits in its budget (the
-- first always); the rest fire READY. Fenced the same way.
{{owned_fences}},
target AS (
    SELECT t.id,
           (t.misfire_policy = 1
            AND t.run_at < $4::timestamptz
                - least(greatest(t.misfire_grace_ms, 0), $7::bigint) * interval '1 ms') AS skip,
           array_position($8::uuid[], t.id) AS slot,
           t.attempt,
           -- a gated queue (paused, or limited per key) is never handed off, whatever the
           -- node's gate said: its tasks fire READY for claims (one probe of the settings' key)
           EXISTS (SELECT 1 FROM queue_settings s
                   WHERE s.namespace = t.namespace AND s.queue = t.queue
                     AND (s.paused OR s.max_running_per_key > 0 OR s.max_starts_per_key > 0))
             AS gated,
           {{task_bytes}} + $14::integer AS bytes
    FROM tasks t
    WHERE t.id = ANY($5::uuid[]) AND t.partition = ANY(ARRAY(SELECT partition FROM fence))
      AND t.state + 0 = 0 AND (t.bucket, t.run_at) <= ($3::bigint, $4::timestamptz)
    FOR UPDATE OF t
),
offered AS (
    -- a task whose attempt counter is at its end is fired READY (claims set it aside)
    SELECT g.*, (g.slot IS NOT NULL AND NOT g.skip AND NOT g.gated AND g.attempt < 2147483647)
             AS offer
    FROM target g
),
plan AS (
    SELECT o.id, o.skip, o.slot,
           o.offer AND (sum(o.bytes) FILTER (WHERE o.offer) OVER w <= ($13::bigint[])[o.slot]
                        OR count(*) FILTER (WHERE o.offer) OVER w = 1) AS leased
    FROM offered o
    WINDOW w AS (PARTITION BY ($12::integer[])[o.slot] ORDER BY o.slot)
)
UPDATE tasks t
SET state = CASE WHEN p.skip THEN 6 WHEN p.leased THEN 2 ELSE 1 END,
    attempt = CASE WHEN p.leased THEN t.attempt + 1 ELSE t.attempt END,
    worker_id = CASE WHEN p.leased THEN ($9::text[])[p.slot] ELSE t.worker_id END,
    lease_until = CASE WHEN p.leased
                       THEN $4::timestamptz + least(greatest(t.lease_timeout_ms, $10::bigint),
                                                    $11::bigint) * interval '1 ms'
                       ELSE t.lease_until END,
    fired_at = $4,
    fired_by = $6,
    fire_token = (SELECT f.token FROM partition_fences f WHERE f.partition = t.partition),
    finished_at = CASE WHEN p.skip THEN $4 END,
    last_error = CASE WHEN p.skip
                      THEN 'skipped by misfire policy: fired later than its grace period'
                      ELSE t.last_error END
FROM plan p
WHERE t.id = p.id
RETURNING {{fired_row}}, p.leased, {{task_row}};

-- name: release_handed
-- Gives back what a hand-off may have leased when its statement's outcome is unknown: the
-- listed tasks ($1) still RUNNING under the worker each was offered to ($2), fired at that
-- statement's instant ($3) and leased past now ($4), go READY without using an attempt (as
-- release does). A task whose lease ran out is the reaper's.
UPDATE tasks t
SET state = 1, lease_until = NULL, worker_id = NULL,
    retry_base = least(t.retry_base, 2147483646) + 1
FROM unnest($1::uuid[], $2::text[]) AS h(id, worker_id)
WHERE t.id = h.id AND t.state + 0 = 2 AND t.worker_id = h.worker_id AND t.fired_at = $3
  AND t.lease_until > $4 AND (SELECT chronoq_hold_ids($1::uuid[], {{map_version}}))
RETURNING t.namespace, t.queue;

-- name: due_soon
-- The SCHEDULED tasks of the listed partitions ($1) due in ($4, $5], from buckets $2..$3 (the
-- current and the next): the owner's timing wheel. Per partition a loose index scan of
-- tasks_due lists its (bucket, namespace) lanes, at most $7, one probe each, and each lane
-- reads its run_at range only: rows examined = the due-soon rows, whatever is pending later.
-- At most $6 rows, earliest first. Read only: firing them is fenced (fire_ids).
SELECT d.id, l.partition, d.run_at, l.namespace, d.queue
FROM unnest($1::smallint[]) AS p(partition) CROSS JOIN LATERAL (
    WITH RECURSIVE walk (bucket, namespace, lanes) AS (
        (SELECT t.bucket, t.namespace, 1
         FROM tasks t
         WHERE t.state = 0 AND t.partition = p.partition AND t.bucket >= $2 AND t.bucket <= $3
         ORDER BY t.bucket, t.namespace
         LIMIT 1)
        UNION ALL
        SELECT n.bucket, n.namespace, w.lanes + 1
        FROM walk w CROSS JOIN LATERAL (
            SELECT t.bucket, t.namespace FROM tasks t
            WHERE t.state = 0 AND t.partition = p.partition
              AND (t.bucket, t.namespace) > (w.bucket, w.namespace) AND t.bucket <= $3
            ORDER BY t.bucket, t.namespace
            LIMIT 1
        ) n
        WHERE w.lanes < $7
    )
    SELECT p.partition, walk.bucket, walk.namespace FROM walk
) l CROSS JOIN LATERAL (
    SELECT t.id, t.run_at, t.queue FROM tasks t
    WHERE t.state = 0 AND t.partition = l.partition AND t.bucket = l.bucket
      AND (t.namespace, t.run_at) > (l.namespace, $4::timestamptz)
      AND (t.namespace, t.run_at) <= (l.namespace, $5::timestamptz)
    ORDER BY t.namespace, t.run_at
    LIMIT $6
) d
ORDER BY d.run_at
LIMIT $6;

-- name: quarantine_tasks
-- Sets aside tasks of the caller's partitions that an owner statement cannot process: DEAD,
-- with the reason ($6), from the state the statement expected ($5) only. Fenced like the
-- statement that failed.
{{owned_fences}}
UPDATE tasks t
SET state = 4, last_error = $6, finished_at = $4, lease_until = NULL
WHERE t.id = ANY($3::uuid[]) AND t.partition = ANY(ARRAY(SELECT partition FROM fence))
  AND t.state + 0 = $5
RETURNING {{task_row}};

-- name: advance_watermarks
UPDATE partition_fences f SET watermark = $3
FROM unnest($1::smallint[], $2::bigint[]) AS o(partition, token)
WHERE f.partition = o.partition AND f.token = o.token AND f.watermark < $3
RETURNING f.partition;

-- name: expired_leases
-- Running tasks of the caller's partitions whose lease ran out; fenced like fire_due. A lease
-- no claim can grant (none, or ending beyond the horizon, $5 ms, as an older version's
-- overflowing arithmetic left some) would never run out: it counts as expired.
{{owned_fences}}
SELECT d.* FROM fence CROSS JOIN LATERAL (
    SELECT t.id, t.attempt, t.max_attempts, t.retry_base, t.backoff_initial_ms,
           t.backoff_max_ms, t.worker_id
    FROM tasks t
    WHERE t.state = 2 AND t.partition = fence.partition
      AND (t.lease_until < $3 OR t.lease_until IS NULL
           OR t.lease_until > $3::timestamptz + $5::bigint * interval '1 ms')
    ORDER BY t.lease_until
    LIMIT $4
    FOR UPDATE SKIP LOCKED
) d;

-- name: retry_running
-- Ends running attempts (failed, or lease expired): back to SCHEDULED at a backoff time,
-- READY when due already, or DEAD when out of attempts. Conditional on the attempt.
UPDATE tasks t
SET state = u.state, run_at = u.run_at, bucket = u.bucket, last_error = u.error,
    lease_until = NULL,
    fired_at = CASE WHEN u.state = 1 THEN $7::timestamptz ELSE NULL END,
    fired_by = CASE WHEN u.state = 1 THEN 'retry' ELSE NULL END, fire_token = NULL,
    finished_at = CASE WHEN u.state = 4 THEN $7::timestamptz END
FROM unnest($1::uuid[], $2::integer[], $3::smallint[], $4::timestamptz[], $5::bigint[],
            $6::text[]) AS u(id, attempt, state, run_at, bucket, error)
WHERE t.id = u.id AND t.state + 0 = 2 AND t.attempt = u.attempt
  AND (SELECT chronoq_hold_ids($1::uuid[], {{map_version}}))
RETURNING {{task_row}};

-- name: lock_running
-- Checks the partition's holding first (its shared lock before the row's: a freeze waiting
-- for this transaction never waits on a row lock of one queued behind it).
SELECT {{task_row}} FROM tasks t WHERE t.id = $1 AND t.namespace = $2
  AND (SELECT chronoq_hold_ids(ARRAY[$1::uuid], {{map_version}}))
FOR UPDATE;

-- name: claim
-- Per queue (with its own cap, from a dispatch limit), the ready index is walked in
-- (priority DESC, run_at) order and stops at the cap: cost follows the tasks claimed, not
-- the READY backlog. The candidate ids are computed once (an InitPlan), so a nested-loop
-- rescan with SKIP LOCKED can never hand out more than the limit. The lease timeout is
-- saturated into the limits' [$7, $8] ms before it becomes an interval: no stored value can
-- overflow the lease, or fail the claim of everyone on the queue. The claim stops before its
-- tasks' size passes $9 bytes (each task its variable-length columns, its worker id and $10
-- for the rest; the first always comes), so no task is leased that its answer cannot carry.
-- A negative $9 is a strict budget of -$9 bytes that not even the first task may pass: a
-- store of shards splits one answer's budget among the shards' claims that way. Only rows of
-- partitions this shard holds live at the caller's map version are claimed (chronoq_live).
WITH live AS MATERIALIZED (SELECT chronoq_live({{map_version}}) AS parts)
UPDATE tasks t
SET state = 2, attempt = t.attempt + 1, worker_id = $4,
    lease_until = $5::timestamptz
        + least(greatest(t.lease_timeout_ms, $7::bigint), $8::bigint) * interval '1 ms'
WHERE t.id = ANY(ARRAY(
    SELECT b.id FROM (
        SELECT c.id, sum(c.bytes) OVER w AS upto, row_number() OVER w AS n
        FROM (
            SELECT c.id, c.priority, c.run_at, c.bytes
            FROM unnest($2::text[], $6::integer[]) AS q(queue, cap) CROSS JOIN LATERAL (
                SELECT t.id, t.priority, t.run_at,
                       {{task_bytes}} + octet_length($4::text) + $10::integer AS bytes
                FROM tasks t
                WHERE t.namespace = $1 AND t.queue = q.queue AND t.state = 1
                  -- a paused queue is skipped whole (one probe of its settings' key), and
                  -- so is a queue limited per concurrency key: claim_keyed claims those
                  AND NOT EXISTS (SELECT 1 FROM queue_settings s
                                  WHERE s.namespace = $1 AND s.queue = q.queue
                                    AND (s.paused OR s.max_running_per_key > 0
                                         OR s.max_starts_per_key > 0))
                  AND ((SELECT parts FROM live) IS NULL
                       OR t.partition = ANY((SELECT parts FROM live)::smallint[]))
                ORDER BY t.priority DESC, t.run_at
                LIMIT q.cap
                FOR UPDATE SKIP LOCKED
            ) c
            ORDER BY c.priority DESC, c.run_at
            LIMIT $3
        ) c
        -- in the order the candidates came (no second sort); rows, not peers, so ties of
        -- (priority, run_at) are counted one by one
        WINDOW w AS (ORDER BY c.priority DESC, c.run_at ROWS UNBOUNDED PRECEDING)
    ) b
    WHERE b.upto <= abs($9::bigint) OR (b.n = 1 AND $9::bigint >= 0)
)) AND t.state + 0 = 1
RETURNING {{task_row}};

-- name: quarantine_unclaimable
-- READY tasks of the named queues that no claim can take because their attempt counter is
-- at its end (the next lease token does not fit in an integer): DEAD, with the reason ($4).
WITH live AS MATERIALIZED (SELECT chronoq_live({{map_version}}) AS parts)
UPDATE tasks t
SET state = 4, finished_at = $3, last_error = $4
WHERE t.namespace = $1 AND t.queue = ANY($2::text[]) AND t.state = 1
  AND t.attempt >= 2147483647
  AND ((SELECT parts FROM live) IS NULL OR t.partition = ANY((SELECT parts FROM live)::smallint[]))
RETURNING t.id;

-- Claims of queues limited per concurrency key (chronoq.store.key_claims). A claim of keyed
-- queues is one transaction of two statements: key_candidates picks the keys that may start
-- a task and takes each one's transaction-level advisory lock (try-locks: a key another claim
-- holds is passed over, never waited for), then claim_keyed, a fresh statement whose snapshot
-- sees every claim that held those locks before (they committed before releasing them),
-- counts each key's RUNNING tasks again and claims. $1 is the namespace and $2 now in both.

-- fragment: key_free
-- Whether key h.key of queue s.queue (limits s.lim RUNNING, s.rate starts a second) may start
-- a task now: fewer than s.lim RUNNING (at most s.lim entries of tasks_running_keys read) and
-- a whole token in its bucket of burst 1 (a key without a key_tokens row has a full one). A
-- key is compared as a range (>= and <=) wherever another index could serve an equality:
-- tasks_ready_keys and tasks_running_keys are then the only ones whose ranges it narrows, so
-- no plan made on statistics of a moment with few READY or RUNNING tasks scans a queue's
-- tasks to find one key's.
((s.lim <= 0 OR (SELECT count(*) FROM (
      SELECT 1 FROM tasks r
      WHERE r.namespace = $1 AND r.queue = s.queue
        AND r.concurrency_key >= h.key AND r.concurrency_key <= h.key AND r.state = 2
      LIMIT greatest(s.lim, 0)) x) < s.lim)
 AND (s.rate <= 0 OR coalesce((
      SELECT k.tokens + s.rate * greatest(0, extract(epoch FROM $2::timestamptz - k.refilled_at))
      FROM key_tokens k
      WHERE k.namespace = $1 AND k.queue = s.queue AND k.concurrency_key = h.key), 1)
      >= 1 - 1e-9))

-- fragment: key_settings
-- The keyed queues of a claim ($3) with their limits, paused ones left out; `cursor` ($4):
-- where each queue's walk over its keys starts (after it, wrapping round to the first key).
s AS MATERIALIZED (
    SELECT q.queue, q.cursor, coalesce(c.max_running_per_key, 0) AS lim,
           coalesce(c.max_starts_per_key, 0)::float8 AS rate
    FROM unnest($3::text[], $4::text[]) AS q(queue, cursor)
    LEFT JOIN queue_settings c ON c.namespace = $1 AND c.queue = q.queue
    WHERE NOT coalesce(c.paused, false)
)

-- fragment: key_walk
-- The keys that may start a task, from two bounded reads per queue (follows {{key_settings}}):
-- `front`, the keys among the first $5 READY tasks in claim order (priority DESC, run_at), so
-- the best tasks of free keys come first; and `walk`, a loose index scan of tasks_ready_keys
-- from the queue's cursor, one probe per key (its head) plus its check ({{key_free}}: at most
-- its limit of RUNNING entries and one token row), which stops after $6 keys or once $7 free
-- keys are found. Full keys are at most the queue's RUNNING tasks / limit, so a walk longer
-- than that finds every free key it needs; a shorter one goes on from its cursor next time
-- (every key is reached within keys / $6 claims). Cost: $5 + $6 x (limit + 2) index
-- entries at most, whatever the backlog of full keys. The front's keys are checked best head
-- first and only until 2 x $7 are free (a claim wants $7; the rest is slack for keys other
-- claims hold), and a queue whose front has $7 free keys is not walked: its best tasks are
-- there, and a walk would only find worse ones (measured in chronoq.store.key_claims).
head AS MATERIALIZED (
    SELECT s.queue, f.key, f.id, f.priority, f.run_at
    FROM s CROSS JOIN LATERAL (
        SELECT t.concurrency_key AS key, t.id, t.priority, t.run_at FROM tasks t
        WHERE t.namespace = $1 AND t.queue = s.queue AND t.state = 1
        ORDER BY t.priority DESC, t.run_at
        LIMIT $5
    ) f
), front AS (
    SELECT s.queue, h.key, h.id, h.priority, h.run_at
    FROM s CROSS JOIN LATERAL (
        SELECT h.key, h.id, h.priority, h.run_at FROM (
            -- OFFSET 0: sorted before the check, so the LIMIT stops the checks
            SELECT d.* FROM (
                SELECT DISTINCT ON (f.key) f.key, f.id, f.priority, f.run_at FROM head f
                WHERE f.queue = s.queue AND f.key IS NOT NULL
                ORDER BY f.key, f.priority DESC, f.run_at
            ) d
            ORDER BY d.priority DESC, d.run_at
            OFFSET 0
        ) h
        WHERE {{key_free}}
        LIMIT 2 * $7
    ) h
), walk AS (
    SELECT s.queue, w.key, w.id, w.priority, w.run_at, w.n, w.ok
    FROM (SELECT * FROM s
          WHERE (SELECT count(*) FROM front f WHERE f.queue = s.queue) < $7) s
    CROSS JOIN LATERAL (
        WITH RECURSIVE w (key, id, priority, run_at, wrapped, n, frees, ok) AS (
            (SELECT h.key, h.id, h.priority, h.run_at, h.wrapped, 1, 0, {{key_free}}
             FROM ((SELECT t.concurrency_key AS key, t.id, t.priority, t.run_at, false AS wrapped
                    FROM tasks t
                    WHERE t.namespace = $1 AND t.queue = s.queue AND t.state = 1
                      AND t.concurrency_key > s.cursor
                    ORDER BY t.concurrency_key, t.priority DESC, t.run_at
                    LIMIT 1)
                   UNION ALL
                   (SELECT t.concurrency_key, t.id, t.priority, t.run_at, true
                    FROM tasks t
                    WHERE t.namespace = $1 AND t.queue = s.queue AND t.state = 1
                      AND t.concurrency_key <= s.cursor
                    ORDER BY t.concurrency_key, t.priority DESC, t.run_at
                    LIMIT 1)
                   LIMIT 1) h)
            UNION ALL
            (SELECT h.key, h.id, h.priority, h.run_at, h.wrapped, w.n + 1,
                    w.frees + w.ok::integer, {{key_free}}
             FROM w CROSS JOIN LATERAL (
                 (SELECT t.concurrency_key AS key, t.id, t.priority, t.run_at, w.wrapped
                  FROM tasks t
                  WHERE t.namespace = $1 AND t.queue = s.queue AND t.state = 1
                    AND t.concurrency_key > w.key
                    AND (NOT w.wrapped OR t.concurrency_key <= s.cursor)
                  ORDER BY t.concurrency_key, t.priority DESC, t.run_at
                  LIMIT 1)
                 UNION ALL
                 (SELECT t.concurrency_key, t.id, t.priority, t.run_at, true
                  FROM tasks t
                  WHERE NOT w.wrapped AND t.namespace = $1 AND t.queue = s.queue
                    AND t.state = 1 AND t.concurrency_key <= s.cursor
                  ORDER BY t.concurrency_key, t.priority DESC, t.run_at
                  LIMIT 1)
                 LIMIT 1
             ) h
             WHERE w.n < $6 AND w.frees + w.ok::integer < $7)
        )
        SELECT * FROM w
    ) w
), cand AS MATERIALIZED (
    -- each free key once, at its head, best first
    SELECT c.queue, c.key, c.id, c.priority, c.run_at FROM (
        SELECT DISTINCT ON (u.queue, u.key) u.queue, u.key, u.id, u.priority, u.run_at
        FROM (SELECT queue, key, id, priority, run_at FROM front
              UNION ALL
              SELECT queue, key, id, priority, run_at FROM walk WHERE ok) u
        ORDER BY u.queue, u.key, u.priority DESC, u.run_at
    ) c
    ORDER BY c.priority DESC, c.run_at
)

-- name: key_candidates
-- Up to $7 keys of the keyed queues $3 that may start a task now ({{key_walk}}), best head
-- first, each locked for this transaction (a key another claim holds is passed over); and per
-- queue one row with no key and the cursor its next walk starts from (the last key walked),
-- and one with `keyless` true if a task without a key is among its first $5 READY ones (only
-- those queues' keyless tasks are looked for by claim_keyed).
-- Read only: claim_keyed, the next statement of the transaction, decides.
WITH {{key_settings}}, {{key_walk}}
(SELECT c.queue, c.key, NULL::text AS cursor, false AS keyless FROM cand c
 WHERE pg_try_advisory_xact_lock(1667789163, hashtext($1 || chr(31) || c.queue || chr(31) || c.key))
 LIMIT $7)
UNION ALL
(SELECT DISTINCT ON (w.queue) w.queue, NULL, w.key, false FROM walk w ORDER BY w.queue, w.n DESC)
UNION ALL
(SELECT DISTINCT h.queue, NULL, NULL, true FROM head h WHERE h.key IS NULL);

-- name: key_heads
-- The first $7 tasks a claim of the keyed queues $3 could take, unlocked (as ready_heads:
-- (priority, run_at, bytes) for worker $8 plus $9): each free key's head ({{key_walk}}, from
-- the cursors $4) and the keyless tasks among the first $5 READY ones. A store of shards
-- reads these to share a claim among the shards holding claimable work.
WITH {{key_settings}}, {{key_walk}}
SELECT h.priority, h.run_at, h.bytes FROM (
    SELECT t.priority, t.run_at, {{task_bytes}} + octet_length($8::text) + $9::integer AS bytes
    FROM cand c JOIN tasks t ON t.id = c.id
    UNION ALL
    SELECT f.priority, f.run_at, f.bytes FROM s CROSS JOIN LATERAL (
        SELECT t.priority, t.run_at, t.concurrency_key,
               {{task_bytes}} + octet_length($8::text) + $9::integer AS bytes
        FROM tasks t
        WHERE t.namespace = $1 AND t.queue = s.queue AND t.state = 1
        ORDER BY t.priority DESC, t.run_at
        LIMIT $5
    ) f
    WHERE f.concurrency_key IS NULL
) h
ORDER BY h.priority DESC, h.run_at
LIMIT $7;

-- name: claim_keyed
-- The claim of the keys key_candidates locked ($3 queues, $4 keys, the same positions) and of
-- the keyless tasks of the keyed queues $5 (each queue's cap in $6, from a dispatch limit):
-- READY -> RUNNING for up to $7 tasks for worker $8, leased as claim leases (lease timeout
-- saturated into [$9, $10] ms), within $11 bytes as claim counts them ($12 the fixed part;
-- negative: strict). A fresh statement: each locked key's RUNNING tasks are counted again
-- here, so a key starts at most its limit minus its running count, and no more than its whole
-- tokens; its tasks in (priority DESC, run_at) order. A keyless task is unlimited, found among
-- the first $13 READY tasks of its queue, of the queues $14 only (key_candidates saw one
-- there). The tokens of what started are spent in the same statement. Only rows of partitions
-- held live are claimed, as in claim.
WITH live AS MATERIALIZED (SELECT chronoq_live({{map_version}}) AS parts),
s AS MATERIALIZED (
    SELECT q.queue, q.cap, coalesce(c.max_running_per_key, 0) AS lim,
           coalesce(c.max_starts_per_key, 0)::float8 AS rate
    FROM unnest($5::text[], $6::integer[]) AS q(queue, cap)
    LEFT JOIN queue_settings c ON c.namespace = $1 AND c.queue = q.queue
    WHERE NOT coalesce(c.paused, false)
), k AS MATERIALIZED (
    SELECT s.queue, h.key, s.rate, tok.avail,
           greatest(0, least(CASE WHEN s.lim <= 0 THEN $7 ELSE s.lim - run.n END,
                             CASE WHEN s.rate <= 0 THEN $7
                                  ELSE floor(tok.avail + 1e-9)::integer END)) AS room
    FROM unnest($3::text[], $4::text[]) AS h(queue, key)
    JOIN s ON s.queue = h.queue
    CROSS JOIN LATERAL (
        SELECT count(*)::integer AS n FROM (
            SELECT 1 FROM tasks r
            WHERE r.namespace = $1 AND r.queue = h.queue
              AND r.concurrency_key >= h.key AND r.concurrency_key <= h.key AND r.state = 2
            LIMIT greatest(s.lim, 0)) x
    ) run
    CROSS JOIN LATERAL (
        -- a queue without a rate per key reads no token row
        SELECT CASE WHEN s.rate <= 0 THEN 1::float8 ELSE coalesce((
            SELECT least(1, kt.tokens
                            + s.rate * greatest(0, extract(epoch FROM $2::timestamptz
                                                                  - kt.refilled_at)))
            FROM key_tokens kt
            WHERE kt.namespace = $1 AND kt.queue = h.queue AND kt.concurrency_key = h.key
        ), 1)::float8 END AS avail
    ) tok
), cand AS (
    SELECT c.id, c.queue, c.priority, c.run_at, c.bytes FROM k CROSS JOIN LATERAL (
        SELECT t.id, t.queue, t.priority, t.run_at,
               {{task_bytes}} + octet_length($8::text) + $12::integer AS bytes
        FROM tasks t
        -- the key as a range and first in the order: only tasks_ready_keys reads it in that
        -- order, so no plan walks the queue's whole tasks_ready range for one key's tasks (a
        -- plan made while few tasks were READY did, 440 rows a key)
        WHERE t.namespace = $1 AND t.queue = k.queue
          AND t.concurrency_key >= k.key AND t.concurrency_key <= k.key
          AND t.state = 1
          AND ((SELECT parts FROM live) IS NULL
               OR t.partition = ANY((SELECT parts FROM live)::smallint[]))
        ORDER BY t.concurrency_key, t.priority DESC, t.run_at
        LIMIT k.room
        FOR UPDATE SKIP LOCKED
    ) c
    UNION ALL
    SELECT c.id, c.queue, c.priority, c.run_at, c.bytes
    FROM (SELECT * FROM s WHERE s.queue = ANY($14::text[])) s
    CROSS JOIN LATERAL (
        SELECT t.id, t.queue, t.priority, t.run_at,
               {{task_bytes}} + octet_length($8::text) + $12::integer AS bytes
        FROM tasks t
        -- the keyless ones among the first $13 READY tasks (only those are looked up again)
        WHERE t.id = ANY(ARRAY(
                  SELECT w.id FROM (
                      SELECT f.id, f.concurrency_key FROM tasks f
                      WHERE f.namespace = $1 AND f.queue = s.queue AND f.state = 1
                      ORDER BY f.priority DESC, f.run_at
                      LIMIT $13) w
                  WHERE w.concurrency_key IS NULL))
          AND t.concurrency_key IS NULL AND t.state + 0 = 1
          AND ((SELECT parts FROM live) IS NULL
               OR t.partition = ANY((SELECT parts FROM live)::smallint[]))
        ORDER BY t.priority DESC, t.run_at
        LIMIT s.cap
        FOR UPDATE SKIP LOCKED
    ) c
), pick AS (
    SELECT b.id FROM (
        SELECT c.id, sum(c.bytes) OVER w AS upto, row_number() OVER w AS n
        FROM (
            SELECT c.id, c.priority, c.run_at, c.bytes FROM (
                SELECT c.*, row_number() OVER (PARTITION BY c.queue
                                               ORDER BY c.priority DESC, c.run_at) AS qn
                FROM cand c
            ) c JOIN s ON s.queue = c.queue
            WHERE c.qn <= s.cap
            ORDER BY c.priority DESC, c.run_at
            LIMIT $7
        ) c
        WINDOW w AS (ORDER BY c.priority DESC, c.run_at ROWS UNBOUNDED PRECEDING)
    ) b
    WHERE b.upto <= abs($11::bigint) OR (b.n = 1 AND $11::bigint >= 0)
), claimed AS (
    UPDATE tasks t
    SET state = 2, attempt = t.attempt + 1, worker_id = $8,
        lease_until = $2::timestamptz
            + least(greatest(t.lease_timeout_ms, $9::bigint), $10::bigint) * interval '1 ms'
    WHERE t.id = ANY(ARRAY(SELECT id FROM pick)) AND t.state + 0 = 1
    RETURNING {{task_row}}
), spent AS (
    INSERT INTO key_tokens AS kt (namespace, queue, concurrency_key, tokens, refilled_at)
    SELECT $1, k.queue, k.key, greatest(0, k.avail - u.n), $2
    FROM (SELECT c.queue, c.concurrency_key, count(*) AS n FROM claimed c
          WHERE c.concurrency_key IS NOT NULL GROUP BY c.queue, c.concurrency_key) u
    JOIN k ON k.queue = u.queue AND k.key = u.concurrency_key
    WHERE k.rate > 0
    ON CONFLICT (namespace, queue, concurrency_key) DO UPDATE
        SET tokens = EXCLUDED.tokens, refilled_at = greatest(kt.refilled_at, EXCLUDED.refilled_at)
)
SELECT * FROM claimed;

-- name: purge_key_tokens
-- Up to $2 key_tokens rows whose bucket has refilled by $1 (or whose queue no longer limits
-- starts): such a key has a full bucket without its row. A row whose key a claim holds
-- (its advisory lock) stays.
DELETE FROM key_tokens k
WHERE (k.namespace, k.queue, k.concurrency_key) IN (
    SELECT o.namespace, o.queue, o.concurrency_key
    FROM key_tokens o
    LEFT JOIN queue_settings s ON s.namespace = o.namespace AND s.queue = o.queue
    WHERE o.refilled_at < $1
      AND (coalesce(s.max_starts_per_key, 0) <= 0
           OR o.tokens + s.max_starts_per_key * extract(epoch FROM $1::timestamptz - o.refilled_at)
              >= 1)
    ORDER BY o.refilled_at
    LIMIT $2
)
AND pg_try_advisory_xact_lock(1667789163,
                              hashtext(k.namespace || chr(31) || k.queue || chr(31) || k.concurrency_key));

-- name: heartbeat
-- The lease timeout saturated into [$5, $6] ms, as in claim.
UPDATE tasks t
SET lease_until = $4::timestamptz
    + least(greatest(t.lease_timeout_ms, $5::bigint), $6::bigint) * interval '1 ms'
FROM unnest($2::uuid[], $3::integer[]) AS l(id, token)
WHERE t.id = l.id AND t.namespace || '' = $1 AND t.state + 0 = 2 AND t.attempt = l.token
  AND (SELECT chronoq_hold_ids($2::uuid[], {{map_version}}))
RETURNING t.id;

-- name: complete
-- `keyed`: the task had a concurrency key, so its slot is free (claims waiting on its queue
-- are woken).
UPDATE tasks t
SET state = 3, finished_at = $4, lease_until = NULL
FROM unnest($2::uuid[], $3::integer[]) AS l(id, token)
WHERE t.id = l.id AND t.namespace || '' = $1 AND t.state + 0 = 2 AND t.attempt = l.token
  AND (SELECT chronoq_hold_ids($2::uuid[], {{map_version}}))
RETURNING t.id, t.queue, t.concurrency_key IS NOT NULL AS keyed;

-- name: completed_by
-- Leases whose attempt already completed its task: a repeated ack gets the same answer.
SELECT t.id FROM tasks t
JOIN unnest($2::uuid[], $3::integer[]) AS l(id, token) ON t.id = l.id
WHERE t.namespace || '' = $1 AND t.state + 0 = 3 AND t.attempt = l.token;

-- name: lease_states
SELECT id, state, attempt FROM tasks WHERE namespace || '' = $1 AND id = ANY($2::uuid[]);

-- name: release
UPDATE tasks t
SET state = 1, lease_until = NULL, worker_id = NULL,
    retry_base = least(t.retry_base, 2147483646) + 1
WHERE t.id = $1 AND t.namespace = $2 AND t.state + 0 = 2 AND t.attempt = $3
  AND (SELECT chronoq_hold_ids(ARRAY[$1::uuid], {{map_version}}))
RETURNING {{task_row}};

-- name: cancel
-- A DEAD task may be cancelled too: an operator discards a dead letter that way.
UPDATE tasks t
SET state = 5, finished_at = $3, lease_until = NULL
WHERE t.id = $1 AND t.namespace = $2 AND t.state + 0 IN (0, 1, 2, 4)
  AND (SELECT chronoq_hold_ids(ARRAY[$1::uuid], {{map_version}}))
RETURNING {{task_row}};

-- name: requeue_dead
-- A state no version knows reads as DEAD (see the Task mapping), so it is requeued as one.
UPDATE tasks t
SET state = 1, run_at = $3, bucket = $4, fired_at = $3, finished_at = NULL,
    fired_by = 'requeue', fire_token = NULL,
    retry_base = t.attempt, lease_until = NULL, worker_id = NULL
WHERE t.id = ANY($1::uuid[]) AND t.namespace || '' = $2
  AND (t.state = 4 OR t.state NOT BETWEEN 0 AND 6)
  AND (SELECT chronoq_hold_ids($1::uuid[], {{map_version}}))
RETURNING {{task_row}};

-- fragment: bytes_bounded_page
-- A page of the candidate rows that ends before the rows' size passes $6 bytes (the first row
-- always comes): the variable-length columns plus $7 for the fixed ones, so a page of large
-- payloads stays small. page_rows tells the caller whether the page was cut short.
SELECT * FROM (
    SELECT p.*, sum(p.row_bytes) OVER (ORDER BY p.id) AS page_bytes,
           row_number() OVER (ORDER BY p.id) AS page_row,
           count(*) OVER () AS page_rows
    FROM (
        SELECT t.*, {{task_bytes}} + $7::integer AS row_bytes
        FROM candidates t
    ) p
) b
WHERE b.page_bytes <= $6 OR b.page_row = 1
ORDER BY b.id

-- name: list_tasks_in_state
-- Finished states are read from tasks and task_history, merged by id (one snapshot: a row
-- the sweep moves meanwhile is listed once); the history of a live state is an empty probe.
WITH candidates AS (
    (SELECT {{task_row}} FROM tasks t
     WHERE namespace = $1 AND state = $2 AND ($3::text IS NULL OR queue = $3) AND id > $4::uuid
     ORDER BY id
     LIMIT $5)
    UNION ALL
    (SELECT {{task_row}} FROM task_history t
     WHERE namespace = $1 AND state = $2 AND ($3::text IS NULL OR queue = $3) AND id > $4::uuid
     ORDER BY id
     LIMIT $5)
    ORDER BY id
    LIMIT $5
)
{{bytes_bounded_page}};

-- name: list_tasks
-- Every state: tasks and task_history merged by id, as list_tasks_in_state.
WITH candidates AS (
    (SELECT {{task_row}} FROM tasks t
     WHERE namespace = $1 AND ($3::text IS NULL OR queue = $3) AND id > $4::uuid
       AND $2::smallint IS NULL
     ORDER BY id
     LIMIT $5)
    UNION ALL
    (SELECT {{task_row}} FROM task_history t
     WHERE namespace = $1 AND ($3::text IS NULL OR queue = $3) AND id > $4::uuid
       AND $2::smallint IS NULL
     ORDER BY id
     LIMIT $5)
    ORDER BY id
    LIMIT $5
)
{{bytes_bounded_page}};

-- name: pending_by_bucket
-- Due work per upcoming bucket, for status and load-aware assignment; reads only the
-- pending rows of those buckets through the firing index. $4 (NULL: none) leaves out the
-- tasks due by then: the loads weigh no overdue backlog.
SELECT partition, bucket, count(*) AS pending
FROM tasks
WHERE state = 0 AND partition = ANY($1::smallint[]) AND bucket BETWEEN $2 AND $3
  AND ($4::timestamptz IS NULL OR run_at > $4::timestamptz)
GROUP BY partition, bucket;

-- name: count_by_state
SELECT state, count(*) AS n FROM tasks GROUP BY state;

-- name: insert_schedule
-- Inserts unless the namespace holds its cap of schedules already ($19; NULL: none), or its
-- active schedules' rates (max_rate, tasks/s) plus this one's ($20) would pass the submit
-- quota ($21; NULL: none). Counted by the inserting statement itself, so only creates racing
-- each other can pass a cap, by at most their number. Always one row: the namespace's
-- schedules and reserved rate before the insert, then the new schedule (NULLs: not inserted).
WITH usage AS (
    SELECT count(*) AS schedules,
           coalesce(sum(max_rate) FILTER (WHERE NOT paused), 0)::float8 AS reserved
    FROM schedules WHERE namespace = $2
), inserted AS (
    INSERT INTO schedules (id, namespace, name, partition, queue, cron, interval_ms, timezone,
                           anchor, catchup, payload, priority, max_attempts,
                           backoff_initial_ms, backoff_max_ms, lease_timeout_ms, next_fire_at,
                           created_at, max_rate)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
           $20::float8
    FROM usage
    WHERE (SELECT chronoq_hold(ARRAY[$4::smallint], {{map_version}}))
      AND ($19::bigint IS NULL OR usage.schedules < $19::bigint)
      AND ($21::float8 IS NULL OR usage.reserved + $20::float8 <= $21::float8 * (1 + 1e-9))
    ON CONFLICT (namespace, name) DO NOTHING
    RETURNING *
)
SELECT usage.schedules AS namespace_schedules, usage.reserved AS namespace_reserved, i.*
FROM usage LEFT JOIN inserted i ON true;

-- fragment: schedule_row
-- A schedule's columns for showing it (from `schedules s`), instants clamped to the years
-- 1..9999 a client can decode, so one row written out of range cannot fail a listing. The
-- owner reads rows unclamped (due_schedules): a rule is never evaluated from a moved anchor.
s.id, s.namespace, s.name, s.partition, s.queue, s.cron, s.interval_ms, s.timezone,
CASE WHEN s.anchor > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00'
     WHEN s.anchor < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'
     ELSE s.anchor END AS anchor,
s.catchup, s.payload, s.priority, s.max_attempts, s.backoff_initial_ms, s.backoff_max_ms,
s.lease_timeout_ms, s.paused, s.paused_reason,
CASE WHEN s.next_fire_at > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00'
     WHEN s.next_fire_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'
     ELSE s.next_fire_at END AS next_fire_at,
CASE WHEN s.last_fire_at > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00'
     WHEN s.last_fire_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'
     ELSE s.last_fire_at END AS last_fire_at,
s.created_total, s.skipped_total,
CASE WHEN s.created_at > '9999-12-31 23:59:59.999999+00' THEN '9999-12-31 23:59:59.999999+00'
     WHEN s.created_at < '0001-01-01 00:00:00+00' THEN '0001-01-01 00:00:00+00'
     ELSE s.created_at END AS created_at

-- name: get_schedule
SELECT {{schedule_row}} FROM schedules s WHERE s.namespace = $1 AND s.name = $2;

-- name: list_schedules
SELECT {{schedule_row}} FROM schedules s
WHERE s.namespace = $1 AND s.name > $2 ORDER BY s.name LIMIT $3;

-- name: pause_schedule
UPDATE schedules s SET paused = true WHERE s.namespace = $1 AND s.name = $2
  AND (SELECT chronoq_hold(ARRAY(SELECT o.partition FROM schedules o
                                 WHERE o.namespace = $1 AND o.name = $2), {{map_version}}))
RETURNING {{schedule_row}};

-- name: resume_schedule
-- Refused (no row) when the namespace's active schedules and this one would together pass the
-- submit quota ($4, tasks/s; NULL: none), as insert_schedule.
UPDATE schedules s SET paused = false, paused_reason = NULL, next_fire_at = $3
WHERE s.namespace = $1 AND s.name = $2 AND s.paused
  AND (SELECT chronoq_hold(ARRAY(SELECT o.partition FROM schedules o
                                 WHERE o.namespace = $1 AND o.name = $2), {{map_version}}))
  AND ($4::float8 IS NULL
       OR s.max_rate + (SELECT coalesce(sum(o.max_rate), 0) FROM schedules o
                        WHERE o.namespace = $1 AND NOT o.paused) <= $4::float8 * (1 + 1e-9))
RETURNING {{schedule_row}};

-- name: schedule_usage
-- A namespace's active schedules' reserved rate (tasks/s), for the message of a refusal.
SELECT coalesce(sum(max_rate), 0)::float8 FROM schedules WHERE namespace = $1 AND NOT paused;

-- name: delete_schedule
DELETE FROM schedules s WHERE s.namespace = $1 AND s.name = $2
  AND (SELECT chronoq_hold(ARRAY(SELECT o.partition FROM schedules o
                                 WHERE o.namespace = $1 AND o.name = $2), {{map_version}}))
RETURNING {{schedule_row}};

-- name: delete_unfired_occurrences
-- A paused or deleted schedule's occurrences ($2: their idempotency keys) that never fired:
-- SCHEDULED, never claimed (a retry waiting its backoff has fired and stays).
DELETE FROM tasks
WHERE namespace = $1 AND idempotency_key = ANY($2::text[])
  AND state = 0 AND attempt = 0 AND fired_at IS NULL
  AND (SELECT chronoq_hold(ARRAY(SELECT o.partition FROM tasks o
                                 WHERE o.namespace = $1 AND o.idempotency_key = ANY($2::text[])),
                           {{map_version}}));

-- name: due_schedules
-- Active schedules of the caller's partitions whose next occurrence is within the
-- lookahead, but for namespaces ($5) whose quota this pass has spent (their schedules must
-- not hold the others' places); fenced and share-locked like fire_due.
{{owned_fences}}
SELECT d.* FROM fence CROSS JOIN LATERAL (
    SELECT s.* FROM schedules s
    WHERE s.partition = fence.partition AND NOT s.paused AND s.next_fire_at <= $3
      AND s.namespace <> ALL($5::text[])
    ORDER BY s.next_fire_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED
) d;

-- name: due_schedule_ids
-- due_schedules answering ids only: when a row of that answer cannot even be read, the
-- schedules are read one by one (schedule_by_id) to find it.
{{owned_fences}}
SELECT d.id FROM fence CROSS JOIN LATERAL (
    SELECT s.id FROM schedules s
    WHERE s.partition = fence.partition AND NOT s.paused AND s.next_fire_at <= $3
      AND s.namespace <> ALL($5::text[])
    ORDER BY s.next_fire_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED
) d;

-- name: schedule_by_id
SELECT * FROM schedules WHERE id = $1;

-- name: quarantine_schedule
-- Pauses a schedule of the caller's partitions that the owner cannot materialise, with the
-- reason ($4); fenced like due_schedules. Resuming it clears the reason.
{{owned_fences}}
UPDATE schedules s SET paused = true, paused_reason = $4
FROM fence
WHERE s.id = $3 AND s.partition = fence.partition
RETURNING s.id;

-- name: drop_retired_occurrences
-- Of the occurrences a pass just inserted ($1: their ids), those whose key has its first task
-- in task_history, deleted again: a schedule whose position went back over an occurrence that
-- ran and moved into the history (resumed by a node whose clock is behind the owner's, a
-- replay) must not fire it twice. A later statement of the inserts' transaction, so its
-- snapshot sees the rows of a sweep that an insert waited for (chronoq.store.retired_keys).
DELETE FROM tasks t
WHERE t.id = ANY($1::uuid[]) AND chronoq_key_retired(t.namespace, t.idempotency_key);

-- name: advance_schedule
UPDATE schedules
SET next_fire_at = $2, last_fire_at = coalesce($3, last_fire_at),
    created_total = created_total + $4, skipped_total = skipped_total + $5
WHERE id = $1;

-- name: queue_depth
-- READY and RUNNING per queue through their partial indexes (small by design; one branch
-- each: `state IN (1, 2)` matches neither index and read the whole table), and SCHEDULED
-- over the coming buckets only: never a scan of the whole backlog.
SELECT namespace, queue, 1 AS state, count(*) AS n FROM tasks WHERE state = 1
GROUP BY namespace, queue
UNION ALL
SELECT namespace, queue, 2 AS state, count(*) AS n FROM tasks WHERE state = 2
GROUP BY namespace, queue
UNION ALL
SELECT namespace, queue, 0 AS state, count(*) AS n FROM tasks
WHERE state = 0 AND partition = ANY($1::smallint[]) AND bucket BETWEEN $2 AND $3
GROUP BY namespace, queue;

-- name: purge_finished
-- Retention: finished tasks of some partitions, oldest first, in a bounded batch. A task that
-- holds its unique key's unique_for window is kept until the window ended as long before $3
-- (its retention counts from the later of its finish and its window's end).
DELETE FROM tasks WHERE id = ANY(ARRAY(
    SELECT id FROM tasks
    WHERE partition = ANY($1::smallint[]) AND state = ANY($2::smallint[]) AND finished_at < $3
      AND (unique_until IS NULL OR unique_closed OR unique_until < $3)
    ORDER BY finished_at
    LIMIT $4
)) AND (SELECT chronoq_hold($1::smallint[], {{map_version}}));

-- fragment: history_columns
-- Every column of tasks, in tasks' order: what a row carries into task_history (migration
-- 0022, which adds retire_at after them). tests/integration/test_task_history.py checks the
-- list against the catalog, so a column added to tasks cannot be left behind.
id, namespace, queue, partition, bucket, run_at, state, priority, payload, idempotency_key,
attempt, max_attempts, retry_base, backoff_initial_ms, backoff_max_ms, lease_timeout_ms,
misfire_policy, misfire_grace_ms, lease_until, worker_id, last_error, created_at, fired_at,
finished_at, fired_by, fire_token, content_type, trace_context, concurrency_key, unique_key,
unique_until, debounce_key, debounce_until, labels, unique_closed

-- name: retire_finished
-- The sweep: up to $4 SUCCEEDED, CANCELLED or SKIPPED tasks of some partitions ($1) that
-- finished before $2 leave tasks for task_history, in one statement (a reader sees each row in
-- exactly one of the two). retire_at, the moment a row may go, is the later of its finish and
-- its unique window's end, plus the retention $3 (NULL: kept forever, 'infinity'); a row
-- already past it at $5 is deleted only. A row holding an open unique_for window stays, as in
-- purge_finished (the window's unique index is on tasks). The pick walks tasks_retiring in
-- its order, so it stops after $4 rows whatever else the partitions hold. DEAD letters stay.
WITH moved AS (
    DELETE FROM tasks t WHERE t.id = ANY(ARRAY(
        SELECT r.id FROM tasks r
        WHERE r.partition = ANY($1::smallint[]) AND r.state IN (3, 5, 6) AND r.finished_at < $2
          AND (r.unique_until IS NULL OR r.unique_closed OR r.unique_until < $2)
        ORDER BY r.partition, r.finished_at
        LIMIT $4
    )) AND t.state + 0 IN (3, 5, 6)
      AND (SELECT chronoq_hold($1::smallint[], {{map_version}}))
    RETURNING {{history_columns}},
        coalesce(greatest(t.finished_at, t.unique_until) + $3::interval, 'infinity') AS retire_at
),
kept AS (
    INSERT INTO task_history ({{history_columns}}, retire_at)
    SELECT {{history_columns}}, retire_at FROM moved WHERE retire_at > $5::timestamptz
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved) AS gone, (SELECT count(*) FROM kept) AS kept;

-- name: history_slices
-- The time slices of task_history by their bounds (epoch seconds), whatever their names:
-- the bounds as PostgreSQL prints them, cast back in the same session. The forever slice
-- (FROM infinity TO MAXVALUE) and any bound not finite are left out.
SELECT c.relname AS name,
       extract(epoch FROM b.lo)::bigint AS lo, extract(epoch FROM b.hi)::bigint AS hi
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL regexp_match(
    pg_get_expr(c.relpartbound, c.oid), 'FROM \(''([^'']*)''\) TO \(''([^'']*)''\)') AS m
CROSS JOIN LATERAL (SELECT m[1]::timestamptz AS lo, m[2]::timestamptz AS hi) b
WHERE i.inhparent = 'task_history'::regclass AND m IS NOT NULL
  AND isfinite(b.lo) AND isfinite(b.hi)
ORDER BY lo;

-- name: set_queue_limit
-- A new queue's limit only while the namespace has fewer than $6 (counted by this statement);
-- an existing one can always be changed. No row: the namespace is at its cap.
INSERT INTO queue_limits (namespace, queue, rate, burst, tokens, refilled_at)
SELECT $1, $2, $3, $4, $4, $5
WHERE (SELECT count(*) FROM queue_limits WHERE namespace = $1) < $6::bigint
   OR EXISTS (SELECT 1 FROM queue_limits WHERE namespace = $1 AND queue = $2)
ON CONFLICT (namespace, queue) DO UPDATE
    SET rate = EXCLUDED.rate, burst = EXCLUDED.burst,
        tokens = least(queue_limits.tokens, EXCLUDED.burst)
RETURNING namespace, queue, rate, burst;

-- name: delete_queue_limit
DELETE FROM queue_limits WHERE namespace = $1 AND queue = $2;

-- name: queue_limits
SELECT namespace, queue, rate, burst FROM queue_limits ORDER BY namespace, queue;

-- name: take_tokens
-- Refill by elapsed time, then grant up to $3 whole tokens; one row lock per limited queue.
WITH cur AS (
    SELECT namespace, queue,
           least(burst, tokens + rate * greatest(0, extract(epoch FROM ($4::timestamptz - refilled_at))))
             AS avail
    FROM queue_limits WHERE namespace = $1 AND queue = $2
    FOR UPDATE
)
UPDATE queue_limits l
SET tokens = cur.avail - least($3, floor(cur.avail)),
    refilled_at = greatest(l.refilled_at, $4::timestamptz)
FROM cur
WHERE l.namespace = cur.namespace AND l.queue = cur.queue
RETURNING least($3, floor(cur.avail))::integer AS granted;

-- name: return_tokens
UPDATE queue_limits SET tokens = least(burst, tokens + $3) WHERE namespace = $1 AND queue = $2;

-- name: ready_counts
-- Ready tasks per (namespace, queue) that long-polls wait on, each counted no further than
-- its cap (its number of waiters): a few index entries per key, whatever the backlog.
SELECT k.namespace, k.queue, r.n
FROM unnest($1::text[], $2::text[], $3::integer[]) AS k(namespace, queue, cap)
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM tasks t
        WHERE t.namespace = k.namespace AND t.queue = k.queue AND t.state = 1
          -- a paused queue counts none: its waiters are not woken for what they cannot claim
          AND NOT EXISTS (SELECT 1 FROM queue_settings s
                          WHERE s.namespace = k.namespace AND s.queue = k.queue AND s.paused)
        LIMIT k.cap
    ) x
) r
WHERE r.n > 0;

-- name: ready_heads
-- The first $3 READY tasks of the queues $2 of namespace $1 in claim order (priority DESC,
-- run_at), unlocked: (priority, run_at, bytes), bytes as the claim counts them for worker
-- $4 plus $5. A store of shards reads each shard's head and decides how many each claims, so
-- no task is leased that the answer would not keep. At most $3 index entries per queue.
SELECT h.priority, h.run_at, h.bytes
FROM unnest($2::text[]) AS q(queue) CROSS JOIN LATERAL (
    SELECT t.priority, t.run_at,
           {{task_bytes}} + octet_length($4::text) + $5::integer AS bytes
    FROM tasks t
    WHERE t.namespace = $1 AND t.queue = q.queue AND t.state = 1
      -- a paused queue has no head: no claim may take from it
      AND NOT EXISTS (SELECT 1 FROM queue_settings s
                      WHERE s.namespace = $1 AND s.queue = q.queue AND s.paused)
    ORDER BY t.priority DESC, t.run_at
    LIMIT $3
) h
ORDER BY h.priority DESC, h.run_at
LIMIT $3;

-- name: queue_counts
-- One namespace's tasks by (state, queue), with the oldest run_at, from tasks_queue_states
-- alone (an index-only scan): at most $3 index entries read per state, so a count whose
-- `read` reaches $3 is a lower bound, and at most $4 queues per state, in queue order
-- (`groups` says how many there were).
SELECT s.state, c.queue, c.n, c.oldest, c.read, c.groups
FROM unnest($2::smallint[]) AS s(state)
CROSS JOIN LATERAL (
    SELECT x.queue, count(*) AS n, min(x.run_at) AS oldest,
           sum(count(*)) OVER () AS read, count(*) OVER () AS groups
    FROM (
        SELECT t.queue, t.run_at FROM tasks t
        WHERE t.namespace = $1 AND t.state = s.state AND t.state IN (0, 1, 2, 4)
        LIMIT $3
    ) x
    GROUP BY x.queue
    ORDER BY x.queue
    LIMIT $4
) c;

-- name: announce
-- One notice per payload on the channel (pg_notify: the payloads are parameters).
SELECT pg_notify($1, payload) FROM unnest($2::text[]) AS payload;

-- Namespace counters on the map's first shard (migration 0014, chronoq.store.counts): a
-- namespace's schedules and reserved tasks/s across every store shard.

-- name: take_namespace_count
-- Takes $3 schedules and $4 tasks/s from namespace $1's counter when its cap ($5; NULL: none)
-- and quota ($6; NULL: none) allow them, atomically (the row's lock decides between racing
-- takes), and records the take ($2, at $7) until its create says how it ended. One row: whether
-- it was taken, the counts before, and whether the namespace has a counter at all.
WITH taken AS (
    UPDATE namespace_counts c
    SET schedules = c.schedules + $3, reserved = c.reserved + $4::float8
    WHERE c.namespace = $1
      AND ($5::bigint IS NULL OR $3 = 0 OR c.schedules + $3 <= $5::bigint)
      AND ($6::float8 IS NULL OR $4::float8 = 0
           OR c.reserved + $4::float8 <= $6::float8 * (1 + 1e-9))
    RETURNING c.schedules - $3 AS schedules, c.reserved - $4::float8 AS reserved
), recorded AS (
    INSERT INTO namespace_takes (token, namespace, schedules, reserved, taken_at)
    SELECT $2, $1, $3, $4::float8, $7 FROM taken
)
SELECT EXISTS (SELECT 1 FROM taken) AS taken,
       coalesce((SELECT schedules FROM taken), c.schedules) AS schedules,
       coalesce((SELECT reserved FROM taken), c.reserved) AS reserved,
       c.namespace IS NOT NULL AS counted
FROM (SELECT 1) one LEFT JOIN namespace_counts c ON c.namespace = $1;

-- name: drop_namespace_take
-- The create that took ($1) succeeded: its counts stay, its take is settled.
DELETE FROM namespace_takes WHERE token = $1;

-- name: give_back_namespace_take
-- The create that took ($1, of namespace $2) was refused: its take and its counts go back,
-- once (nothing when a recount settled it first). The counter's row is locked before the take
-- is deleted, in a recount's order.
WITH counter AS (
    SELECT c.namespace FROM namespace_counts c WHERE c.namespace = $2 FOR UPDATE
), dropped AS (
    DELETE FROM namespace_takes t
    WHERE t.token = $1 AND t.namespace = (SELECT namespace FROM counter)
    RETURNING t.schedules, t.reserved
)
UPDATE namespace_counts c
SET schedules = greatest(0, c.schedules - d.schedules),
    reserved = greatest(0, c.reserved - d.reserved)
FROM dropped d WHERE c.namespace = $2;

-- name: namespace_count_epoch
SELECT epoch FROM namespace_counts WHERE namespace = $1;

-- name: release_namespace_count
-- A delete or pause that committed on its shard gives back $2 schedules and $3 tasks/s, unless
-- a recount ran since it read the epoch ($4): that recount counted its shard before or after it.
UPDATE namespace_counts
SET schedules = greatest(0, schedules - $2), reserved = greatest(0, reserved - $3::float8)
WHERE namespace = $1 AND epoch = $4;

-- name: seed_namespace_count
-- A namespace's first counter, from a count over every shard; a racing seed's row stays.
INSERT INTO namespace_counts (namespace, schedules, reserved, recounted_at)
VALUES ($1, $2, $3::float8, $4) ON CONFLICT (namespace) DO NOTHING;

-- name: lock_namespace_count
-- A recount's start, in its transaction: the counter's row locked (takes and give-backs wait),
-- and whether a take since $2 may still be in flight (then the recount waits for a later turn).
SELECT c.epoch,
       EXISTS (SELECT 1 FROM namespace_takes t WHERE t.namespace = $1 AND t.taken_at > $2) AS busy
FROM namespace_counts c WHERE c.namespace = $1
FOR UPDATE OF c;

-- name: recount_namespace_count
-- A recount's end: the counts read from every shard, the stale takes settled, the epoch on.
WITH settled AS (DELETE FROM namespace_takes WHERE namespace = $1)
UPDATE namespace_counts
SET schedules = $2, reserved = $3::float8, epoch = epoch + 1, recounted_at = $4
WHERE namespace = $1;

-- name: namespace_schedule_count
-- One shard's schedules of a namespace and the tasks/s its active ones reserve.
SELECT count(*) AS schedules,
       coalesce(sum(max_rate) FILTER (WHERE NOT paused), 0)::float8 AS reserved
FROM schedules WHERE namespace = $1;

-- name: namespaces_to_recount
-- At most $2 namespaces: first those with a take left since before $1 (an outcome unknown),
-- then those longest since their last recount.
SELECT x.namespace FROM (
    (SELECT t.namespace, 0 AS turn, min(t.taken_at) AS at FROM namespace_takes t
     WHERE t.taken_at <= $1 GROUP BY t.namespace ORDER BY min(t.taken_at) LIMIT $2)
    UNION ALL
    (SELECT c.namespace, 1, c.recounted_at FROM namespace_counts c
     ORDER BY c.recounted_at LIMIT $2)
) x
GROUP BY x.namespace ORDER BY min(x.turn), min(x.at) LIMIT $2;

-- name: lock_schedule
-- A pause over several shards, in its transaction: whether the schedule was paused before
-- (its row locked, so two pauses racing learn which one paused it).
SELECT paused FROM schedules WHERE namespace = $1 AND name = $2 FOR UPDATE;

-- Queue counts kept by the partition owners (migration 0021, chronoq.node.queue_counts).

-- name: lock_queue_recount
-- One recount of a partition at a time (an old and a new owner may overlap for a moment):
-- transaction-level advisory locks of class "chqc", taken in partition order.
SELECT pg_advisory_xact_lock(1667788131, u.p) FROM unnest($1::smallint[]) AS u(p) ORDER BY u.p;

-- name: recount_queue_counts
-- The partitions $1 counted by (namespace, state, queue) in the states $3 from
-- tasks_partition_states alone (an index-only scan of those states' entries, in index order:
-- READY and RUNNING alone read only their own), at most $2 queues per (partition, namespace, state)
-- in queue order and the rest summed under queue '', written in one statement (a reader
-- sees the old counts or the new): rows that changed are updated, rows gone deleted, the
-- rest left as they are (no dead rows for counts that did not move). Answers the index
-- entries it read.
WITH fresh AS (
    SELECT g.partition, g.namespace, g.state,
           CASE WHEN g.rank <= $2 THEN g.queue ELSE '' END AS queue, sum(g.n)::bigint AS n
    FROM (
        SELECT c.partition, c.namespace, c.state, c.queue, c.n,
               row_number() OVER (
                   PARTITION BY c.partition, c.namespace, c.state ORDER BY c.queue
               ) AS rank
        FROM (
            SELECT t.partition, t.namespace, t.state, t.queue, count(*) AS n
            FROM tasks t
            WHERE t.partition = ANY($1::smallint[]) AND t.state = ANY($3::smallint[])
              AND t.state IN (0, 1, 2, 4)
            GROUP BY t.partition, t.state, t.namespace, t.queue
        ) c
    ) g
    GROUP BY 1, 2, 3, 4
), gone AS (
    DELETE FROM queue_state_counts k
    WHERE k.partition = ANY($1::smallint[]) AND k.state = ANY($3::smallint[])
      AND NOT EXISTS (
          SELECT 1 FROM fresh f
          WHERE f.partition = k.partition AND f.namespace = k.namespace
            AND f.state = k.state AND f.queue = k.queue
      )
), changed AS (
    INSERT INTO queue_state_counts AS k (partition, namespace, state, queue, n)
    SELECT f.partition, f.namespace, f.state, f.queue, f.n FROM fresh f
    ON CONFLICT (partition, namespace, state, queue) DO UPDATE SET n = excluded.n
    WHERE k.n IS DISTINCT FROM excluded.n
)
SELECT coalesce(sum(n), 0)::bigint AS read FROM fresh;

-- name: mark_queue_counts
-- The partitions $1 recounted at $2 by $3: READY and RUNNING, and every state when $4.
INSERT INTO queue_counts_at AS a (partition, counted_at, live_at, counter)
SELECT u.p, CASE WHEN $4::boolean THEN $2::timestamptz END, $2, $3
FROM unnest($1::smallint[]) AS u(p)
ON CONFLICT (partition) DO UPDATE
SET counted_at = coalesce(excluded.counted_at, a.counted_at), live_at = excluded.live_at,
    counter = excluded.counter;

-- name: kept_queue_counts
-- Namespace $1's kept counts per (queue, state), summed over the partitions this shard
-- holds (one moved away or still coming in is counted on the shard where it is live): the
-- queues $2 only (NULL: every queue, '' first), at most $3 rows in queue order.
SELECT c.queue, c.state, sum(c.n)::bigint AS n
FROM queue_state_counts c
WHERE c.namespace = $1 AND ($2::text[] IS NULL OR c.queue = ANY($2::text[]))
  AND NOT EXISTS (
      SELECT 1 FROM shard_partitions h WHERE h.partition = c.partition AND h.state >= 2
  )
GROUP BY c.queue, c.state
ORDER BY c.queue, c.state
LIMIT $3;

-- name: kept_state_totals
-- Namespace $1's kept counts per state, every queue (the same partitions as above).
SELECT c.state, sum(c.n)::bigint AS n
FROM queue_state_counts c
WHERE c.namespace = $1
  AND NOT EXISTS (
      SELECT 1 FROM shard_partitions h WHERE h.partition = c.partition AND h.state >= 2
  )
GROUP BY c.state;

-- name: queue_counts_as_of
-- The oldest recount among the partitions this shard holds (of every state, and of READY
-- and RUNNING), and how many were counted in every state.
SELECT min(a.counted_at) AS as_of, min(a.live_at) AS live_as_of, count(a.counted_at) AS counted
FROM queue_counts_at a
WHERE NOT EXISTS (
    SELECT 1 FROM shard_partitions h WHERE h.partition = a.partition AND h.state >= 2
);

-- name: oldest_ready
-- The run_at of the oldest READY task of each (namespace, queue) given: one probe of
-- tasks_queue_states each (its first entry), whatever the backlog.
SELECT k.namespace, k.queue, (
    SELECT min(t.run_at) FROM tasks t
    WHERE t.namespace = k.namespace AND t.state = 1 AND t.queue = k.queue
) AS oldest
FROM unnest($1::text[], $2::text[]) AS k(namespace, queue);

-- name: kept_ready
-- READY tasks per (namespace, queue) of every namespace, as kept (the queue gauges).
SELECT c.namespace, c.queue, sum(c.n)::bigint AS n
FROM queue_state_counts c
WHERE c.state = 1 AND c.queue <> ''
  AND NOT EXISTS (
      SELECT 1 FROM shard_partitions h WHERE h.partition = c.partition AND h.state >= 2
  )
GROUP BY c.namespace, c.queue;

-- fragment: filter_hit
-- Whether the row `t` passes a listing's or a bulk operation's filter: of queue $6, carrying
-- every label of $7 (a JSON object; containment), run_at in [$8, $9) (NULL: not filtered).
(($6::text IS NULL OR t.queue = $6::text)
 AND ($7::jsonb IS NULL OR t.labels @> $7::jsonb)
 AND ($8::timestamptz IS NULL OR t.run_at >= $8::timestamptz)
 AND ($9::timestamptz IS NULL OR t.run_at < $9::timestamptz))

-- fragment: filter_walk
-- A bounded stretch of a namespace's ($1) tasks in the states $2, after the id $3, keyset
-- in id order: per state one range of tasks_listing (namespace, state, id), read lazily
-- until it has $4 matching rows (filter_hit) or has read $5 entries (that entry is kept as
-- the state's position, `n = $5`). A state that stopped so has a position; the stretch ends
-- at the lowest one (`upto`; NULL: every state was read to its end), and every matching row
-- of ($3, upto] was read: `pick`, the first $4 of them. Rows of partitions this shard holds
-- as a copy (incoming or gone: state >= 2) are not this shard's tasks and are left out; a
-- frozen partition's rows are kept (their write is then refused whole, PartitionMoved, and
-- the caller tries again). `next` is where the walk goes on: the last id picked when $4
-- were, else upto; NULL at the end.
held AS MATERIALIZED (
    SELECT ARRAY(SELECT h.partition FROM shard_partitions h WHERE h.state >= 2) AS copies
),
walked AS MATERIALIZED (
    SELECT s.state, w.id, w.hit, w.n
    FROM unnest($2::smallint[]) AS s(state) CROSS JOIN LATERAL (
        SELECT r.id, r.hit, r.n
        FROM (
            SELECT t.id, {{filter_hit}} AS hit, row_number() OVER (ORDER BY t.id) AS n
            FROM (SELECT id, namespace, state, partition, queue, labels, run_at FROM tasks
                  UNION ALL
                  SELECT id, namespace, state, partition, queue, labels, run_at
                  FROM task_history) t
            WHERE t.namespace = $1 AND t.state = s.state AND t.id > $3::uuid
              AND NOT t.partition = ANY((SELECT copies FROM held)::smallint[])
            ORDER BY t.id
            LIMIT $5
        ) r
        WHERE r.hit OR r.n = $5
        LIMIT $4
    ) w
),
stops AS (
    SELECT w.state, (array_agg(w.id ORDER BY w.id DESC))[1] AS last,
           count(*) >= $4 OR bool_or(w.n = $5) AS stopped
    FROM walked w
    GROUP BY w.state
),
bound AS (
    SELECT (SELECT s.last FROM stops s WHERE s.stopped ORDER BY s.last LIMIT 1) AS upto
),
pick AS MATERIALIZED (
    SELECT w.id FROM walked w
    WHERE w.hit AND ((SELECT upto FROM bound) IS NULL OR w.id <= (SELECT upto FROM bound))
    ORDER BY w.id
    LIMIT $4
),
walk_next AS (
    SELECT CASE WHEN (SELECT count(*) FROM pick) >= $4
                THEN (SELECT p.id FROM pick p ORDER BY p.id DESC LIMIT 1)
                ELSE (SELECT upto FROM bound) END AS next
)

-- name: list_tasks_filtered
-- A page of the tasks filter_walk picks ($4 the page size), ending before its rows' size
-- passes $10 bytes (variable-length columns plus $11 each; the first row always comes).
-- `next`: where the next page starts (NULL: the end). A page may hold fewer than $4 tasks,
-- even none, and still go on: it read a bounded stretch of the namespace.
WITH {{filter_walk}},
sized AS (
    SELECT {{task_row}}, {{task_bytes}} + $11::integer AS row_bytes
    FROM tasks t
    WHERE t.id = ANY(ARRAY(SELECT id FROM pick))
    UNION ALL
    SELECT {{task_row}}, {{task_bytes}} + $11::integer AS row_bytes
    FROM task_history t
    WHERE t.id = ANY(ARRAY(SELECT id FROM pick))
),
paged AS (
    SELECT s.*, sum(s.row_bytes) OVER (ORDER BY s.id) AS page_bytes,
           row_number() OVER (ORDER BY s.id) AS page_row
    FROM sized s
)
-- one row even when the page is empty (its task columns NULL), to carry `next`
SELECT p.*, (SELECT count(*) FROM pick) AS picked, n.next
FROM walk_next n LEFT JOIN paged p ON p.page_bytes <= $10 OR p.page_row = 1
ORDER BY p.id;

-- name: bulk_match
-- A bulk operation's dry run: the ids filter_walk picks ($4 of them at most), changing none.
WITH {{filter_walk}}
SELECT ARRAY(SELECT id FROM pick ORDER BY id) AS ids, (SELECT next FROM walk_next) AS next;

-- fragment: bulk_done
-- What a bulk write answers: how many rows it changed, the queues of those that wake claims
-- (made READY, or cancelled with a concurrency key: a key's slot may be free; NULL: none),
-- and where its walk goes on. Every row it writes is of a partition this shard
-- holds live at the caller's map version (chronoq_hold_ids; else PartitionMoved, nothing
-- written), still in one of the states $2 and still matching the filter as it is written.
SELECT (SELECT count(*) FROM done) AS n,
       ARRAY(SELECT queue FROM done WHERE queue IS NOT NULL) AS queues,
       (SELECT next FROM walk_next) AS next

-- name: bulk_cancel
-- SCHEDULED, READY, RUNNING or DEAD -> CANCELLED at $10 for the rows filter_walk picks (one
-- batch of $4); a running worker learns it by heartbeat.
WITH {{filter_walk}},
done AS (
    UPDATE tasks t
    SET state = 5, finished_at = $10::timestamptz, lease_until = NULL
    WHERE t.id = ANY(ARRAY(SELECT id FROM pick)) AND t.namespace || '' = $1
      AND t.state + 0 = ANY($2::smallint[]) AND {{filter_hit}}
      AND (SELECT chronoq_hold_ids(ARRAY(SELECT id FROM pick), {{map_version}}))
    RETURNING CASE WHEN t.concurrency_key IS NOT NULL THEN t.queue END AS queue
)
{{bulk_done}};

-- name: bulk_requeue
-- DEAD -> READY now ($10, bucket $11) with a fresh attempt budget, as requeue_dead, for the
-- rows filter_walk picks (one batch of $4). A dead letter whose unique key has a pending
-- task stays DEAD (one pending task per key, tasks_unique_pending), as does all but the first
-- (by id) of a batch's dead letters sharing a key: the rest of the batch goes on.
WITH {{filter_walk}},
done AS (
    UPDATE tasks t
    SET state = 1, run_at = $10::timestamptz, bucket = $11::bigint,
        fired_at = $10::timestamptz, finished_at = NULL, fired_by = 'requeue',
        fire_token = NULL, retry_base = t.attempt, lease_until = NULL, worker_id = NULL
    WHERE t.id = ANY(ARRAY(SELECT id FROM pick)) AND t.namespace || '' = $1
      AND t.state + 0 = ANY($2::smallint[]) AND {{filter_hit}}
      -- A dead task whose unique key a pending task holds stays DEAD (requeued, both would
      -- be pending: tasks_unique_pending); of a key's dead tasks in one batch, the first only.
      AND (t.unique_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM tasks o
          WHERE o.namespace = t.namespace AND o.partition = t.partition
            AND o.unique_key = t.unique_key
            AND (o.state IN (0, 1, 2)
                 OR (o.id < t.id AND o.id = ANY(ARRAY(SELECT id FROM pick))))))
      AND (SELECT chronoq_hold_ids(ARRAY(SELECT id FROM pick), {{map_version}}))
    RETURNING t.queue
)
{{bulk_done}};

-- name: bulk_run_now
-- SCHEDULED -> READY now ($10; a task already overdue keeps its run_at, so its lateness
-- shows) for the rows filter_walk picks (one batch of $4). Conditional on SCHEDULED like the
-- owner's fire: whichever commits first wins and the other changes nothing, so no task fires
-- twice, and the owner's watermark needs no change (a row leaving SCHEDULED is simply no
-- longer due). Claims then take them through the queue's gate like any READY task.
WITH {{filter_walk}},
done AS (
    UPDATE tasks t
    SET state = 1,
        bucket = CASE WHEN t.run_at <= $10::timestamptz THEN t.bucket ELSE $11::bigint END,
        run_at = least(t.run_at, $10::timestamptz),
        fired_at = $10::timestamptz, fired_by = 'run-now', fire_token = NULL
    WHERE t.id = ANY(ARRAY(SELECT id FROM pick)) AND t.namespace || '' = $1
      AND t.state + 0 = ANY($2::smallint[]) AND {{filter_hit}}
      AND (SELECT chronoq_hold_ids(ARRAY(SELECT id FROM pick), {{map_version}}))
    RETURNING t.queue
)
{{bulk_done}};

-- name: label_counts
-- Namespace $1's tasks in the states $3 by (queue, value of label $2, state), the queues $4
-- only (NULL: every queue): read from the tasks (the label is in no index), at most $5 per
-- state through tasks_queue_states, so a state whose `read` reaches $5 is a lower bound.
SELECT x.queue, coalesce(x.labels ->> $2, '') AS value, s.state,
       count(*) AS n, sum(count(*)) OVER (PARTITION BY s.state) AS read
FROM unnest($3::smallint[]) AS s(state)
CROSS JOIN LATERAL (
    SELECT t.queue, t.labels FROM tasks t
    WHERE t.namespace = $1 AND t.state = s.state AND t.state IN (0, 1, 2, 4)
      AND ($4::text[] IS NULL OR t.queue = ANY($4::text[]))
    LIMIT $5
) x
GROUP BY x.queue, 2, s.state;

-- Unique tasks and debounce (chronoq.store.keyed; the indexes of migration 0019). Each
-- statement names one key of one namespace in one partition ($1, $2, $3): the partition its
-- tasks are placed in, so each is one probe of a partial index.

-- name: unique_holders
-- Per unique key (namespaces $1, partitions $2, keys $3, in order: `n`), the task that holds
-- it: the pending one (SCHEDULED, READY or RUNNING), else, for a submit with a unique_for
-- window ($4), the one whose window is open at $5. A key held by none has no row.
SELECT o.n, h.* FROM unnest($1::text[], $2::smallint[], $3::text[], $4::boolean[])
     WITH ORDINALITY AS o(namespace, partition, key, windowed, n)
CROSS JOIN LATERAL (
    SELECT * FROM (
        (SELECT {{task_row}}, 0 AS holds FROM tasks t
         WHERE t.namespace = o.namespace AND t.partition = o.partition
           AND t.unique_key = o.key AND t.state IN (0, 1, 2)
         LIMIT 1)
        UNION ALL
        (SELECT {{task_row}}, 1 AS holds FROM tasks t
         WHERE o.windowed AND t.namespace = o.namespace AND t.partition = o.partition
           AND t.unique_key = o.key AND t.unique_until IS NOT NULL AND t.unique_closed IS NULL
           AND t.unique_until > $5
         LIMIT 1)
    ) x
    ORDER BY x.holds
    LIMIT 1
) h;

-- name: close_unique_windows
-- The unique_for windows of the keys (namespaces $1, partitions $2, keys $3) that ended by
-- $4 no longer hold their keys (the row lock orders concurrent submits: the second finds
-- the window closed). Held live, as every write.
UPDATE tasks t SET unique_closed = true
FROM unnest($1::text[], $2::smallint[], $3::text[]) AS o(namespace, partition, key)
WHERE t.namespace = o.namespace AND t.partition = o.partition AND t.unique_key = o.key
  AND t.unique_until IS NOT NULL AND t.unique_closed IS NULL AND t.unique_until <= $4
  AND (SELECT chronoq_hold($2::smallint[], {{map_version}}));

-- name: debounce_pending
-- The debounced task of key $3 that has not started (SCHEDULED, attempt 0) moves to $4 or
-- its debounce_until, whichever is earlier (never earlier than it was: of two submits that
-- raced, the one whose instant is older may commit last), in the bucket of that instant ($5
-- s wide), and takes the last submit's payload, content type and trace context ($6..$8). A
-- fire of the row waits for this write and finds it no longer due (every fire checks
-- run_at in SQL); a fire that committed first made it READY, and this matches nothing.
UPDATE tasks t
SET run_at = least(greatest(t.run_at, $4::timestamptz), t.debounce_until),
    bucket = floor(extract(epoch FROM least(greatest(t.run_at, $4::timestamptz),
                                            t.debounce_until))
                   / $5::integer)::bigint,
    payload = $6, content_type = $7, trace_context = $8
WHERE t.namespace = $1 AND t.partition = $2 AND t.debounce_key = $3
  AND t.state = 0 AND t.attempt = 0
  AND (SELECT chronoq_hold(ARRAY[$2::smallint], {{map_version}}))
RETURNING {{task_row}};

-- name: debounce_pending_many
-- debounce_pending for many keys at once (namespaces $1, partitions $2, keys $3, each once,
-- in lock order; instants $4, payloads $6, content types $7, trace contexts $8; buckets $5 s
-- wide): the moved tasks, each with its key's position `n`.
UPDATE tasks t
SET run_at = least(greatest(t.run_at, o.run_at), t.debounce_until),
    bucket = floor(extract(epoch FROM least(greatest(t.run_at, o.run_at), t.debounce_until))
                   / $5::integer)::bigint,
    payload = o.payload, content_type = o.content_type, trace_context = o.trace_context
FROM unnest($1::text[], $2::smallint[], $3::text[], $4::timestamptz[], $6::bytea[],
            $7::text[], $8::jsonb[])
     WITH ORDINALITY AS o(namespace, partition, key, run_at, payload, content_type,
                          trace_context, n)
WHERE t.namespace = o.namespace AND t.partition = o.partition AND t.debounce_key = o.key
  AND t.state = 0 AND t.attempt = 0
  AND (SELECT chronoq_hold($2::smallint[], {{map_version}}))
RETURNING o.n, {{task_row}};

-- name: unique_blockers
-- Of the dead tasks $1 of namespace $2, one whose unique key a pending task holds (what
-- refused their requeue), and that task.
SELECT t.id, t.unique_key, o.id AS holder
FROM tasks t CROSS JOIN LATERAL (
    SELECT o.id FROM tasks o
    WHERE o.namespace = t.namespace AND o.partition = t.partition
      AND o.unique_key = t.unique_key AND o.state IN (0, 1, 2)
    LIMIT 1
) o
WHERE t.id = ANY($1::uuid[]) AND t.namespace = $2 AND t.unique_key IS NOT NULL
LIMIT 1;

-- ---------------------------------------------------------------- queue settings (pause)
-- A store of shards writes each of these to every shard (each shard's claim reads its own
-- copy); one database is the same with one shard.

-- fragment: queue_settings_row
namespace, queue, paused, paused_at, max_running_per_key, max_starts_per_key, updated_at

-- name: set_queue_settings
-- A queue's per-key limits ($3, $4; NULL keeps the stored value, 0 is no limit) at $5. A new
-- queue's row only while the namespace holds fewer than $6 (counted by this statement); an
-- existing one can always be changed. No row: the namespace is at its cap.
INSERT INTO queue_settings AS s (namespace, queue, max_running_per_key, max_starts_per_key,
                                 updated_at)
SELECT $1, $2, coalesce($3::integer, 0), coalesce($4::float8, 0), $5
WHERE (SELECT count(*) FROM queue_settings WHERE namespace = $1) < $6::bigint
   OR EXISTS (SELECT 1 FROM queue_settings WHERE namespace = $1 AND queue = $2)
ON CONFLICT (namespace, queue) DO UPDATE
    SET max_running_per_key = coalesce($3::integer, s.max_running_per_key),
        max_starts_per_key = coalesce($4::float8, s.max_starts_per_key),
        updated_at = $5
RETURNING {{queue_settings_row}};

-- name: pause_queue
-- Pauses a queue at $3 (a paused one keeps the instant its pause began); the cap ($4) as in
-- set_queue_settings. No row: the namespace is at its cap.
INSERT INTO queue_settings AS s (namespace, queue, paused, paused_at, updated_at)
SELECT $1, $2, true, $3, $3
WHERE (SELECT count(*) FROM queue_settings WHERE namespace = $1) < $4::bigint
   OR EXISTS (SELECT 1 FROM queue_settings WHERE namespace = $1 AND queue = $2)
ON CONFLICT (namespace, queue) DO UPDATE
    SET paused = true, paused_at = CASE WHEN s.paused THEN s.paused_at ELSE $3 END,
        updated_at = $3
RETURNING {{queue_settings_row}};

-- name: resume_queue
UPDATE queue_settings SET paused = false, paused_at = NULL, updated_at = $3
WHERE namespace = $1 AND queue = $2
RETURNING {{queue_settings_row}};

-- name: drop_default_queue_settings
-- A row that sets nothing any more goes (a queue without one is the same, and it frees its
-- place under the namespace's cap).
DELETE FROM queue_settings
WHERE namespace = $1 AND queue = $2 AND NOT paused
  AND max_running_per_key = 0 AND max_starts_per_key = 0;

-- name: get_queue_settings
SELECT {{queue_settings_row}} FROM queue_settings WHERE namespace = $1 AND queue = $2;

-- name: list_queue_settings
SELECT {{queue_settings_row}} FROM queue_settings WHERE namespace = $1 ORDER BY queue LIMIT $2;

-- name: gated_queue_settings
-- The rows that gate their queue (paused or limited per key), every namespace's: what each
-- node's dispatch gate holds. At most the namespaces' caps.
SELECT {{queue_settings_row}} FROM queue_settings
WHERE paused OR max_running_per_key > 0 OR max_starts_per_key > 0
ORDER BY namespace, queue;

-- name: skip_overdue_ready
-- One batch of a resume's misfire pass: the next $4 READY tasks of the namespace ($1) after
-- id $5, in id order (tasks_listing), so one statement reads at most $4 rows whatever the
-- backlog; of them, the tasks of queue $2 whose policy is SKIP and whose run_at is older than
-- their grace at $3 (saturated at $6 ms, as in fire_set) go SKIPPED. Only rows of partitions
-- this shard holds live at the caller's map version (chronoq_live). Answers the last id read
-- (NULL: nothing left to read) and how many went.
WITH live AS MATERIALIZED (SELECT chronoq_live({{map_version}}) AS parts),
walk AS MATERIALIZED (
    SELECT t.id, t.queue, t.partition, t.misfire_policy, t.misfire_grace_ms, t.run_at
    FROM tasks t
    -- a range of tasks_listing read as row comparisons, in its order: no plan can walk the
    -- primary key instead and filter out other namespaces' rows on the way
    WHERE (t.namespace, t.state, t.id) > ($1::text, 1::smallint, $5::uuid)
      AND (t.namespace, t.state, t.id)
          <= ($1::text, 1::smallint, 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid)
    ORDER BY t.namespace, t.state, t.id
    LIMIT $4
),
gone AS (
    UPDATE tasks t
    SET state = 6, finished_at = $3,
        last_error = 'skipped by misfire policy: ready later than its grace period while '
                     'its queue was paused'
    FROM walk w
    WHERE t.id = w.id AND t.state + 0 = 1 AND w.queue = $2 AND w.misfire_policy = 1
      AND w.run_at < $3::timestamptz
          - least(greatest(w.misfire_grace_ms, 0), $6::bigint) * interval '1 ms'
      AND ((SELECT parts FROM live) IS NULL
           OR w.partition = ANY((SELECT parts FROM live)::smallint[]))
    RETURNING t.id
)
SELECT (SELECT w.id FROM walk w ORDER BY w.id DESC LIMIT 1) AS last,
       (SELECT count(*) FROM gone)::integer AS skipped;

-- name: copy_queue_settings
-- Rows of queue_settings from another shard (column arrays), for a shard that joins the map:
-- each row as it is there (a row here already is left as it is: it was written since).
INSERT INTO queue_settings (namespace, queue, paused, paused_at, max_running_per_key,
                            max_starts_per_key, updated_at)
SELECT * FROM unnest($1::text[], $2::text[], $3::boolean[], $4::timestamptz[], $5::integer[],
                     $6::float8[], $7::timestamptz[])
ON CONFLICT (namespace, queue) DO NOTHING;
