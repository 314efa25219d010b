-- Seats kept with their owners. A consumer subscription (a Claude Pro or
-- Max login, a ChatGPT login: auth_kind oauth) is sold for one person's
-- use; an account of that kind may be owned by one client key (the
-- person's) or by one team, and the owned_accounts setting says whether
-- other keys may use it (shared, the default: yes, after its owners) or
-- not (owners_only). A metered account (an API key) is never a seat.
--
-- A key owns what is owned by it or by its team (client_keys.team_id).
ALTER TABLE accounts
    ADD COLUMN owner_key_id   uuid REFERENCES client_keys (id) ON DELETE SET NULL,
    ADD COLUMN owner_team_id  uuid REFERENCES teams (id) ON DELETE SET NULL,
    ADD CONSTRAINT accounts_one_owner CHECK (owner_key_id IS NULL OR owner_team_id IS NULL),
    ADD CONSTRAINT accounts_owner_is_seat
        CHECK ((owner_key_id IS NULL AND owner_team_id IS NULL) OR auth_kind = 'oauth');
CREATE INDEX accounts_owner_key_idx ON accounts (owner_key_id) WHERE owner_key_id IS NOT NULL;
CREATE INDEX accounts_owner_team_idx ON accounts (owner_team_id) WHERE owner_team_id IS NOT NULL;

-- An owner deleted (a team, or a key row removed by hand: the API only
-- revokes keys) leaves its seats without an owner, and paused: a seat
-- that was one person's must not quietly become everyone's. An operator
-- gives it another owner (weir accounts set L --owner ...) or resumes it
-- to share it. This runs before the delete, so before ON DELETE SET NULL
-- clears the owner columns.
CREATE FUNCTION weir_pause_orphaned_seats() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'teams' THEN
        UPDATE accounts SET paused = true WHERE owner_team_id = OLD.id AND NOT paused;
    ELSE
        UPDATE accounts SET paused = true WHERE owner_key_id = OLD.id AND NOT paused;
    END IF;
    RETURN OLD;
END;
$$;

CREATE TRIGGER teams_pause_orphaned_seats
    BEFORE DELETE ON teams
    FOR EACH ROW EXECUTE FUNCTION weir_pause_orphaned_seats();

CREATE TRIGGER client_keys_pause_orphaned_seats
    BEFORE DELETE ON client_keys
    FOR EACH ROW EXECUTE FUNCTION weir_pause_orphaned_seats();

-- Who may use an account is what a reused lease depends on: an owner
-- change drops the account's reused leases, as a pause does.
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
       OR OLD.egress_proxy_sealed IS DISTINCT FROM NEW.egress_proxy_sealed
       OR OLD.owner_key_id IS DISTINCT FROM NEW.owner_key_id
       OR OLD.owner_team_id IS DISTINCT FROM NEW.owner_team_id)
    EXECUTE FUNCTION weir_notify_pool_accounts();

-- So does the owned_accounts setting: every reused lease goes.
DROP TRIGGER settings_notify_pool ON settings;
CREATE TRIGGER settings_notify_pool
    AFTER INSERT OR UPDATE ON settings
    FOR EACH ROW
    WHEN (NEW.name IN ('metered_accounts', 'egress_proxy', 'owned_accounts'))
    EXECUTE FUNCTION weir_notify_pool_wide();
