-- Key rotation ('weir secrets rotate', controlplane/reseal.go).

-- Locks the accounts about to be re-sealed, so a token refresh or an
-- operator's credential change waits for the rotation's transaction (or
-- the rotation for theirs) and nothing sealed in between is overwritten.
-- name: LockSealedCredentials :many
SELECT id, label, credential_revision, credential_sealed, refresh_sealed, egress_proxy_sealed
FROM accounts
WHERE id = ANY(@ids::uuid[])
ORDER BY id
FOR UPDATE;

-- Writes re-sealed credentials over the revision they were sealed for.
-- The revision stays: the plaintext is the same, so usage epochs and
-- refresh claims are untouched.
-- name: ResealCredentials :execrows
UPDATE accounts a SET
    credential_sealed = r.credential_sealed,
    refresh_sealed = r.refresh_sealed,
    egress_proxy_sealed = r.egress_proxy_sealed
FROM ROWS FROM (
    unnest(@ids::uuid[]), unnest(@revisions::bigint[]),
    unnest(@credential_sealed::bytea[]), unnest(@refresh_sealed::bytea[]),
    unnest(@egress_proxy_sealed::bytea[])
) AS r(id, revision, credential_sealed, refresh_sealed, egress_proxy_sealed)
WHERE a.id = r.id AND a.credential_revision = r.revision;
