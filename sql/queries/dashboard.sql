-- Queries of the operator dashboard (controlplane/dashboard.go).

-- Deletes an account's cooldown and family gates in one statement; the
-- paused and broken marks stay. Returns how many of each went.
-- name: ClearAccountCooldowns :one
WITH c AS (DELETE FROM cooldowns AS cd WHERE cd.account_id = @account_id::uuid RETURNING 1),
     g AS (DELETE FROM family_gates AS fg WHERE fg.account_id = @account_id::uuid RETURNING 1)
SELECT (SELECT count(*) FROM c)::integer AS cooldowns,
       (SELECT count(*) FROM g)::integer AS gates;

-- Route events, the latest started first (then the latest recorded), a
-- page after the cursor (before_at, before_id) when set, each filter
-- applying when set. The outcome is 'success' (2xx, whole), 'error'
-- (anything else, a stream cut after output included) or 'held' (at least
-- one hold, or held now).
-- name: SearchRouteEvents :many
SELECT * FROM route_events
WHERE (sqlc.narg('before_at')::timestamptz IS NULL
       OR (started_at, id) < (sqlc.narg('before_at')::timestamptz, sqlc.narg('before_id')::bigint))
  AND (sqlc.narg('since')::timestamptz IS NULL OR started_at >= sqlc.narg('since')::timestamptz)
  AND (sqlc.narg('until')::timestamptz IS NULL OR started_at < sqlc.narg('until')::timestamptz)
  AND (sqlc.narg('session_key')::text IS NULL OR session_key = sqlc.narg('session_key'))
  AND (sqlc.narg('account_id')::uuid IS NULL OR account_id = sqlc.narg('account_id'))
  AND (sqlc.narg('key_id')::uuid IS NULL OR key_id = sqlc.narg('key_id'))
  AND (sqlc.narg('model')::text IS NULL OR model = sqlc.narg('model'))
  AND (sqlc.narg('status')::integer IS NULL OR status = sqlc.narg('status'))
  AND (sqlc.narg('outcome')::text IS NULL
       OR (sqlc.narg('outcome') = 'success' AND status BETWEEN 200 AND 299 AND failure_stage <> 'after_output'
           AND pending_until IS NULL)
       OR (sqlc.narg('outcome') = 'error' AND pending_until IS NULL
           AND (status NOT BETWEEN 200 AND 299 OR failure_stage = 'after_output'))
       OR (sqlc.narg('outcome') = 'held' AND (hold_count > 0 OR (pending_until IS NOT NULL AND held_since IS NOT NULL))))
ORDER BY started_at DESC, id DESC
LIMIT @max_rows;

-- The failed attempts of the requests started in [since, until), by
-- account, status, outcome class and error type, the most frequent first.
-- An attempt record (attempts_json, protojson) names its account; a hold
-- names none, and a success is no failure.
-- name: FailedAttempts :many
SELECT (a.rec->>'accountId')::uuid AS account_id,
       coalesce((a.rec->>'status')::integer, 0)::integer AS status,
       coalesce(a.rec->>'class', '')::text AS class,
       coalesce(a.rec->>'errorType', '')::text AS error_type,
       count(*)::bigint AS attempts,
       max(e.started_at)::timestamptz AS latest
FROM route_events e
CROSS JOIN LATERAL jsonb_array_elements(e.attempts_json) AS a(rec)
WHERE e.started_at >= @since::timestamptz AND e.started_at < @until::timestamptz
  AND a.rec ? 'accountId'
  AND (sqlc.narg('account_id')::text IS NULL OR a.rec->>'accountId' = sqlc.narg('account_id'))
  AND coalesce(a.rec->>'class', '') NOT IN ('OUTCOME_CLASS_SUCCESS', 'OUTCOME_CLASS_NOT_SENT')
GROUP BY 1, 2, 3, 4
ORDER BY attempts DESC, latest DESC
LIMIT 200;

-- Usage snapshots since @since, the highest utilization per account,
-- window and bucket (the peak before a reset is what the sawtooth shows),
-- with the latest reset of the bucket.
-- name: UsageHistory :many
SELECT account_id, window_name,
       date_bin(make_interval(secs => @bucket_seconds::double precision), taken_at, @since::timestamptz)::timestamptz AS bucket,
       max(utilization)::double precision AS utilization,
       max(resets_at)::timestamptz AS resets_at
FROM usage_snapshots
WHERE taken_at >= @since::timestamptz
  AND utilization IS NOT NULL AND resets_at IS NOT NULL
  AND (sqlc.narg('account_id')::uuid IS NULL OR account_id = sqlc.narg('account_id'))
GROUP BY account_id, window_name, bucket
ORDER BY account_id, window_name, bucket;

-- The pool's finished requests, holds and errors per bucket of the time
-- they started (the partition key: the range prunes partitions).
-- name: RouteEventBuckets :many
SELECT date_bin(make_interval(secs => @bucket_seconds::double precision), started_at, @since::timestamptz)::timestamptz AS bucket,
       count(*)::bigint AS requests,
       count(*) FILTER (WHERE hold_count > 0)::bigint AS held_requests,
       coalesce(sum(hold_count), 0)::bigint AS holds,
       count(*) FILTER (WHERE status NOT BETWEEN 200 AND 299)::bigint AS errors
FROM route_events
WHERE started_at >= @since::timestamptz AND pending_until IS NULL
GROUP BY bucket
ORDER BY bucket;
