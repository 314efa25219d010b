-- name: ClaimLease :one
SELECT weir_claim_lease(
    sqlc.arg(account_id), sqlc.arg(revision), sqlc.narg(key_id), sqlc.arg(request_id),
    sqlc.arg(model), sqlc.arg(session_key), sqlc.arg(now), sqlc.arg(expires_at)
)::uuid AS lease_id;

-- name: RenewLease :one
UPDATE leases SET expires_at = @expires_at
WHERE id = @id AND expires_at > @now
RETURNING expires_at;

-- name: ReleaseLease :one
DELETE FROM leases WHERE leases.id = @id
RETURNING account_id, key_id, model, credential_revision, acquired_at,
    (SELECT provider FROM accounts WHERE accounts.id = leases.account_id)::text AS provider,
    (SELECT auth_kind FROM accounts WHERE accounts.id = leases.account_id)::text AS auth_kind,
    (SELECT quota_backoffs FROM accounts WHERE accounts.id = leases.account_id)::integer AS quota_backoffs,
    (SELECT recovery_probe FROM accounts WHERE accounts.id = leases.account_id)::boolean AS recovery_probe;

-- A lease stops counting at expires_at; the row stays a while so a late
-- Release can still report its outcome.
-- name: DeleteLeasesExpiredBefore :execrows
DELETE FROM leases WHERE expires_at < @before;

-- name: SessionAccount :one
SELECT account_id FROM session_bindings
WHERE session_key = @session_key AND last_seen_at > @since;

-- name: DeleteSessionsIdleSince :execrows
DELETE FROM session_bindings WHERE last_seen_at < @since;
