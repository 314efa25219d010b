-- Pool notifications: every change of the routing state a reused lease
-- depends on is announced on the weir_pool channel, in the transaction
-- that makes it (Postgres delivers on commit, and folds identical payloads
-- of one transaction into one). The control plane LISTENs and streams the
-- events to data-plane workers (LeaseService.WatchPool), which drop the
-- leases they hold for reuse on the named account.
--
-- Payloads: an account id (text), '*' (pool-wide: drop every reusable
-- lease) or 'keys' (a client key changed: forget cached verifications).
--
-- Only changes that can matter fire: the columns every request writes
-- (accounts.last_used_at, last_success_at, auth_failures, quota_backoffs;
-- client_keys.last_used_at; usage readings that stay within one band)
-- stay silent, or every worker would drop its leases on every request.

-- For tables keyed by account_id: cooldowns, family_gates, usage_windows.
CREATE FUNCTION weir_notify_pool_account() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('weir_pool', OLD.account_id::text);
    ELSE
        PERFORM pg_notify('weir_pool', NEW.account_id::text);
    END IF;
    RETURN NULL;
END;
$$;

-- For accounts themselves, keyed by id.
CREATE FUNCTION weir_notify_pool_accounts() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pg_notify('weir_pool', OLD.id::text);
    ELSE
        PERFORM pg_notify('weir_pool', NEW.id::text);
    END IF;
    RETURN NULL;
END;
$$;

-- Pool-wide changes: breakers, aliases.
CREATE FUNCTION weir_notify_pool_wide() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('weir_pool', '*');
    RETURN NULL;
END;
$$;

-- A client key revoked or deleted: workers forget their cached
-- verifications, and a lease reused for that key must go too.
CREATE FUNCTION weir_notify_pool_keys() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('weir_pool', 'keys');
    PERFORM pg_notify('weir_pool', '*');
    RETURN NULL;
END;
$$;

CREATE TRIGGER cooldowns_notify_pool
    AFTER INSERT OR UPDATE OR DELETE ON cooldowns
    FOR EACH ROW EXECUTE FUNCTION weir_notify_pool_account();

CREATE TRIGGER family_gates_notify_pool
    AFTER INSERT OR UPDATE OR DELETE ON family_gates
    FOR EACH ROW EXECUTE FUNCTION weir_notify_pool_account();

CREATE TRIGGER accounts_notify_pool_insert_delete
    AFTER INSERT OR DELETE ON accounts
    FOR EACH ROW EXECUTE FUNCTION weir_notify_pool_accounts();

-- Only what routing or a lease reads: eligibility (paused, broken), the
-- cap and its probe, the order, and what the lease carries (credential,
-- upstream, identity of the endpoint).
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
       OR OLD.upstream_account_id IS DISTINCT FROM NEW.upstream_account_id)
    EXECUTE FUNCTION weir_notify_pool_accounts();

-- The usage bands routing acts on: the pool-liveness reserve (0.8),
-- near-limit (0.9) and a spent window (0.99). No evidence counts as 0.
CREATE FUNCTION weir_usage_band(u double precision) RETURNS integer
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN coalesce(u, 0) >= 0.99 THEN 3
        WHEN coalesce(u, 0) >= 0.9 THEN 2
        WHEN coalesce(u, 0) >= 0.8 THEN 1
        ELSE 0
    END;
$$;

CREATE TRIGGER usage_windows_notify_pool_insert
    AFTER INSERT ON usage_windows
    FOR EACH ROW
    WHEN (weir_usage_band(NEW.utilization) > 0)
    EXECUTE FUNCTION weir_notify_pool_account();

CREATE TRIGGER usage_windows_notify_pool_update
    AFTER UPDATE ON usage_windows
    FOR EACH ROW
    WHEN (weir_usage_band(OLD.utilization) <> weir_usage_band(NEW.utilization))
    EXECUTE FUNCTION weir_notify_pool_account();

CREATE TRIGGER usage_windows_notify_pool_delete
    AFTER DELETE ON usage_windows
    FOR EACH ROW EXECUTE FUNCTION weir_notify_pool_account();

CREATE TRIGGER overload_breakers_notify_pool_insert
    AFTER INSERT ON overload_breakers
    FOR EACH ROW
    WHEN (NEW.open_until IS NOT NULL OR NEW.probe_until IS NOT NULL)
    EXECUTE FUNCTION weir_notify_pool_wide();

CREATE TRIGGER overload_breakers_notify_pool_update
    AFTER UPDATE ON overload_breakers
    FOR EACH ROW
    WHEN (OLD.open_until IS DISTINCT FROM NEW.open_until
       OR OLD.probe_until IS DISTINCT FROM NEW.probe_until)
    EXECUTE FUNCTION weir_notify_pool_wide();

CREATE TRIGGER client_keys_notify_pool_update
    AFTER UPDATE ON client_keys
    FOR EACH ROW
    WHEN (OLD.revoked_at IS DISTINCT FROM NEW.revoked_at)
    EXECUTE FUNCTION weir_notify_pool_keys();

CREATE TRIGGER client_keys_notify_pool_delete
    AFTER DELETE ON client_keys
    FOR EACH ROW EXECUTE FUNCTION weir_notify_pool_keys();

CREATE TRIGGER model_aliases_notify_pool
    AFTER INSERT OR UPDATE OR DELETE ON model_aliases
    FOR EACH ROW EXECUTE FUNCTION weir_notify_pool_wide();
