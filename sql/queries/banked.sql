-- Banked resets: grants as last read, and the claim ledger.

-- name: DeleteResetGrants :exec
DELETE FROM reset_grants WHERE account_id = @account_id;

-- name: UpsertResetGrant :exec
INSERT INTO reset_grants (account_id, grant_id, program, expires_at, status, seen_at)
VALUES (@account_id, @grant_id, @program, sqlc.narg('expires_at'), @status, @seen_at)
ON CONFLICT (account_id, grant_id) DO UPDATE SET
    program = excluded.program, expires_at = excluded.expires_at,
    status = excluded.status, seen_at = excluded.seen_at;

-- name: ListResetGrants :many
SELECT * FROM reset_grants WHERE account_id = @account_id
ORDER BY expires_at NULLS LAST, grant_id;

-- name: BankedResetAccounts :many
SELECT id FROM accounts
WHERE banked_resets_enabled AND auth_kind = 'oauth'
ORDER BY id;

-- name: PendingResetClaim :one
SELECT * FROM reset_claims WHERE account_id = @account_id AND status = 'pending';

-- name: LastResetClaimAt :one
SELECT created_at FROM reset_claims
WHERE account_id = @account_id
ORDER BY created_at DESC LIMIT 1;

-- Writes a pending claim unless the account had one within the hour (the
-- once-an-hour rule, held by the database across replicas; the unique
-- pending index holds two concurrent writers apart). No row: refused.
-- name: InsertResetClaim :one
INSERT INTO reset_claims (account_id, grant_id, program, request_id, status, created_at)
SELECT @account_id, @grant_id, @program, @request_id, 'pending', sqlc.arg(now)::timestamptz
WHERE NOT EXISTS (
    SELECT 1 FROM reset_claims
    WHERE account_id = @account_id AND created_at > sqlc.arg(now)::timestamptz - interval '1 hour'
)
RETURNING *;

-- name: FinishResetClaim :execrows
UPDATE reset_claims SET status = @status, result = @result, finished_at = @now::timestamptz
WHERE id = @id AND status = 'pending';

-- name: MarkResetGrantUsed :exec
UPDATE reset_grants SET status = 'used' WHERE account_id = @account_id AND grant_id = @grant_id;

-- A reset landed for the account between since and until: the reading
-- that follows may show the same weekly window emptied.
-- name: ResetLandedBetween :one
SELECT EXISTS (
    SELECT 1 FROM reset_claims
    WHERE account_id = @account_id AND status = 'done' AND result = 'reset'
      AND finished_at >= @since::timestamptz AND finished_at <= @until::timestamptz
) AS landed;

-- name: SetBankedResets :one
UPDATE accounts SET
    banked_resets_enabled = coalesce(sqlc.narg('enabled'), banked_resets_enabled),
    org_id = coalesce(sqlc.narg('org_id'), org_id)
WHERE id = @id
RETURNING *;

-- name: ListResetClaims :many
SELECT * FROM reset_claims WHERE account_id = @account_id
ORDER BY created_at DESC LIMIT 20;
