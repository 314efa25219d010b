-- Dashboard sessions, server-side so signing out ends one for good: a
-- copied cookie stops working the moment its session is revoked. The
-- cookie holds a random id; only its SHA-256 is stored, so reading this
-- table yields no usable cookie. person is the signed-in email (an OpenID
-- Connect sign-in) or '' (the admin token); the role is decided on each
-- request from the configured mapping, not stored, so taking someone out
-- of the mapping ends their access at once.
CREATE TABLE dashboard_sessions (
    id_hash    bytea PRIMARY KEY,
    person     text NOT NULL,
    credential text NOT NULL CHECK (credential IN ('admin_token', 'oidc')),
    created_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    revoked_at timestamptz
);

CREATE INDEX dashboard_sessions_expires_at ON dashboard_sessions (expires_at);
