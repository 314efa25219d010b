-- weir_lease_clock moves the clock to p_now. After a gap longer than
-- p_gap it first renews, until p_now + p_ttl, every lease that was live
-- when the clock last moved, and keeps open the pending route events that
-- were open then, by their own pending_until or by their last renewal
-- (route_pending, 0039_route_pending.sql). Returns how many leases that
-- renewed. The lease clock itself is 0021_lease_clock.sql.
--
-- This file is the function's one definition. internal/migrate applies it
-- after the numbered migrations whenever its text changes; edit it here and
-- never redefine it in a migration (TestFunctionsNotRedefined).
CREATE OR REPLACE FUNCTION weir_lease_clock(p_now timestamptz, p_gap interval, p_ttl interval) RETURNS bigint
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
        UPDATE route_pending SET until = p_now + p_ttl
         WHERE until > v_alive AND until < p_now + p_ttl;
    END IF;
    -- Replicas' clocks differ a little: the clock never moves back.
    UPDATE lease_clock SET alive_at = greatest(alive_at, p_now);
    RETURN v_n;
END;
$$;
