-- A request in progress keeps its pending route event open by its
-- worker's renewals (every lease renewal, a third of the lease TTL).
-- Renewing moved the event's pending_until, an indexed column: every
-- renewal wrote a new version of the whole row and of every one of its
-- indexes' entries, as much as storing the event again (31–50 µs a row
-- with 5,000 requests in progress and 34 day partitions), several times
-- over an agent's turn of a minute. A renewal now moves the request's
-- row here instead: a small table, its until in no index, so that the
-- update stays on its page (HOT). The event's own pending_until stays
-- what its last report set; the request is open until the later of the
-- two (CloseLostRequests). A row here outlives its request by at most a
-- lease TTL: the reaper deletes those past.
CREATE TABLE route_pending (
    request_id text PRIMARY KEY,
    until      timestamptz NOT NULL
) WITH (fillfactor = 50);

-- weir_lease_clock as before (0021_lease_clock.sql), and after a gap it
-- keeps open the renewals that were live when the clock last moved, as it
-- does the events' own pending_until.
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
