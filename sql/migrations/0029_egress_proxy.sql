-- Egress proxies: each account's traffic to its upstream (inference, usage
-- reads, token refreshes, profile reads) may go out through a proxy of its
-- own, else through the default (the settings row egress_proxy), unless
-- the account says direct.

-- egress_proxy is what operators see: '' (follows the default), 'direct',
-- or the proxy's scheme://host:port, never its credentials.
-- egress_proxy_sealed is the whole URL, sealed like the credential
-- (package seal: its own associated data, bound to the account), set
-- exactly when egress_proxy names a proxy.
ALTER TABLE accounts
    ADD COLUMN egress_proxy text NOT NULL DEFAULT '',
    ADD COLUMN egress_proxy_sealed bytea,
    ADD CONSTRAINT accounts_egress_proxy_sealed
        CHECK ((egress_proxy IN ('', 'direct')) = (egress_proxy_sealed IS NULL));

-- A setting whose value is a secret: value holds what operators see (and
-- what setting_changes records), sealed the whole (the default egress
-- proxy's URL, bound to the nil account id).
ALTER TABLE settings ADD COLUMN sealed bytea;

-- A lease carries the proxy: a change drops the account's reused leases,
-- as a new credential does.
DROP TRIGGER accounts_notify_pool_update ON accounts;
CREATE TRIGGER accounts_notify_pool_update
    AFTER UPDATE ON accounts
    FOR EACH ROW
    WHEN (OLD.paused IS DISTINCT FROM NEW.paused
       OR OLD.broken_reason IS DISTINCT FROM NEW.broken_reason
       OR OLD.broken_at IS DISTINCT FROM NEW.broken_at
       OR OLD.max_concurrency IS DISTINCT FROM NEW.max_concurrency
       OR OLD.priority IS DISTINCT FROM NEW.priority
       OR OLD.credential_revision IS DISTINCT FROM NEW.credential_revision
       OR OLD.credential_sealed IS DISTINCT FROM NEW.credential_sealed
       OR OLD.recovery_probe IS DISTINCT FROM NEW.recovery_probe
       OR OLD.base_url IS DISTINCT FROM NEW.base_url
       OR OLD.provider IS DISTINCT FROM NEW.provider
       OR OLD.auth_kind IS DISTINCT FROM NEW.auth_kind
       OR OLD.upstream_account_id IS DISTINCT FROM NEW.upstream_account_id
       OR OLD.egress_proxy IS DISTINCT FROM NEW.egress_proxy
       OR OLD.egress_proxy_sealed IS DISTINCT FROM NEW.egress_proxy_sealed)
    EXECUTE FUNCTION weir_notify_pool_accounts();

-- So does the default's: every reused lease goes.
DROP TRIGGER settings_notify_pool ON settings;
CREATE TRIGGER settings_notify_pool
    AFTER INSERT OR UPDATE ON settings
    FOR EACH ROW
    WHEN (NEW.name IN ('metered_accounts', 'egress_proxy'))
    EXECUTE FUNCTION weir_notify_pool_wide();
