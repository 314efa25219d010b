-- The lease clock: leases do not age while nobody can renew them.
--
-- A lease counts against its account's cap until it is released or goes
-- unrenewed past expires_at. When every control plane is down, or their
-- Postgres is, no worker can renew anything: the leases of streams still
-- running would lapse, and the first Acquire after the outage would grant
-- their places again, over the cap. So every control plane touches the
-- clock (alive_at) every second, and whoever finds it untouched for
-- longer than a third of the lease TTL (the time a live lease can go
-- unrenewed before it is at risk) knows that renewals could not reach
-- Postgres meanwhile: every lease that had not lapsed when the clock last
-- moved is renewed as of now, once, giving its worker a whole TTL to
-- renew it for real. A lease its worker no longer renews (the worker died
-- in the outage) lapses one TTL later.
--
-- The check runs in the heartbeat, in weir_claim_lease (an Acquire may
-- come before the first heartbeat after an outage) and in
-- weir_renew_leases; the reaper runs it before it reaps.
--
-- Pending route events keep their requests' records open the same way
-- (see below).
CREATE TABLE lease_clock (
    only_row  boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    alive_at  timestamptz NOT NULL
);
INSERT INTO lease_clock (alive_at) VALUES (now());

-- Every request recorded once, under the id its client got, even when its
-- worker dies. A worker records a request when it is first held or leased
-- (a pending event: pending_until set, error_type 'in_progress') and keeps
-- it open with its lease renewals (RenewBatch request_ids). The request's
-- final event replaces it; the reaper closes one left unrenewed past
-- pending_until as 'worker_lost'. A final event arriving after that (its
-- worker was cut off, not dead) replaces the 'worker_lost' record too.
ALTER TABLE route_events ADD COLUMN pending_until timestamptz;
CREATE INDEX route_events_pending_idx ON route_events (pending_until) WHERE pending_until IS NOT NULL;

-- weir_lease_clock moves the clock to p_now. After a gap longer than
-- p_gap it first renews, until p_now + p_ttl, every lease that was live
-- when the clock last moved, and keeps open the pending route events that
-- were open then. Returns how many leases that renewed.
CREATE FUNCTION weir_lease_clock(p_now timestamptz, p_gap interval, p_ttl interval) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_alive  timestamptz;
    v_n      bigint := 0;
BEGIN
    SELECT alive_at INTO v_alive FROM lease_clock FOR UPDATE;
    IF p_now - v_alive > p_gap THEN
        UPDATE leases SET expires_at = p_now + p_ttl
         WHERE expires_at > v_alive AND expires_at < p_now + p_ttl;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        UPDATE route_events SET pending_until = p_now + p_ttl
         WHERE pending_until > v_alive AND pending_until < p_now + p_ttl;
    END IF;
    -- Replicas' clocks differ a little: the clock never moves back.
    UPDATE lease_clock SET alive_at = greatest(alive_at, p_now);
    RETURN v_n;
END;
$$;

-- weir_lease_clock_due is the cheap question asked before every claim and
-- renewal: has the clock gone untouched for longer than p_gap?
CREATE FUNCTION weir_lease_clock_due(p_now timestamptz, p_gap interval) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_now - alive_at > p_gap FROM lease_clock
$$;

-- weir_claim_lease as in 0014_claim_key_share.sql, with the lease clock
-- caught up first.
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

-- weir_renew_leases renews the given leases until p_expires_at and
-- returns the ids it renewed. A live lease is always renewed. A lapsed
-- one (its worker was cut off from every control plane for longer than
-- its TTL while the others went on) is renewed only while its account
-- has room for it beside the live leases: otherwise its place was granted
-- again meanwhile, and its worker, told so by the id's absence, ends the
-- request. A lease already reaped is not renewed.
CREATE FUNCTION weir_renew_leases(p_ids uuid[], p_now timestamptz, p_expires_at timestamptz) RETURNS SETOF uuid
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_id       uuid;
    v_account  uuid;
    v_cap      integer;
    v_live     integer;
BEGIN
    IF weir_lease_clock_due(p_now, (p_expires_at - p_now) / 3) THEN
        PERFORM weir_lease_clock(p_now, (p_expires_at - p_now) / 3, p_expires_at - p_now);
    END IF;

    RETURN QUERY
        UPDATE leases SET expires_at = p_expires_at
         WHERE id = ANY(p_ids) AND expires_at > p_now
        RETURNING id;

    -- Lapsed leases, one account at a time in id order (as claims lock
    -- them), each under the account's row lock so that the cap holds
    -- against concurrent claims.
    FOR v_id, v_account IN
        SELECT l.id, l.account_id FROM leases l
         WHERE l.id = ANY(p_ids) AND l.expires_at <= p_now
         ORDER BY l.account_id, l.id
    LOOP
        SELECT CASE WHEN a.recovery_probe THEN 1 ELSE a.max_concurrency END INTO v_cap
          FROM accounts a WHERE a.id = v_account FOR NO KEY UPDATE;
        SELECT count(*) INTO v_live FROM leases l WHERE l.account_id = v_account AND l.expires_at > p_now;
        IF v_live < v_cap THEN
            UPDATE leases SET expires_at = p_expires_at WHERE id = v_id;
            RETURN NEXT v_id;
        END IF;
    END LOOP;
END;
$$;
