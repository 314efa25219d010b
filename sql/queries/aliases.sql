-- name: ListModelAliases :many
SELECT * FROM model_aliases ORDER BY alias;

-- name: SetModelAlias :one
INSERT INTO model_aliases (alias, targets, translate, created_at, updated_at)
VALUES (@alias, @targets::text[], @translate::boolean, @now::timestamptz, @now::timestamptz)
ON CONFLICT (alias) DO UPDATE SET targets = EXCLUDED.targets, translate = EXCLUDED.translate, updated_at = EXCLUDED.updated_at
RETURNING *;

-- name: DeleteModelAlias :execrows
DELETE FROM model_aliases WHERE alias = @alias;

-- name: ListKeyAliases :many
SELECT ka.*, k.name AS key_name FROM key_aliases ka JOIN client_keys k ON k.id = ka.key_id
ORDER BY k.name, ka.alias;

-- name: SetKeyAlias :one
INSERT INTO key_aliases (key_id, alias, targets, translate, created_at, updated_at)
VALUES (@key_id, @alias, @targets::text[], @translate::boolean, @now::timestamptz, @now::timestamptz)
ON CONFLICT (key_id, alias) DO UPDATE SET targets = EXCLUDED.targets, translate = EXCLUDED.translate, updated_at = EXCLUDED.updated_at
RETURNING *;

-- name: DeleteKeyAlias :execrows
DELETE FROM key_aliases WHERE key_id = @key_id AND alias = @alias;
