-- A breaker's probe slot (probe_until) changes on every probe claimed or
-- given back; what workers act on is the breaker opening or closing
-- (open_until). Notifying every probe made every worker's held requests
-- ask again at each probe of a storm. Only open_until notifies now.

DROP TRIGGER overload_breakers_notify_pool_insert ON overload_breakers;
DROP TRIGGER overload_breakers_notify_pool_update ON overload_breakers;

CREATE TRIGGER overload_breakers_notify_pool_insert
    AFTER INSERT ON overload_breakers
    FOR EACH ROW
    WHEN (NEW.open_until IS NOT NULL)
    EXECUTE FUNCTION weir_notify_pool_wide();

CREATE TRIGGER overload_breakers_notify_pool_update
    AFTER UPDATE ON overload_breakers
    FOR EACH ROW
    WHEN (OLD.open_until IS DISTINCT FROM NEW.open_until)
    EXECUTE FUNCTION weir_notify_pool_wide();
