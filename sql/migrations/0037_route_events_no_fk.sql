-- Route events keep the ids of their key and account without foreign keys.
-- A foreign key made every inserted event run two referential checks, each
-- a lookup that also locks the key's and the account's row FOR KEY SHARE:
-- 4–5 µs of an event's 33–39 (BenchmarkStoreRoutes, batches of 100), and
-- a lock on the account rows that claims and success records also take
-- (a deadlock between them once cost a second: docs/performance.md). An event is history: InsertRouteEvents already stores
-- NULL for a key or an account that does not exist when it is written,
-- and DeleteAccount sets its account's events to NULL as the foreign key's
-- ON DELETE SET NULL did (keys are revoked, never deleted). An event whose
-- batch was in flight while its account was deleted may keep the id;
-- every reader joins accounts, so such an id reads like NULL.
ALTER TABLE route_events DROP CONSTRAINT route_events_account_id_fkey;
ALTER TABLE route_events DROP CONSTRAINT route_events_key_id_fkey;
