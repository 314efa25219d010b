-- Metered accounts (pay-per-token: API keys) against subscriptions (OAuth
-- logins): how routing may spend them, and the record of every spill.

-- A key's own metered_accounts setting: normal, last_resort or never; NULL
-- follows the global setting (the settings row metered_accounts, itself
-- normal when absent).
ALTER TABLE client_keys
    ADD COLUMN metered_accounts text CHECK (metered_accounts IN ('normal', 'last_resort', 'never'));

-- A change reaches every worker like the key's other restrictions.
DROP TRIGGER client_keys_notify_pool_limits ON client_keys;
CREATE TRIGGER client_keys_notify_pool_limits
    AFTER UPDATE ON client_keys
    FOR EACH ROW
    WHEN (OLD.allowed_models IS DISTINCT FROM NEW.allowed_models
       OR OLD.pinned IS DISTINCT FROM NEW.pinned
       OR OLD.rate_limit_per_minute IS DISTINCT FROM NEW.rate_limit_per_minute
       OR OLD.metered_accounts IS DISTINCT FROM NEW.metered_accounts)
    EXECUTE FUNCTION weir_notify_pool_keys();

-- The global setting decides routing too: a change drops every reused
-- lease, so that the next request is routed under it.
CREATE TRIGGER settings_notify_pool
    AFTER INSERT OR UPDATE ON settings
    FOR EACH ROW
    WHEN (NEW.name = 'metered_accounts')
    EXECUTE FUNCTION weir_notify_pool_wide();

-- A request served by a metered account because no subscription could
-- (Lease.spilled_to_metered), for `weir status` and the dashboards.
ALTER TABLE route_events ADD COLUMN spilled_to_metered boolean NOT NULL DEFAULT false;
CREATE INDEX route_events_spilled_idx ON route_events (id DESC) WHERE spilled_to_metered;
