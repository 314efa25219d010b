-- One statement for a worker's whole batch of events: each column comes
-- as an array, unnested row by row in the batch's order (ids, which the
-- dashboards sort by, follow it). An account or key deleted while the
-- request ran detaches the event instead of losing it (the LEFT JOINs);
-- a nil id names none. A time to first byte counts where has_ttfb says so.
-- name: InsertRouteEvents :exec
INSERT INTO route_events (
    request_id, key_id, account_id, surface, model, stream, status, error_type,
    attempts, duration_ms, ttfb_ms, input_tokens, output_tokens, started_at, recorded_at,
    held_ms, hold_count, failure_stage, attempts_json, spilled_to_metered
)
SELECT e.request_id, k.id, a.id, e.surface, e.model, e.stream, e.status, e.error_type,
    e.attempts, e.duration_ms, CASE WHEN e.has_ttfb THEN e.ttfb_ms END, e.input_tokens, e.output_tokens,
    e.started_at, @now::timestamptz, e.held_ms, e.hold_count, e.failure_stage, e.attempts_json::jsonb,
    e.spilled_to_metered
FROM ROWS FROM (
    unnest(@request_ids::text[]), unnest(@key_ids::uuid[]), unnest(@account_ids::uuid[]),
    unnest(@surfaces::text[]), unnest(@models::text[]), unnest(@streams::boolean[]),
    unnest(@statuses::integer[]), unnest(@error_types::text[]), unnest(@attempt_counts::integer[]),
    unnest(@durations_ms::float8[]), unnest(@has_ttfb::boolean[]), unnest(@ttfbs_ms::float8[]),
    unnest(@input_tokens::bigint[]), unnest(@output_tokens::bigint[]), unnest(@started_ats::timestamptz[]),
    unnest(@helds_ms::float8[]), unnest(@hold_counts::integer[]), unnest(@failure_stages::text[]),
    unnest(@attempts_jsons::text[]), unnest(@spilled::boolean[])
) WITH ORDINALITY AS e(request_id, key_id, account_id, surface, model, stream, status, error_type,
    attempts, duration_ms, has_ttfb, ttfb_ms, input_tokens, output_tokens, started_at, held_ms,
    hold_count, failure_stage, attempts_json, spilled_to_metered, ord)
LEFT JOIN client_keys k ON k.id = e.key_id
LEFT JOIN accounts a ON a.id = e.account_id
ORDER BY e.ord
-- A redelivered event (its request id is its identity) is stored once.
ON CONFLICT (request_id) DO NOTHING;

-- name: GetRouteEvent :one
SELECT * FROM route_events WHERE request_id = @request_id ORDER BY id DESC LIMIT 1;

-- name: ListRouteEvents :many
SELECT * FROM route_events
WHERE (sqlc.narg('account_id')::uuid IS NULL OR account_id = sqlc.narg('account_id'))
  AND (NOT @spilled_only::boolean OR spilled_to_metered)
ORDER BY id DESC
LIMIT @max_rows;
