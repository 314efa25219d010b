-- One statement for a worker's whole batch of events: each column comes
-- as an array, unnested row by row in the batch's order (ids, which the
-- dashboards sort by, follow it). An account or key deleted while the
-- request ran detaches the event instead of losing it (the LEFT JOINs);
-- a nil id names none. A time to first byte counts where has_ttfb says so.
-- A pending event (pending_until set: the request is in progress,
-- 0021_lease_clock.sql) is replaced by its request's final event, and so
-- is the 'worker_lost' record the reaper made of one; anything else with
-- the same request id is a redelivery, stored once. A batch holds one
-- event per request id (the control plane keeps the final one). It
-- returns the rows it wrote, so that usage is rolled up once per request
-- (a redelivered final event writes nothing and returns nothing).
-- route_events is partitioned by started_at (0036_partitioned_events.sql),
-- so a request id is unique with its started_at: every event of a request
-- carries the request's start (RouteEventStarts fills it in for an event
-- sent without one), and its events meet in one partition.
-- name: InsertRouteEvents :many
INSERT INTO route_events (
    request_id, key_id, account_id, surface, model, stream, status, error_type,
    attempts, duration_ms, ttfb_ms, input_tokens, output_tokens, started_at, recorded_at,
    held_ms, hold_count, failure_stage, attempts_json, spilled_to_metered, pending_until,
    held_since, hold_reason, next_try_at, verdict, session_key, cache_read_tokens,
    cache_creation_tokens, reasoning_tokens, cost_nano_usd
)
SELECT e.request_id, k.id, a.id, e.surface, e.model, e.stream, e.status, e.error_type,
    e.attempts, e.duration_ms, CASE WHEN e.has_ttfb THEN e.ttfb_ms END, e.input_tokens, e.output_tokens,
    e.started_at, @now::timestamptz, e.held_ms, e.hold_count, e.failure_stage, e.attempts_json::jsonb,
    e.spilled_to_metered, CASE WHEN e.pending THEN @pending_until::timestamptz END,
    CASE WHEN e.held THEN e.held_since END, coalesce(e.hold_reason, ''), CASE WHEN e.held THEN e.next_try_at END,
    coalesce(e.verdict, ''), e.session_key, e.cache_read_tokens, e.cache_creation_tokens,
    e.reasoning_tokens, e.cost_nano_usd
FROM ROWS FROM (
    unnest(@request_ids::text[]), unnest(@key_ids::uuid[]), unnest(@account_ids::uuid[]),
    unnest(@surfaces::text[]), unnest(@models::text[]), unnest(@streams::boolean[]),
    unnest(@statuses::integer[]), unnest(@error_types::text[]), unnest(@attempt_counts::integer[]),
    unnest(@durations_ms::float8[]), unnest(@has_ttfb::boolean[]), unnest(@ttfbs_ms::float8[]),
    unnest(@input_tokens::bigint[]), unnest(@output_tokens::bigint[]), unnest(@started_ats::timestamptz[]),
    unnest(@helds_ms::float8[]), unnest(@hold_counts::integer[]), unnest(@failure_stages::text[]),
    unnest(@attempts_jsons::text[]), unnest(@spilled::boolean[]), unnest(@pendings::boolean[]),
    unnest(@held::boolean[]), unnest(@held_sinces::timestamptz[]), unnest(@hold_reasons::text[]),
    unnest(@next_try_ats::timestamptz[]), unnest(@verdicts::text[]), unnest(@session_keys::text[]),
    unnest(@cache_read_tokens::bigint[]), unnest(@cache_creation_tokens::bigint[]),
    unnest(@reasoning_tokens::bigint[]), unnest(@costs_nano_usd::bigint[])
) WITH ORDINALITY AS e(request_id, key_id, account_id, surface, model, stream, status, error_type,
    attempts, duration_ms, has_ttfb, ttfb_ms, input_tokens, output_tokens, started_at, held_ms,
    hold_count, failure_stage, attempts_json, spilled_to_metered, pending, held, held_since, hold_reason,
    next_try_at, verdict, session_key, cache_read_tokens, cache_creation_tokens, reasoning_tokens,
    cost_nano_usd, ord)
LEFT JOIN client_keys k ON k.id = e.key_id
LEFT JOIN accounts a ON a.id = e.account_id
ORDER BY e.ord
ON CONFLICT (request_id, started_at) DO UPDATE SET
    key_id = EXCLUDED.key_id, account_id = EXCLUDED.account_id, surface = EXCLUDED.surface,
    model = EXCLUDED.model, stream = EXCLUDED.stream, status = EXCLUDED.status,
    error_type = EXCLUDED.error_type, attempts = EXCLUDED.attempts, duration_ms = EXCLUDED.duration_ms,
    ttfb_ms = EXCLUDED.ttfb_ms, input_tokens = EXCLUDED.input_tokens, output_tokens = EXCLUDED.output_tokens,
    recorded_at = EXCLUDED.recorded_at, held_ms = EXCLUDED.held_ms,
    hold_count = EXCLUDED.hold_count, failure_stage = EXCLUDED.failure_stage,
    attempts_json = EXCLUDED.attempts_json, spilled_to_metered = EXCLUDED.spilled_to_metered,
    pending_until = EXCLUDED.pending_until, held_since = EXCLUDED.held_since, hold_reason = EXCLUDED.hold_reason,
    next_try_at = EXCLUDED.next_try_at, verdict = EXCLUDED.verdict, session_key = EXCLUDED.session_key,
    cache_read_tokens = EXCLUDED.cache_read_tokens, cache_creation_tokens = EXCLUDED.cache_creation_tokens,
    reasoning_tokens = EXCLUDED.reasoning_tokens, cost_nano_usd = EXCLUDED.cost_nano_usd
-- A final event replaces a pending one (or the reaper's worker_lost); a
-- pending one, the hold going on, replaces a pending one still open.
WHERE (EXCLUDED.pending_until IS NULL
       AND (route_events.pending_until IS NOT NULL OR route_events.error_type = 'worker_lost'))
   OR (EXCLUDED.pending_until IS NOT NULL AND route_events.pending_until IS NOT NULL)
RETURNING request_id, (pending_until IS NULL)::boolean AS final;

-- The start of the given requests' stored events: an event sent without
-- its request's start replaces the stored one only under the same
-- started_at, the partition key.
-- name: RouteEventStarts :many
SELECT request_id, started_at FROM route_events WHERE request_id = ANY(@request_ids::text[]);

-- Keeps the given requests' pending events open until @until (the
-- worker that serves them renews them with its leases). A renewal is
-- written to route_pending (0039_route_pending.sql), not to the event:
-- the event's row and indexes stay as they are. A request whose event is
-- final, or not stored yet, gets a row too; it changes nothing and the
-- reaper deletes it.
-- name: RenewPendingRoutes :exec
INSERT INTO route_pending (request_id, until)
SELECT id, @until::timestamptz FROM unnest(@request_ids::text[]) AS id
ON CONFLICT (request_id) DO UPDATE SET until = greatest(route_pending.until, EXCLUDED.until);

-- Closes the pending events no worker renewed: their worker died (or was
-- cut off from every control plane for that long; its final event, when
-- it comes, replaces the record). Each says 'worker_lost', with the time
-- the request was last known to run. Returns how many were closed.
-- A request is open until the later of its event's pending_until and
-- its last renewal's (route_pending); the renewals past are deleted.
-- name: CloseLostRequests :one
WITH open AS (
    SELECT e.request_id, e.started_at,
        greatest(e.pending_until, (SELECT r.until FROM route_pending r WHERE r.request_id = e.request_id)) AS until
    FROM route_events e
    WHERE e.pending_until < @now::timestamptz -- the later of the two can pass only then
), closed AS (
    UPDATE route_events e SET error_type = 'worker_lost', pending_until = NULL, recorded_at = @now::timestamptz,
        duration_ms = greatest(extract(epoch FROM o.until - e.started_at) * 1000, 0)
    FROM open o
    -- pending_until again: a final event stored meanwhile is not closed.
    WHERE e.request_id = o.request_id AND e.started_at = o.started_at AND o.until < @now::timestamptz
      AND e.pending_until IS NOT NULL
    RETURNING 1
), swept AS (
    DELETE FROM route_pending WHERE until < @now::timestamptz
)
SELECT count(*)::bigint AS closed FROM closed;

-- name: GetRouteEvent :one
SELECT * FROM route_events WHERE request_id = @request_id ORDER BY id DESC LIMIT 1;

-- name: ListRouteEvents :many
SELECT * FROM route_events
WHERE (sqlc.narg('account_id')::uuid IS NULL OR account_id = sqlc.narg('account_id'))
  AND (NOT @spilled_only::boolean OR spilled_to_metered)
  AND (NOT @held_only::boolean OR (pending_until IS NOT NULL AND held_since IS NOT NULL))
ORDER BY id DESC
LIMIT @max_rows;

-- A worker's refusal counts (0023_refusal_counts.sql), one row per
-- interval, key, reason and worker: a count sent again keeps the larger.
-- A batch holds each row once (the control plane merges repeats).
-- name: UpsertRefusalCounts :exec
INSERT INTO refusal_counts (interval_start, key_id, reason, worker_id, count, recorded_at)
SELECT r.interval_start, r.key_id, r.reason, r.worker_id, r.count, @now::timestamptz
FROM ROWS FROM (
    unnest(@interval_starts::timestamptz[]), unnest(@key_ids::uuid[]), unnest(@reasons::text[]),
    unnest(@worker_ids::text[]), unnest(@counts::bigint[])
) AS r(interval_start, key_id, reason, worker_id, count)
ON CONFLICT (interval_start, key_id, reason, worker_id) DO UPDATE
    SET count = greatest(refusal_counts.count, EXCLUDED.count), recorded_at = EXCLUDED.recorded_at;

-- Every worker's refusals summed by interval, key and reason.
-- name: ListRefusals :many
SELECT interval_start, key_id, reason, sum(count)::bigint AS count
FROM refusal_counts
WHERE interval_start >= @since::timestamptz
  AND (sqlc.narg('key_id')::uuid IS NULL OR key_id = sqlc.narg('key_id'))
GROUP BY interval_start, key_id, reason
ORDER BY interval_start DESC, sum(count) DESC, reason
LIMIT @max_rows;

-- Partition maintenance (jobs/partitions.go): creates p_parent's
-- partitions ahead and drops those past retention (a NULL keep_seconds
-- keeps them), 0036_partitioned_events.sql.
-- name: MaintainPartitions :one
SELECT m.created::integer AS created, m.dropped::integer AS dropped, m.purged::bigint AS purged
FROM weir_partition_maintain(@parent::text, @unit::text, @now::timestamptz, @ahead::integer,
    make_interval(secs => sqlc.narg('keep_seconds')::double precision)) AS m;

-- Refusal counts (jobs/retention.go): at most @batch of intervals that
-- started before @before, oldest first; returns how many went. The table
-- holds a row per worker, minute, key and reason, not per request: it
-- stays unpartitioned.
-- name: DeleteRefusalCountsBefore :one
WITH doomed AS (
    SELECT interval_start, key_id, reason, worker_id FROM refusal_counts
    WHERE interval_start < @before::timestamptz
    ORDER BY interval_start
    LIMIT @batch
), gone AS (
    DELETE FROM refusal_counts r USING doomed d
    WHERE r.interval_start = d.interval_start AND r.key_id = d.key_id AND r.reason = d.reason AND r.worker_id = d.worker_id
    RETURNING 1
)
SELECT count(*)::bigint AS deleted FROM gone;
