-- Runtime settings, the shared overload breakers, and what route events
-- record of holds and attempts.

CREATE TABLE settings (
    name        text PRIMARY KEY,
    value       text NOT NULL,
    updated_at  timestamptz NOT NULL
);

-- One breaker per provider and model family, shared by every worker: when
-- the provider keeps answering "overloaded", it lets one probe through at a
-- time instead of every worker's retries.
CREATE TABLE overload_breakers (
    provider      text NOT NULL,
    family        text NOT NULL,
    -- Overload answers in the current window.
    overloads     integer NOT NULL DEFAULT 0,
    window_start  timestamptz NOT NULL,
    -- Set while open: no probe before open_until.
    open_until    timestamptz,
    -- How often it opened in a row; sets the next open interval.
    open_count    integer NOT NULL DEFAULT 0,
    -- A probe holds the breaker until it reports back (or this passes).
    probe_until   timestamptz,
    updated_at    timestamptz NOT NULL,
    PRIMARY KEY (provider, family)
);

ALTER TABLE route_events
    ADD COLUMN held_ms        double precision NOT NULL DEFAULT 0,
    ADD COLUMN hold_count     integer NOT NULL DEFAULT 0,
    ADD COLUMN failure_stage  text NOT NULL DEFAULT '',
    ADD COLUMN attempts_json  jsonb NOT NULL DEFAULT '[]';
CREATE INDEX route_events_request_id_idx ON route_events (request_id);
