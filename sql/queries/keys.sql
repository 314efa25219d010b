-- name: CreateKey :one
INSERT INTO client_keys (name, key_hash, prefix, created_at, allowed_models, pinned, rate_limit_per_minute, metered_accounts)
VALUES (@name, @key_hash, @prefix, @now, sqlc.narg('allowed_models')::text[], @pinned,
    sqlc.narg('rate_limit_per_minute')::integer, sqlc.narg('metered_accounts')::text)
RETURNING *;

-- Changes the restrictions whose set_ flag is true; the others stay.
-- name: UpdateKeyLimits :one
UPDATE client_keys SET
    allowed_models = CASE WHEN @set_models::boolean THEN sqlc.narg('allowed_models')::text[] ELSE allowed_models END,
    pinned = CASE WHEN @set_pinned::boolean THEN @pinned::boolean ELSE pinned END,
    rate_limit_per_minute = CASE WHEN @set_rate_limit::boolean THEN sqlc.narg('rate_limit_per_minute')::integer
                                 ELSE rate_limit_per_minute END,
    metered_accounts = CASE WHEN @set_metered::boolean THEN sqlc.narg('metered_accounts')::text ELSE metered_accounts END
WHERE id = @id
RETURNING *;

-- name: ClearKeyAccounts :exec
DELETE FROM client_key_accounts WHERE key_id = @key_id;

-- name: AddKeyAccounts :exec
INSERT INTO client_key_accounts (key_id, account_id)
SELECT @key_id, unnest(@account_ids::uuid[])
ON CONFLICT DO NOTHING;

-- The pinned accounts of the given keys, with their labels.
-- name: KeyAccounts :many
SELECT ka.key_id, a.id AS account_id, a.label
FROM client_key_accounts ka JOIN accounts a ON a.id = ka.account_id
WHERE ka.key_id = ANY(@key_ids::uuid[])
ORDER BY a.label;

-- A new limit starts with a full bucket.
-- name: ResetKeyBucket :exec
DELETE FROM client_key_buckets WHERE key_id = @key_id;

-- Takes one request from a live key's rate limit (GCRA, see
-- 0015_key_limits.sql), in one statement so that every worker's requests
-- draw on the same bucket. admitted is false when the limit is reached,
-- and then tat is the bucket's state, from which the wait follows; a key
-- without a limit is never counted (rate_limit_per_minute NULL).
-- name: TakeKeyToken :one
WITH k AS (
    SELECT ck.id, ck.rate_limit_per_minute FROM client_keys ck
    WHERE ck.key_hash = @key_hash AND ck.revoked_at IS NULL
), took AS (
    INSERT INTO client_key_buckets AS b (key_id, tat)
    SELECT k.id, sqlc.arg('now')::timestamptz
        + make_interval(secs => 60.0::double precision / k.rate_limit_per_minute)
    FROM k WHERE k.rate_limit_per_minute IS NOT NULL
    ON CONFLICT (key_id) DO UPDATE
       SET tat = greatest(b.tat, sqlc.arg('now')::timestamptz) + (EXCLUDED.tat - sqlc.arg('now')::timestamptz)
     WHERE greatest(b.tat, sqlc.arg('now')::timestamptz) + (EXCLUDED.tat - sqlc.arg('now')::timestamptz)
           <= sqlc.arg('now')::timestamptz + interval '1 minute'
    RETURNING b.key_id
)
SELECT k.id AS key_id, k.rate_limit_per_minute,
    EXISTS (SELECT 1 FROM took)::boolean AS admitted,
    coalesce((SELECT b.tat FROM client_key_buckets b WHERE b.key_id = k.id), sqlc.arg('now')::timestamptz)::timestamptz AS tat
FROM k;

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
SELECT id, name, allowed_models, rate_limit_per_minute, budgeted, team_id FROM client_keys
WHERE key_hash = @key_hash AND revoked_at IS NULL;

-- Throttled so a busy key costs one write a minute, not one per request.
-- name: TouchKey :exec
UPDATE client_keys SET last_used_at = @now::timestamptz
WHERE id = @id AND (last_used_at IS NULL OR last_used_at < @stale_before::timestamptz);

-- Acquire's first question in one round trip: is the key live, what
-- restricts it, and is the model an alias, the key's own or the global one
-- (NULL targets: a concrete model).
-- name: ActiveKeyAndAlias :one
SELECT k.id AS key_id, k.allowed_models, k.pinned, k.metered_accounts, k.team_id,
    (SELECT array_agg(ka.account_id) FROM client_key_accounts ka WHERE ka.key_id = k.id)::uuid[] AS pins,
    coalesce(
        (SELECT ka.targets FROM key_aliases ka JOIN client_keys kk ON kk.id = ka.key_id WHERE kk.key_hash = @key_hash AND ka.alias = @model::text),
        (SELECT ma.targets FROM model_aliases ma WHERE ma.alias = @model::text))::text[] AS alias_targets,
    coalesce(
        (SELECT ka.translate FROM key_aliases ka JOIN client_keys kk ON kk.id = ka.key_id WHERE kk.key_hash = @key_hash AND ka.alias = @model::text),
        (SELECT ma.translate FROM model_aliases ma WHERE ma.alias = @model::text), false)::boolean AS alias_translate
FROM client_keys k
WHERE k.key_hash = @key_hash AND k.revoked_at IS NULL;
