-- OAuth credentials with refresh. credential_sealed keeps the access token
-- (the lease path reads it as before); the refresh token is sealed apart,
-- under its own associated-data prefix, bound to the same account and
-- revision. A refresh writes the new access token, refresh token and
-- expiry in one compare-and-set on credential_revision (revision + 1), so
-- the 0004 trigger starts a new usage poll epoch.
ALTER TABLE accounts
    -- AES-256-GCM sealed refresh token; NULL: the credential cannot be
    -- refreshed (an API key, or a bare OAuth access token).
    ADD COLUMN refresh_sealed bytea,
    -- When the access token expires; NULL: unknown (never refreshed).
    ADD COLUMN access_expires_at timestamptz,
    -- A replica claimed the refresh until then: refresh tokens rotate on
    -- use, so at most one refresh is in flight per account, whichever
    -- replica runs it. An expired claim is free again.
    ADD COLUMN refreshing_until timestamptz,
    -- Consecutive transient refresh failures, and no refresh before
    -- refresh_blocked_until (the backoff). Reset by a refresh or a new
    -- credential.
    ADD COLUMN refresh_failures integer NOT NULL DEFAULT 0,
    ADD COLUMN refresh_blocked_until timestamptz,
    -- When the token endpoint rejected the refresh token (the account is
    -- broken for it). An account broken for other reasons (an expired
    -- access token's 401s) is still refreshed once its token has expired,
    -- and a refresh that lands mends it.
    ADD COLUMN refresh_rejected_at timestamptz;

CREATE INDEX accounts_access_expires_at_idx ON accounts (access_expires_at)
    WHERE refresh_sealed IS NOT NULL;
