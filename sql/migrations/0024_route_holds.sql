-- A request held now is seen while it waits: its worker reports the hold
-- as it goes on (since when, why, the next try), and a pending event may
-- replace the pending event before it. A failed request says why weir
-- gave up, in one line (verdict).
ALTER TABLE route_events
    ADD COLUMN held_since  timestamptz,
    ADD COLUMN hold_reason text NOT NULL DEFAULT '',
    ADD COLUMN next_try_at timestamptz,
    ADD COLUMN verdict     text NOT NULL DEFAULT '';

-- The requests held now (weir status, weir routes --held): few rows of a
-- large table, found without reading the rest.
CREATE INDEX route_events_held ON route_events (id) WHERE pending_until IS NOT NULL AND held_since IS NOT NULL;
