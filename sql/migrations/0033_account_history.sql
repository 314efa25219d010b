-- What each account has been through: every cooldown and family gate
-- written, with the evidence that decided it (a cooldown row keeps only
-- the live one, merged). The dashboard's account page reads it; the
-- retention job deletes what is older than route_events_retention.
CREATE TABLE account_history (
    id          bigserial PRIMARY KEY,
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    at          timestamptz NOT NULL,
    -- cooldown or gate.
    kind        text NOT NULL CHECK (kind IN ('cooldown', 'gate')),
    -- A cooldown's reason (rate_limited, quota_exhausted, …), or the gated
    -- model family.
    reason      text NOT NULL,
    until       timestamptz NOT NULL,
    evidence    jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX account_history_account_idx ON account_history (account_id, at DESC);
CREATE INDEX account_history_at_idx ON account_history (at);
