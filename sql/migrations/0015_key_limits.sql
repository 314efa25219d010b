-- Per-key restrictions, each optional: a model allowlist, an account pin
-- and a request rate limit.

-- allowed_models: exact names or a trailing-* glob; NULL allows any model.
-- pinned: the key may use only the accounts listed in client_key_accounts.
--   It is a column of its own, not "the list is non-empty": deleting every
--   pinned account leaves the key pinned to nothing (no account), never
--   unrestricted.
-- rate_limit_per_minute: requests per minute across every worker; NULL is
--   no limit.
ALTER TABLE client_keys
    ADD COLUMN allowed_models text[],
    ADD COLUMN pinned boolean NOT NULL DEFAULT false,
    ADD COLUMN rate_limit_per_minute integer CHECK (rate_limit_per_minute > 0);

CREATE TABLE client_key_accounts (
    key_id      uuid NOT NULL REFERENCES client_keys (id) ON DELETE CASCADE,
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    PRIMARY KEY (key_id, account_id)
);

CREATE INDEX client_key_accounts_account ON client_key_accounts (account_id);

-- The rate limit's state, as a GCRA: tat is the theoretical arrival time
-- of the next request. A request is admitted when max(tat, now) + 60 s /
-- limit is at most now + 60 s (a full bucket holds one minute's requests),
-- and moves tat there. A row of its own, so that the per-request write
-- never touches client_keys (and its triggers).
CREATE TABLE client_key_buckets (
    key_id  uuid PRIMARY KEY REFERENCES client_keys (id) ON DELETE CASCADE,
    tat     timestamptz NOT NULL
);

-- A restriction change reaches every worker like a revocation: cached
-- verifications and reused leases of the key are dropped.
CREATE TRIGGER client_keys_notify_pool_limits
    AFTER UPDATE ON client_keys
    FOR EACH ROW
    WHEN (OLD.allowed_models IS DISTINCT FROM NEW.allowed_models
       OR OLD.pinned IS DISTINCT FROM NEW.pinned
       OR OLD.rate_limit_per_minute IS DISTINCT FROM NEW.rate_limit_per_minute)
    EXECUTE FUNCTION weir_notify_pool_keys();

CREATE TRIGGER client_key_accounts_notify_pool
    AFTER INSERT OR DELETE ON client_key_accounts
    FOR EACH ROW EXECUTE FUNCTION weir_notify_pool_keys();
