-- weir's schema. River's tables are migrated separately by River's migrator.

CREATE TABLE accounts (
    id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    provider              text NOT NULL,
    auth_kind             text NOT NULL,
    label                 text NOT NULL UNIQUE,
    base_url              text NOT NULL DEFAULT '',
    max_concurrency       integer NOT NULL CHECK (max_concurrency > 0),
    priority              integer NOT NULL DEFAULT 0,
    paused                boolean NOT NULL DEFAULT false,
    -- Set when repeated credential rejections took the account out of routing.
    broken_reason         text,
    broken_at             timestamptz,
    -- Consecutive credential rejections; reset by a success or a new credential.
    auth_failures         integer NOT NULL DEFAULT 0,
    -- AES-256-GCM sealed credential; the associated data binds id and revision.
    credential_sealed     bytea NOT NULL,
    credential_revision   bigint NOT NULL DEFAULT 1,
    credential_hint       text NOT NULL,
    last_used_at          timestamptz,
    last_success_at       timestamptz,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL
);

-- One live-or-expired cooldown per account; an expired row is inert.
CREATE TABLE cooldowns (
    account_id   uuid PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
    reason       text NOT NULL,
    transient    boolean NOT NULL,
    until        timestamptz NOT NULL,
    written_at   timestamptz NOT NULL,
    evidence     jsonb NOT NULL
);

CREATE TABLE client_keys (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name          text NOT NULL UNIQUE,
    -- Hex SHA-256 of the secret. Keys are 256-bit random, so a fast hash is enough.
    key_hash      text NOT NULL UNIQUE,
    prefix        text NOT NULL,
    created_at    timestamptz NOT NULL,
    revoked_at    timestamptz,
    last_used_at  timestamptz
);

CREATE TABLE leases (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id    uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    key_id        uuid REFERENCES client_keys (id) ON DELETE SET NULL,
    request_id    text NOT NULL,
    model         text NOT NULL,
    -- The credential revision the lease was granted under: a rejection of an
    -- old credential must not count against its replacement.
    credential_revision bigint NOT NULL,
    acquired_at   timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL
);
CREATE INDEX leases_account_id_idx ON leases (account_id);
CREATE INDEX leases_expires_at_idx ON leases (expires_at);

CREATE TABLE session_bindings (
    session_key   text PRIMARY KEY,
    account_id    uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    bound_at      timestamptz NOT NULL,
    last_seen_at  timestamptz NOT NULL
);
CREATE INDEX session_bindings_last_seen_at_idx ON session_bindings (last_seen_at);

CREATE TABLE route_events (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    request_id     text NOT NULL,
    key_id         uuid REFERENCES client_keys (id) ON DELETE SET NULL,
    account_id     uuid REFERENCES accounts (id) ON DELETE SET NULL,
    surface        text NOT NULL,
    model          text NOT NULL,
    stream         boolean NOT NULL,
    status         integer NOT NULL,
    error_type     text NOT NULL,
    attempts       integer NOT NULL,
    duration_ms    double precision NOT NULL,
    ttfb_ms        double precision,
    input_tokens   bigint NOT NULL,
    output_tokens  bigint NOT NULL,
    started_at     timestamptz NOT NULL,
    recorded_at    timestamptz NOT NULL
);
CREATE INDEX route_events_recorded_at_idx ON route_events (recorded_at DESC);
CREATE INDEX route_events_account_id_idx ON route_events (account_id, recorded_at DESC);

-- weir_claim_lease leases one account if it is still eligible, still on the
-- credential revision the caller read, and under its concurrency cap; it
-- binds the session to the account and returns the lease id, or NULL when the
-- account cannot be claimed. Locking the account row first serialises claims
-- on one account across every control-plane replica; each statement below
-- then takes a fresh snapshot, so the live-lease count sees every lease an
-- earlier claim committed. Expired leases do not count, so a dead worker's
-- lease stops blocking the account the moment it expires.
CREATE FUNCTION weir_claim_lease(
    p_account_id   uuid,
    p_revision     bigint,
    p_key_id       uuid,
    p_request_id   text,
    p_model        text,
    p_session_key  text,
    p_now          timestamptz,
    p_expires_at   timestamptz
) RETURNS uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_cap    integer;
    v_live   integer;
    v_lease  uuid;
BEGIN
    SELECT a.max_concurrency INTO v_cap
      FROM accounts a
     WHERE a.id = p_account_id
       AND a.credential_revision = p_revision
       AND NOT a.paused
       AND a.broken_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM cooldowns c WHERE c.account_id = a.id AND c.until > p_now)
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;

    SELECT count(*) INTO v_live FROM leases l WHERE l.account_id = p_account_id AND l.expires_at > p_now;
    IF v_live >= v_cap THEN
        RETURN NULL;
    END IF;

    INSERT INTO leases (account_id, key_id, request_id, model, credential_revision, acquired_at, expires_at)
    VALUES (p_account_id, p_key_id, p_request_id, p_model, p_revision, p_now, p_expires_at)
    RETURNING id INTO v_lease;

    UPDATE accounts SET last_used_at = p_now WHERE id = p_account_id;

    IF p_session_key <> '' THEN
        INSERT INTO session_bindings (session_key, account_id, bound_at, last_seen_at)
        VALUES (p_session_key, p_account_id, p_now, p_now)
        ON CONFLICT (session_key) DO UPDATE
           SET account_id = EXCLUDED.account_id,
               bound_at = CASE WHEN session_bindings.account_id = EXCLUDED.account_id
                               THEN session_bindings.bound_at ELSE EXCLUDED.bound_at END,
               last_seen_at = EXCLUDED.last_seen_at;
    END IF;

    RETURN v_lease;
END;
$$;
