-- name: ListModelAliases :many
SELECT * FROM model_aliases ORDER BY alias;

-- name: SetModelAlias :one
INSERT INTO model_aliases (alias, targets, created_at, updated_at)
VALUES (@alias, @targets::text[], @now::timestamptz, @now::timestamptz)
ON CONFLICT (alias) DO UPDATE SET targets = EXCLUDED.targets, updated_at = EXCLUDED.updated_at
RETURNING *;

-- name: DeleteModelAlias :execrows
DELETE FROM model_aliases WHERE alias = @alias;
