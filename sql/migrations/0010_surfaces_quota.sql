-- OpenAI-side accounts, the quota evidence behind cooldowns, and the audit
-- of setting changes.

-- Codex accounts send the ChatGPT account id with every request. It is not
-- a secret; it names the upstream identity (and finds duplicates).
ALTER TABLE accounts ADD COLUMN upstream_account_id text NOT NULL DEFAULT '';

-- The quota evidence that justified a cooldown's deadline: kept with the
-- cooldown it justified (it survives restarts, and goes when the cooldown
-- goes). NULL kind: the cooldown is not a quota's. quota_resets_at is the
-- reset the evidence names; it covers the cooldown when it is not before
-- its deadline.
ALTER TABLE cooldowns
    ADD COLUMN quota_kind            text,
    ADD COLUMN quota_resets_at       timestamptz,
    ADD COLUMN quota_window_minutes  integer NOT NULL DEFAULT 0,
    ADD COLUMN quota_message         text NOT NULL DEFAULT '';

-- Every change of a runtime setting: who, what, when.
CREATE TABLE setting_changes (
    id          bigserial PRIMARY KEY,
    name        text NOT NULL,
    old_value   text NOT NULL,
    new_value   text NOT NULL,
    actor       text NOT NULL,
    changed_at  timestamptz NOT NULL
);
CREATE INDEX setting_changes_changed_at ON setting_changes (changed_at DESC);
