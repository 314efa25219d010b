-- name: InsertRouteEvent :exec
INSERT INTO route_events (
    request_id, key_id, account_id, surface, model, stream, status, error_type,
    attempts, duration_ms, ttfb_ms, input_tokens, output_tokens, started_at, recorded_at
) VALUES (
    @request_id, sqlc.narg('key_id'), sqlc.narg('account_id'), @surface, @model, @stream, @status, @error_type,
    @attempts, @duration_ms, sqlc.narg('ttfb_ms'), @input_tokens, @output_tokens, @started_at, @now
);

-- name: ListRouteEvents :many
SELECT * FROM route_events
WHERE sqlc.narg('account_id')::uuid IS NULL OR account_id = sqlc.narg('account_id')
ORDER BY id DESC
LIMIT @max_rows;
