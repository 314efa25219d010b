-- Rung 4 and recovery: the usage view's account-wide windows as quota
-- evidence, and the recovery probe.

-- The account's current account-wide readings (five_hour, seven_day) that
-- are evidence at now: a utilization, and a reset still ahead.
-- name: AccountWideUsage :many
SELECT window_name, utilization::double precision AS utilization, resets_at::timestamptz AS resets_at
FROM usage_windows
WHERE account_id = @account_id
  AND window_name IN ('five_hour', 'seven_day')
  AND utilization IS NOT NULL
  AND resets_at > @now::timestamptz
ORDER BY window_name;

-- Lifts a quota cooldown that a reading observed at observed_at shows
-- recovered, by compare-and-set: only a quota_exhausted cooldown, only one
-- written before the reading was taken (a cooldown written after it rests
-- on newer evidence), and only the one that was read (written_at). In the
-- same statement the account is marked for one recovery probe.
-- name: ClearRecoveredQuotaCooldown :execrows
WITH cleared AS (
    DELETE FROM cooldowns
    WHERE account_id = @account_id
      AND reason = 'quota_exhausted'
      AND written_at = @written_at
      AND written_at < @observed_at::timestamptz
    RETURNING account_id
)
UPDATE accounts SET recovery_probe = true
WHERE id IN (SELECT account_id FROM cleared);
