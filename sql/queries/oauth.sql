-- OAuth token refresh (see controlplane/oauth.go). Refresh tokens rotate
-- on use: every write is a compare-and-set on credential_revision, and a
-- refresh is claimed first so that one replica at a time calls the token
-- endpoint for an account.

-- Sets the refresh half of the credential written at revision
-- credential_revision (by CreateAccount or ReplaceCredential, in the same
-- transaction), and forgets any refresh state of the previous credential.
-- name: SetOAuthTokens :one
UPDATE accounts SET
    refresh_sealed = @refresh_sealed,
    access_expires_at = sqlc.narg('access_expires_at'),
    refreshing_until = NULL,
    refresh_failures = 0,
    refresh_blocked_until = NULL,
    refresh_rejected_at = NULL
WHERE id = @id AND credential_revision = @credential_revision
RETURNING *;

-- The OAuth accounts whose access token expires before @before (or has
-- expired), that can be refreshed and that nobody is refreshing or backing
-- off: soonest expiry first. A broken account is among them only when its
-- token has expired and the token endpoint never rejected its refresh
-- token: its 401s were most likely the expiry.
-- name: DueTokenRefreshes :many
SELECT id, credential_revision FROM accounts
WHERE auth_kind = 'oauth'
  AND refresh_sealed IS NOT NULL
  AND (broken_at IS NULL OR (refresh_rejected_at IS NULL AND access_expires_at <= @now::timestamptz))
  AND access_expires_at < @before::timestamptz
  AND (refreshing_until IS NULL OR refreshing_until <= @now::timestamptz)
  AND (refresh_blocked_until IS NULL OR refresh_blocked_until <= @now::timestamptz)
ORDER BY access_expires_at
LIMIT @max_accounts::integer;

-- Claims the refresh of one credential revision until @until: no row when
-- the credential changed, another replica holds the claim, or the account
-- stopped being refreshable.
-- name: ClaimTokenRefresh :one
UPDATE accounts SET refreshing_until = @until::timestamptz
WHERE id = @id
  AND credential_revision = @credential_revision
  AND auth_kind = 'oauth'
  AND refresh_sealed IS NOT NULL
  AND (broken_at IS NULL OR (refresh_rejected_at IS NULL AND access_expires_at <= @now::timestamptz))
  AND (refreshing_until IS NULL OR refreshing_until <= @now::timestamptz)
  AND (refresh_blocked_until IS NULL OR refresh_blocked_until <= @now::timestamptz)
RETURNING *;

-- Writes a refreshed credential: the new access token, refresh token and
-- expiry at revision @credential_revision + 1, only over the revision the
-- refresh was claimed for. A new credential owes nothing to the old one's
-- rejections: an account broken by them (an expired token's 401s) is mended.
-- name: StoreRefreshedTokens :one
UPDATE accounts SET
    credential_sealed = @credential_sealed,
    refresh_sealed = @refresh_sealed,
    credential_revision = credential_revision + 1,
    credential_hint = @credential_hint,
    access_expires_at = sqlc.narg('access_expires_at'),
    refreshing_until = NULL,
    refresh_failures = 0,
    refresh_blocked_until = NULL,
    auth_failures = 0,
    broken_at = NULL,
    broken_reason = NULL,
    updated_at = @now
WHERE id = @id AND credential_revision = @credential_revision
RETURNING *;

-- A transient refresh failure: the claim ends and the next try waits.
-- name: RecordRefreshFailure :one
UPDATE accounts SET
    refreshing_until = NULL,
    refresh_failures = refresh_failures + 1,
    refresh_blocked_until = @blocked_until::timestamptz
WHERE id = @id AND credential_revision = @credential_revision
RETURNING refresh_failures;

-- The token endpoint rejected the refresh token: the account is broken
-- with the reason, until an operator enters a new credential or resumes it.
-- name: RecordRefreshRejected :execrows
UPDATE accounts SET
    refreshing_until = NULL,
    refresh_rejected_at = @now::timestamptz,
    broken_at = coalesce(broken_at, @now::timestamptz),
    broken_reason = @reason::text,
    updated_at = @now::timestamptz
WHERE id = @id AND credential_revision = @credential_revision;

-- Gives a claim back without a verdict (our own shutdown).
-- name: ReleaseTokenRefresh :exec
UPDATE accounts SET refreshing_until = NULL
WHERE id = @id AND credential_revision = @credential_revision;
