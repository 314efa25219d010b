-- Merges a cooldown into the account's row. A live deadline is never
-- shortened (the later deadline wins), and a live non-transient cooldown
-- (a rejected credential) is not replaced by a transient one. An expired
-- row is simply replaced. Returns the cooldown in force afterwards.
-- name: WriteCooldown :one
INSERT INTO cooldowns AS c (account_id, reason, transient, until, written_at, evidence)
VALUES (@account_id, @reason, @transient, @until, @now, @evidence)
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

-- A success clears an out-of-credits cooldown, but only the success of a
-- request admitted after the cooldown was written: one already in flight
-- when the credits ran out says nothing about them now.
-- name: ClearOutOfCreditsCooldown :execrows
DELETE FROM cooldowns
WHERE account_id = @account_id AND reason = 'out_of_credits' AND written_at < @admitted_at;

-- Clearing on quota evidence (a usage reading that shows a window
-- recovered) may only ever lift quota reasons (quota_exhausted), never
-- rate_limited: per-IP burst cooldowns are never released on account-quota
-- evidence, and out_of_credits is lifted by a success, not by a reading.
