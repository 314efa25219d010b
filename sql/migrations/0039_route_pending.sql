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
-- lease TTL: the reaper deletes those past. After an outage the lease
-- clock keeps the live ones open as it does leases
-- (sql/functions/weir_lease_clock.sql).
CREATE TABLE route_pending (
    request_id text PRIMARY KEY,
    until      timestamptz NOT NULL
) WITH (fillfactor = 50);
