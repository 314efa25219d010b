-- Merges a cooldown into the account's row. A live deadline is never
-- shortened (the later deadline wins), and a live non-transient cooldown
-- (a rejected credential) is not replaced by a transient one. An expired
-- row is simply replaced. Returns the cooldown in force afterwards.
-- name: WriteCooldown :one
INSERT INTO cooldowns AS c (account_id, reason, transient, until, written_at, evidence,
    quota_kind, quota_resets_at, quota_window_minutes, quota_message)
VALUES (@account_id, @reason, @transient, @until, @now, @evidence,
    sqlc.narg(quota_kind), sqlc.narg(quota_resets_at), @quota_window_minutes, @quota_message)
ON CONFLICT (account_id) DO UPDATE SET
    reason = CASE
        WHEN c.until <= EXCLUDED.written_at THEN EXCLUDED.reason
        WHEN NOT c.transient AND EXCLUDED.transient THEN c.reason
        WHEN EXCLUDED.until >= c.until OR (c.transient AND NOT EXCLUDED.transient) THEN EXCLUDED.reason
        ELSE c.reason END,
    evidence = CASE
        WHEN c.until <= EXCLUDED.written_at THEN EXCLUDED.evidence
        WHEN NOT c.transient AND EXCLUDED.transient THEN c.evidence
        WHEN EXCLUDED.until >= c.until OR (c.transient AND NOT EXCLUDED.transient) THEN EXCLUDED.evidence
        ELSE c.evidence END,
    -- The quota evidence goes with the deadline it justified: the same
    -- choice as reason and evidence.
    quota_kind = CASE
        WHEN c.until <= EXCLUDED.written_at THEN EXCLUDED.quota_kind
        WHEN NOT c.transient AND EXCLUDED.transient THEN c.quota_kind
        WHEN EXCLUDED.until >= c.until OR (c.transient AND NOT EXCLUDED.transient) THEN EXCLUDED.quota_kind
        ELSE c.quota_kind END,
    quota_resets_at = CASE
        WHEN c.until <= EXCLUDED.written_at THEN EXCLUDED.quota_resets_at
        WHEN NOT c.transient AND EXCLUDED.transient THEN c.quota_resets_at
        WHEN EXCLUDED.until >= c.until OR (c.transient AND NOT EXCLUDED.transient) THEN EXCLUDED.quota_resets_at
        ELSE c.quota_resets_at END,
    quota_window_minutes = CASE
        WHEN c.until <= EXCLUDED.written_at THEN EXCLUDED.quota_window_minutes
        WHEN NOT c.transient AND EXCLUDED.transient THEN c.quota_window_minutes
        WHEN EXCLUDED.until >= c.until OR (c.transient AND NOT EXCLUDED.transient) THEN EXCLUDED.quota_window_minutes
        ELSE c.quota_window_minutes END,
    quota_message = CASE
        WHEN c.until <= EXCLUDED.written_at THEN EXCLUDED.quota_message
        WHEN NOT c.transient AND EXCLUDED.transient THEN c.quota_message
        WHEN EXCLUDED.until >= c.until OR (c.transient AND NOT EXCLUDED.transient) THEN EXCLUDED.quota_message
        ELSE c.quota_message END,
    transient = CASE
        WHEN c.until <= EXCLUDED.written_at THEN EXCLUDED.transient
        ELSE c.transient AND EXCLUDED.transient END,
    until = CASE
        WHEN c.until <= EXCLUDED.written_at THEN EXCLUDED.until
        WHEN NOT c.transient AND EXCLUDED.transient THEN c.until
        ELSE greatest(c.until, EXCLUDED.until) END,
    written_at = CASE
        WHEN c.until > EXCLUDED.written_at AND NOT c.transient AND EXCLUDED.transient THEN c.written_at
        ELSE EXCLUDED.written_at END
RETURNING *;

-- name: ClearCooldown :execrows
DELETE FROM cooldowns WHERE account_id = @account_id;

-- A new credential voids the verdict on the old one, not the account's
-- rate limits, which belong to the account whatever its credential.
-- name: ClearCredentialCooldown :execrows
DELETE FROM cooldowns WHERE account_id = @account_id AND reason = 'invalid_credential';

-- Clearing on quota evidence (a usage reading that shows a window
-- recovered) may only ever lift quota reasons (quota_exhausted), never
-- rate_limited: per-IP burst cooldowns are never released on account-quota
-- evidence, and out_of_credits is lifted by a success, not by a reading.

-- The run of transport failures a new one continues: the account's
-- cooldown, live or expired, when it was a transport failure's and no
-- success came since. Locked, as WriteCooldown that follows locks it, so
-- that concurrent failures of one account count apart.
-- name: TransportRun :one
SELECT c.* FROM cooldowns c
JOIN accounts a ON a.id = c.account_id
WHERE c.account_id = @account_id AND c.reason = 'transport'
  AND (a.last_success_at IS NULL OR a.last_success_at < c.written_at)
FOR UPDATE OF c;

-- Every account's run of transport failures with no success since (as
-- TransportRun reads one): what operators see as unreachable.
-- name: TransportRuns :many
SELECT c.* FROM cooldowns c
JOIN accounts a ON a.id = c.account_id
WHERE c.reason = 'transport'
  AND (a.last_success_at IS NULL OR a.last_success_at < c.written_at);

-- A new base URL voids the verdict on the old one's reachability.
-- name: ClearTransportCooldown :execrows
DELETE FROM cooldowns WHERE account_id = @account_id AND reason = 'transport';

-- A new default egress proxy voids the verdict on the reachability of
-- the accounts that go through it.
-- name: ClearDefaultEgressTransportCooldowns :execrows
DELETE FROM cooldowns c USING accounts a
WHERE c.account_id = a.id AND c.reason = 'transport' AND a.egress_proxy = '';
