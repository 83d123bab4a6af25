-- Named queries of the store. Every state change is one conditional UPDATE whose rows
-- affected decide who won. `now` always comes in as a parameter from the node's Clock.

-- fragment: owned_fences
-- The fencing clause of every owner statement: the caller's partitions ($1) whose stored
-- token is still the caller's ($2), share-locked for the statement, so a new owner's token
-- bump waits for it and a stale token matches nothing. Used as {{owned_fences}}.
WITH fence AS (
    SELECT f.partition, f.watermark
    FROM partition_fences f
    JOIN unnest($1::smallint[], $2::bigint[]) AS o(partition, token)
      ON o.partition = f.partition AND o.token = f.token
    FOR SHARE OF f
)

-- name: insert_task_ids
-- Answers with the ids it inserted only: a conflict on (namespace, idempotency_key) inserts
-- nothing and the caller looks the first task up.
INSERT INTO tasks (id, namespace, queue, partition, bucket, run_at, state, priority, payload,
                   idempotency_key, max_attempts, backoff_initial_ms, backoff_max_ms,
                   lease_timeout_ms, misfire_policy, misfire_grace_ms, created_at, fired_at,
                   fired_by)
SELECT u.id, u.namespace, u.queue, u.partition, u.bucket, u.run_at, u.state, u.priority,
       u.payload, u.idempotency_key, u.max_attempts, u.backoff_initial_ms, u.backoff_max_ms,
       u.lease_timeout_ms, u.misfire_policy, u.misfire_grace_ms, $17::timestamptz,
       CASE WHEN u.state = 1 THEN $17::timestamptz END,
       CASE WHEN u.state = 1 THEN 'submit' END
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::smallint[], $5::bigint[],
            $6::timestamptz[], $7::smallint[], $8::integer[], $9::bytea[], $10::text[],
            $11::integer[], $12::bigint[], $13::bigint[], $14::bigint[], $15::smallint[],
            $16::bigint[])
     AS u(id, namespace, queue, partition, bucket, run_at, state, priority, payload,
          idempotency_key, max_attempts, backoff_initial_ms, backoff_max_ms, lease_timeout_ms,
          misfire_policy, misfire_grace_ms)
ON CONFLICT (namespace, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id;

-- name: task_ids_by_idempotency_key
SELECT idempotency_key, id FROM tasks WHERE namespace = $1 AND idempotency_key = ANY($2::text[]);

-- name: tasks_by_id
SELECT * FROM tasks WHERE id = ANY($1::uuid[]);

-- name: get_task
SELECT * FROM tasks WHERE id = $1 AND namespace = $2;

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

-- name: fire_due
-- Moves due SCHEDULED tasks of the caller's partitions to READY (or SKIPPED by misfire
-- policy). The fence rows are share-locked, so a new owner's token bump waits for this
-- statement and a stale token matches no fence row: nothing fires. Per partition the scan is
-- the index range [watermark - 1, (now_bucket, now)]: rows examined = rows due.
{{owned_fences}}, due AS (
    SELECT d.id
    FROM fence CROSS JOIN LATERAL (
        SELECT t.id FROM tasks t
        WHERE t.state = 0 AND t.partition = fence.partition
          AND t.bucket >= fence.watermark - 1
          AND (t.bucket, t.run_at) <= ($3::bigint, $4::timestamptz)
        ORDER BY t.bucket, t.run_at
        LIMIT $5
        FOR UPDATE SKIP LOCKED
    ) d
)
UPDATE tasks t
SET state = CASE WHEN t.misfire_policy = 1
                  AND t.run_at + t.misfire_grace_ms * interval '1 millisecond' < $4
                 THEN 6 ELSE 1 END,
    fired_at = $4,
    fired_by = $6,
    fire_token = (SELECT f.token FROM partition_fences f WHERE f.partition = t.partition),
    finished_at = CASE WHEN t.misfire_policy = 1
                        AND t.run_at + t.misfire_grace_ms * interval '1 millisecond' < $4
                       THEN $4 END,
    last_error = CASE WHEN t.misfire_policy = 1
                       AND t.run_at + t.misfire_grace_ms * interval '1 millisecond' < $4
                      THEN 'skipped by misfire policy: fired later than its grace period'
                      ELSE t.last_error END
WHERE t.id = ANY(ARRAY(SELECT id FROM due)) AND t.state = 0
RETURNING t.partition, t.namespace, t.queue, t.state, t.run_at;

-- name: advance_watermarks
UPDATE partition_fences f SET watermark = $3
FROM unnest($1::smallint[], $2::bigint[]) AS o(partition, token)
WHERE f.partition = o.partition AND f.token = o.token AND f.watermark < $3
RETURNING f.partition;

-- name: expired_leases
-- Running tasks of the caller's partitions whose lease ran out; fenced like fire_due.
{{owned_fences}}
SELECT d.* FROM fence CROSS JOIN LATERAL (
    SELECT t.id, t.attempt, t.max_attempts, t.retry_base, t.backoff_initial_ms,
           t.backoff_max_ms, t.worker_id
    FROM tasks t
    WHERE t.state = 2 AND t.partition = fence.partition AND t.lease_until < $3
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
WHERE t.id = u.id AND t.state = 2 AND t.attempt = u.attempt
RETURNING t.*;

-- name: lock_running
SELECT * FROM tasks WHERE id = $1 AND namespace = $2 FOR UPDATE;

-- name: claim
-- Per queue (with its own cap, from a dispatch limit), the ready index is walked in
-- (priority DESC, run_at) order and stops at the cap: cost follows the tasks claimed, not
-- the READY backlog. The candidate ids are computed once (an InitPlan), so a nested-loop
-- rescan with SKIP LOCKED can never hand out more than the limit.
UPDATE tasks t
SET state = 2, attempt = t.attempt + 1, worker_id = $4,
    lease_until = $5::timestamptz + t.lease_timeout_ms * interval '1 millisecond'
WHERE t.id = ANY(ARRAY(
    SELECT c.id
    FROM unnest($2::text[], $6::integer[]) AS q(queue, cap) CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM tasks
        WHERE namespace = $1 AND queue = q.queue AND state = 1
        ORDER BY priority DESC, run_at
        LIMIT q.cap
        FOR UPDATE SKIP LOCKED
    ) c
    ORDER BY c.priority DESC, c.run_at
    LIMIT $3
)) AND t.state = 1
RETURNING t.*;

-- name: heartbeat
UPDATE tasks t
SET lease_until = $4::timestamptz + t.lease_timeout_ms * interval '1 millisecond'
FROM unnest($2::uuid[], $3::integer[]) AS l(id, token)
WHERE t.id = l.id AND t.namespace = $1 AND t.state = 2 AND t.attempt = l.token
RETURNING t.id;

-- name: complete
UPDATE tasks t
SET state = 3, finished_at = $4, lease_until = NULL
FROM unnest($2::uuid[], $3::integer[]) AS l(id, token)
WHERE t.id = l.id AND t.namespace = $1 AND t.state = 2 AND t.attempt = l.token
RETURNING t.id;

-- name: lease_states
SELECT id, state, attempt FROM tasks WHERE namespace = $1 AND id = ANY($2::uuid[]);

-- name: release
UPDATE tasks
SET state = 1, lease_until = NULL, worker_id = NULL, retry_base = retry_base + 1
WHERE id = $1 AND namespace = $2 AND state = 2 AND attempt = $3
RETURNING *;

-- name: cancel
UPDATE tasks
SET state = 5, finished_at = $3, lease_until = NULL
WHERE id = $1 AND namespace = $2 AND state IN (0, 1, 2)
RETURNING *;

-- name: requeue_dead
UPDATE tasks
SET state = 1, run_at = $3, bucket = $4, fired_at = $3, finished_at = NULL,
    fired_by = 'requeue', fire_token = NULL,
    retry_base = attempt, lease_until = NULL, worker_id = NULL
WHERE id = ANY($1::uuid[]) AND namespace = $2 AND state = 4
RETURNING *;

-- name: list_tasks_in_state
SELECT * FROM tasks
WHERE namespace = $1 AND state = $2 AND ($3::text IS NULL OR queue = $3) AND id > $4::uuid
ORDER BY id
LIMIT $5;

-- name: list_tasks
SELECT * FROM tasks
WHERE namespace = $1 AND ($3::text IS NULL OR queue = $3) AND id > $4::uuid
  AND $2::smallint IS NULL
ORDER BY id
LIMIT $5;

-- name: pending_by_bucket
-- Due work per upcoming bucket, for status and load-aware assignment; reads only the
-- pending rows of those buckets through the firing index.
SELECT partition, bucket, count(*) AS pending
FROM tasks
WHERE state = 0 AND partition = ANY($1::smallint[]) AND bucket BETWEEN $2 AND $3
GROUP BY partition, bucket;

-- name: count_by_state
SELECT state, count(*) AS n FROM tasks GROUP BY state;

-- name: insert_schedule
INSERT INTO schedules (id, namespace, name, partition, queue, cron, interval_ms, timezone,
                       anchor, catchup, payload, priority, max_attempts, backoff_initial_ms,
                       backoff_max_ms, lease_timeout_ms, next_fire_at, created_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)
ON CONFLICT (namespace, name) DO NOTHING
RETURNING *;

-- name: get_schedule
SELECT * FROM schedules WHERE namespace = $1 AND name = $2;

-- name: list_schedules
SELECT * FROM schedules WHERE namespace = $1 AND name > $2 ORDER BY name LIMIT $3;

-- name: pause_schedule
UPDATE schedules SET paused = true WHERE namespace = $1 AND name = $2 RETURNING *;

-- name: resume_schedule
UPDATE schedules SET paused = false, next_fire_at = $3
WHERE namespace = $1 AND name = $2 AND paused
RETURNING *;

-- name: delete_schedule
DELETE FROM schedules WHERE namespace = $1 AND name = $2 RETURNING id;

-- name: due_schedules
-- Active schedules of the caller's partitions whose next occurrence is within the
-- lookahead; fenced and share-locked like fire_due.
{{owned_fences}}
SELECT d.* FROM fence CROSS JOIN LATERAL (
    SELECT s.* FROM schedules s
    WHERE s.partition = fence.partition AND NOT s.paused AND s.next_fire_at <= $3
    ORDER BY s.next_fire_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED
) d;

-- name: advance_schedule
UPDATE schedules
SET next_fire_at = $2, last_fire_at = coalesce($3, last_fire_at),
    created_total = created_total + $4, skipped_total = skipped_total + $5
WHERE id = $1;

-- name: queue_depth
-- READY and RUNNING per queue through their partial indexes (small by design), and
-- SCHEDULED over the coming buckets only: never a scan of the whole backlog.
SELECT namespace, queue, state, count(*) AS n FROM tasks WHERE state IN (1, 2)
GROUP BY namespace, queue, state
UNION ALL
SELECT namespace, queue, 0 AS state, count(*) AS n FROM tasks
WHERE state = 0 AND partition = ANY($1::smallint[]) AND bucket BETWEEN $2 AND $3
GROUP BY namespace, queue;

-- name: purge_finished
-- Retention: finished tasks of some partitions, oldest first, in a bounded batch.
DELETE FROM tasks WHERE id = ANY(ARRAY(
    SELECT id FROM tasks
    WHERE partition = ANY($1::smallint[]) AND state = ANY($2::smallint[]) AND finished_at < $3
    ORDER BY finished_at
    LIMIT $4
));

-- name: set_queue_limit
INSERT INTO queue_limits (namespace, queue, rate, burst, tokens, refilled_at)
VALUES ($1, $2, $3, $4, $4, $5)
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
