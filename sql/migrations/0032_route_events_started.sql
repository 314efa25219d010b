-- The dashboard's requests page lists route events by start time, a page
-- at a time (keyset on started_at, id), and counts the failed attempts of
-- a time range by start time.
CREATE INDEX route_events_started_idx ON route_events (started_at DESC, id DESC);
