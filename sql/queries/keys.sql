-- name: CreateKey :one
INSERT INTO client_keys (name, key_hash, prefix, created_at)
VALUES (@name, @key_hash, @prefix, @now)
RETURNING *;

-- name: ListKeys :many
SELECT * FROM client_keys
WHERE @include_revoked::boolean OR revoked_at IS NULL
ORDER BY created_at;

-- name: GetKey :one
SELECT * FROM client_keys WHERE id = @id;

-- name: GetKeyByName :one
SELECT * FROM client_keys WHERE name = @name;

-- name: RevokeKey :one
UPDATE client_keys SET revoked_at = coalesce(revoked_at, @now::timestamptz) WHERE id = @id RETURNING *;

-- name: ActiveKeyByHash :one
SELECT id, name FROM client_keys WHERE key_hash = @key_hash AND revoked_at IS NULL;

-- Throttled so a busy key costs one write a minute, not one per request.
-- name: TouchKey :exec
UPDATE client_keys SET last_used_at = @now::timestamptz
WHERE id = @id AND (last_used_at IS NULL OR last_used_at < @stale_before::timestamptz);

-- Acquire's first question in one round trip: is the key live, and is the
-- model an alias (NULL targets: a concrete model).
-- name: ActiveKeyAndAlias :one
SELECT k.id AS key_id,
    (SELECT a.targets FROM model_aliases a WHERE a.alias = @model::text) AS alias_targets
FROM client_keys k
WHERE k.key_hash = @key_hash AND k.revoked_at IS NULL;
