-- The integrity check (jobs/integrity.go): what it repairs, what it only
-- reports, and its reports. Every repair is a compare-and-set on the
-- condition that found it, so a row that changed meanwhile is left alone.

-- Cooldowns whose evidence is missing (JSON null, {}, [], or no class):
-- the deadline and reason stay (a deadline is never shortened), the
-- evidence says it was unknown and repaired.
-- name: RepairCooldownsWithoutEvidence :execrows
UPDATE cooldowns
SET evidence = '{"class":"unknown","repaired_by":"integrity"}'::jsonb
WHERE coalesce(evidence ->> 'class', '') = '';

-- Leases expired before @before (past the reaper's grace and then some):
-- the reaper is behind or failing. Expired leases never count, so
-- deleting them is safe.
-- name: DeleteStaleLeases :execrows
DELETE FROM leases WHERE expires_at < @before::timestamptz;

-- Refresh claims that ended before @before: the replica that held the
-- claim died or hung. An ended claim is already free to take; clearing
-- it keeps the row honest.
-- name: ClearStuckRefreshClaims :execrows
UPDATE accounts SET refreshing_until = NULL
WHERE refreshing_until < @before::timestamptz;

-- Starts the clock on recovery probes pending with no live lease and no
-- live cooldown (the account could take its probe and nothing is using it).
-- name: MarkIdleRecoveryProbes :execrows
UPDATE accounts a SET recovery_probe_seen_at = @now::timestamptz
WHERE a.recovery_probe
  AND a.recovery_probe_seen_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.account_id = a.id AND l.expires_at > @now::timestamptz)
  AND NOT EXISTS (SELECT 1 FROM cooldowns c WHERE c.account_id = a.id AND c.until > @now::timestamptz);

-- Forgets the clock of probes that were leased since it started (a probe
-- that failed and cooled again is not stuck, it is still probing), are in
-- flight, or wait on a cooldown.
-- name: UnmarkBusyRecoveryProbes :execrows
UPDATE accounts a SET recovery_probe_seen_at = NULL
WHERE a.recovery_probe_seen_at IS NOT NULL
  AND (a.last_used_at > a.recovery_probe_seen_at
    OR EXISTS (SELECT 1 FROM leases l WHERE l.account_id = a.id AND l.expires_at > @now::timestamptz)
    OR EXISTS (SELECT 1 FROM cooldowns c WHERE c.account_id = a.id AND c.until > @now::timestamptz));

-- Clears recovery probes seen idle since before @before, with still no
-- lease claimed since, none live and no live cooldown.
-- name: ClearStuckRecoveryProbes :execrows
UPDATE accounts a SET recovery_probe = false
WHERE a.recovery_probe
  AND a.recovery_probe_seen_at < @before::timestamptz
  AND (a.last_used_at IS NULL OR a.last_used_at <= a.recovery_probe_seen_at)
  AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.account_id = a.id AND l.expires_at > @now::timestamptz)
  AND NOT EXISTS (SELECT 1 FROM cooldowns c WHERE c.account_id = a.id AND c.until > @now::timestamptz);

-- name: DeleteFamilyGatesExpiredBefore :execrows
DELETE FROM family_gates WHERE until < @before::timestamptz;

-- name: DeleteCooldownsExpiredBefore :execrows
DELETE FROM cooldowns WHERE until < @before::timestamptz;

-- name: BrokenAccounts :many
SELECT id, label, coalesce(broken_reason, '')::text AS reason
FROM accounts WHERE broken_at IS NOT NULL
ORDER BY label;

-- Every sealed credential, for the control plane to check it opens.
-- name: SealedCredentials :many
SELECT id, label, credential_revision, credential_sealed, refresh_sealed, egress_proxy_sealed
FROM accounts ORDER BY label;

-- Marks broken, with @reason, the accounts whose credential a replica
-- cannot open, each at the revision it read: a credential re-entered or
-- refreshed meanwhile is left alone, as is an account already broken for
-- another reason (controlplane/credcheck.go).
-- name: MarkCredentialsUnreadable :many
UPDATE accounts a SET broken_at = @now::timestamptz, broken_reason = @reason::text
FROM ROWS FROM (unnest(@ids::uuid[]), unnest(@revisions::bigint[])) AS r(id, revision)
WHERE a.id = r.id AND a.credential_revision = r.revision AND a.broken_at IS NULL
RETURNING a.label;

-- Clears the mark above from the accounts whose credential a replica
-- opens, at the revision it opened: another replica lacked the key.
-- name: MendCredentialsReadable :many
UPDATE accounts a SET broken_at = NULL, broken_reason = NULL
FROM ROWS FROM (unnest(@ids::uuid[]), unnest(@revisions::bigint[])) AS r(id, revision)
WHERE a.id = r.id AND a.credential_revision = r.revision AND starts_with(a.broken_reason, @kind::text)
RETURNING a.label;

-- name: InsertIntegrityReport :one
INSERT INTO integrity_reports (ran_at, findings) VALUES (@ran_at, @findings)
RETURNING id;

-- Keeps the last @keep reports.
-- name: PruneIntegrityReports :execrows
DELETE FROM integrity_reports
WHERE id <= (SELECT id FROM integrity_reports ORDER BY id DESC OFFSET @keep::integer LIMIT 1);

-- name: LastIntegrityReport :one
SELECT * FROM integrity_reports ORDER BY id DESC LIMIT 1;
