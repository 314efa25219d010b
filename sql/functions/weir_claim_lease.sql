-- weir_claim_lease leases one account if it is still eligible, still on the
-- credential revision the caller read, and under its concurrency cap; it
-- binds the session to the account and returns the lease id, or NULL when the
-- account cannot be claimed.
--
-- Locking the account row first serialises claims on one account across
-- every control-plane replica; each statement below then takes a fresh
-- snapshot, so the live-lease count sees every lease an earlier claim
-- committed. Expired leases do not count, so a dead worker's lease stops
-- blocking the account the moment it expires. A recovery probe's account
-- takes one lease at a time. A seat (an account with an owner) goes to
-- another key only while owned_accounts is not owners_only; a key owns
-- what is owned by it or by its team. The owner is read under the row
-- lock, which an owner change takes too, so a routing view read before
-- the change (or before the setting's) cannot hand a seat over. The lease
-- clock (weir_lease_clock) is caught up first: an Acquire can be the first
-- call after an outage, and the leases that were live when it began must
-- hold their places before anything is counted.
--
-- This file is the function's one definition. internal/migrate applies it
-- after the numbered migrations whenever its text changes; edit it here and
-- never redefine it in a migration (TestFunctionsNotRedefined).
CREATE OR REPLACE FUNCTION weir_claim_lease(
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
    IF weir_lease_clock_due(p_now, (p_expires_at - p_now) / 3) THEN
        PERFORM weir_lease_clock(p_now, (p_expires_at - p_now) / 3, p_expires_at - p_now);
    END IF;

    SELECT CASE WHEN a.recovery_probe THEN 1 ELSE a.max_concurrency END INTO v_cap
      FROM accounts a
     WHERE a.id = p_account_id
       AND a.credential_revision = p_revision
       AND NOT a.paused
       AND a.broken_at IS NULL
       AND NOT EXISTS (SELECT 1 FROM cooldowns c WHERE c.account_id = a.id AND c.until > p_now)
       AND ((a.owner_key_id IS NULL AND a.owner_team_id IS NULL)
            OR a.owner_key_id = p_key_id
            OR a.owner_team_id = (SELECT k.team_id FROM client_keys k WHERE k.id = p_key_id)
            OR coalesce((SELECT s.value FROM settings s WHERE s.name = 'owned_accounts'), 'shared') <> 'owners_only')
       FOR NO KEY UPDATE;
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

