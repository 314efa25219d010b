-- Aggregates read at scrape time by the control plane's metrics collector.
-- Both are one scan of small tables; the collector caches their answer.

-- Accounts by provider and state; an account in several states counts in
-- the most severe one (broken, then paused, then cooling).
-- name: MetricsAccountStates :many
SELECT a.provider,
       (CASE
            WHEN a.broken_at IS NOT NULL THEN 'broken'
            WHEN a.paused THEN 'paused'
            WHEN EXISTS (SELECT 1 FROM cooldowns c WHERE c.account_id = a.id AND c.until > @now::timestamptz) THEN 'cooling'
            ELSE 'active'
        END)::text AS state,
       count(*)::bigint AS accounts
FROM accounts a
GROUP BY 1, 2;

-- Current usage readings: a reading whose window already reset says
-- nothing about now and is left out.
-- name: MetricsUsage :many
SELECT a.label, w.window_name, w.utilization::float8 AS utilization
FROM usage_windows w
JOIN accounts a ON a.id = w.account_id
WHERE w.utilization IS NOT NULL
  AND (w.resets_at IS NULL OR w.resets_at > @now::timestamptz)
ORDER BY a.label, w.window_name;
