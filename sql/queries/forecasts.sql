-- Usage history for forecasts: every account's snapshots with evidence
-- (a utilization and a reset) taken since @since, in one read, ordered for
-- grouping by account and window.
-- name: RecentUsageSnapshots :many
SELECT account_id, window_name, utilization::double precision AS utilization,
       resets_at::timestamptz AS resets_at, taken_at
FROM usage_snapshots
WHERE taken_at >= @since::timestamptz
  AND utilization IS NOT NULL AND resets_at IS NOT NULL
ORDER BY account_id, window_name, taken_at;
