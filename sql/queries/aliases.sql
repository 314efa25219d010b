-- name: ListModelAliases :many
SELECT * FROM model_aliases ORDER BY alias;

-- name: SetModelAlias :one
INSERT INTO model_aliases (alias, targets, translate, created_at, updated_at)
VALUES (@alias, @targets::text[], @translate::boolean, @now::timestamptz, @now::timestamptz)
ON CONFLICT (alias) DO UPDATE SET targets = EXCLUDED.targets, translate = EXCLUDED.translate, updated_at = EXCLUDED.updated_at
RETURNING *;

-- name: DeleteModelAlias :execrows
DELETE FROM model_aliases WHERE alias = @alias;
