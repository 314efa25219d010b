-- Queries of the operator dashboard (controlplane/dashboard.go).

-- Deletes an account's cooldown and family gates in one statement; the
-- paused and broken marks stay. Returns how many of each went.
-- name: ClearAccountCooldowns :one
WITH c AS (DELETE FROM cooldowns AS cd WHERE cd.account_id = @account_id::uuid RETURNING 1),
     g AS (DELETE FROM family_gates AS fg WHERE fg.account_id = @account_id::uuid RETURNING 1)
SELECT (SELECT count(*) FROM c)::integer AS cooldowns,
       (SELECT count(*) FROM g)::integer AS gates;

-- Route events, newest first, each filter applying when set. The outcome
-- is 'success' (2xx, whole), 'error' (anything else, a stream cut after
-- output included) or 'held' (at least one hold, or held now).
-- name: SearchRouteEvents :many
SELECT * FROM route_events
WHERE (sqlc.narg('account_id')::uuid IS NULL OR account_id = sqlc.narg('account_id'))
  AND (sqlc.narg('key_id')::uuid IS NULL OR key_id = sqlc.narg('key_id'))
  AND (sqlc.narg('model')::text IS NULL OR model = sqlc.narg('model'))
  AND (sqlc.narg('status')::integer IS NULL OR status = sqlc.narg('status'))
  AND (sqlc.narg('outcome')::text IS NULL
       OR (sqlc.narg('outcome') = 'success' AND status BETWEEN 200 AND 299 AND failure_stage <> 'after_output'
           AND pending_until IS NULL)
       OR (sqlc.narg('outcome') = 'error' AND pending_until IS NULL
           AND (status NOT BETWEEN 200 AND 299 OR failure_stage = 'after_output'))
       OR (sqlc.narg('outcome') = 'held' AND (hold_count > 0 OR (pending_until IS NOT NULL AND held_since IS NOT NULL))))
ORDER BY id DESC
LIMIT @max_rows;

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

-- The pool's requests, holds and errors per bucket of recorded_at.
-- name: RouteEventBuckets :many
SELECT date_bin(make_interval(secs => @bucket_seconds::double precision), recorded_at, @since::timestamptz)::timestamptz AS bucket,
       count(*)::bigint AS requests,
       count(*) FILTER (WHERE hold_count > 0)::bigint AS held_requests,
       coalesce(sum(hold_count), 0)::bigint AS holds,
       count(*) FILTER (WHERE status NOT BETWEEN 200 AND 299)::bigint AS errors
FROM route_events
WHERE recorded_at >= @since::timestamptz AND pending_until IS NULL
GROUP BY bucket
ORDER BY bucket;
