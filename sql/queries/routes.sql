-- Sent as a pipelined batch: one round trip for a worker's batch of events.
-- name: InsertRouteEvents :batchexec
INSERT INTO route_events (
    request_id, key_id, account_id, surface, model, stream, status, error_type,
    attempts, duration_ms, ttfb_ms, input_tokens, output_tokens, started_at, recorded_at,
    held_ms, hold_count, failure_stage, attempts_json
) VALUES (
    -- An account or key deleted while the request ran detaches the event
    -- instead of losing it.
    @request_id,
    (SELECT id FROM client_keys WHERE id = sqlc.narg('key_id')::uuid),
    (SELECT id FROM accounts WHERE id = sqlc.narg('account_id')::uuid),
    @surface, @model, @stream, @status, @error_type,
    @attempts, @duration_ms, sqlc.narg('ttfb_ms'), @input_tokens, @output_tokens, @started_at, @now,
    @held_ms, @hold_count, @failure_stage, @attempts_json
);

-- name: GetRouteEvent :one
SELECT * FROM route_events WHERE request_id = @request_id ORDER BY id DESC LIMIT 1;

-- name: ListRouteEvents :many
SELECT * FROM route_events
WHERE sqlc.narg('account_id')::uuid IS NULL OR account_id = sqlc.narg('account_id')
ORDER BY id DESC
LIMIT @max_rows;
