-- The overload breaker probes each account, not one account at a time:
-- a claimed probe moves open_until on by probe_every_ms, the pace that
-- lets every account that can serve be probed every two seconds within
-- the family's probe budget (controlplane/policy/breaker.go). Several
-- probes may be out at once, each on another account.
ALTER TABLE overload_breakers ADD COLUMN probe_every_ms integer NOT NULL DEFAULT 2000;

-- open_until now moves at every probe claimed, several times a second in
-- a storm. What workers act on is the breaker opening or closing; a held
-- request already waits for the next probe's time from its answer.
DROP TRIGGER overload_breakers_notify_pool_update ON overload_breakers;

CREATE TRIGGER overload_breakers_notify_pool_update
    AFTER UPDATE ON overload_breakers
    FOR EACH ROW
    WHEN ((OLD.open_until IS NULL) IS DISTINCT FROM (NEW.open_until IS NULL))
    EXECUTE FUNCTION weir_notify_pool_wide();

-- When an account last answered overloaded, cleared by its next success:
-- routing tries an account that answers before one overloaded within the
-- last seconds. Written with every overload, read by routing only, so it
-- announces nothing (0012_pool_notify.sql lists the columns that do).
ALTER TABLE accounts ADD COLUMN overloaded_at timestamptz;
