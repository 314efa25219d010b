-- route_events loses its index on recorded_at. Its one reader was the
-- dashboard's per-bucket counts (RouteEventBuckets), which now bucket by
-- started_at: the table's partition key, which route_events_started_idx
-- already orders and which prunes the partitions outside the range. Every
-- event written kept the index up to date for that one query: about 5 µs
-- of an event's 50 (BenchmarkStoreRoutes, batches of 100).
DROP INDEX route_events_recorded_at_idx;
