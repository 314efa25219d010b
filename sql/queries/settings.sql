-- name: ListSettings :many
SELECT * FROM settings;

-- name: PutSetting :exec
INSERT INTO settings (name, value, updated_at) VALUES (@name, @value, @now)
ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at;
