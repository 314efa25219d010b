-- name: ListSettings :many
SELECT * FROM settings;

-- name: PutSetting :exec
INSERT INTO settings (name, value, updated_at) VALUES (@name, @value, @now)
ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at;

-- name: RecordSettingChange :exec
INSERT INTO setting_changes (name, old_value, new_value, actor, changed_at)
VALUES (@name, @old_value, @new_value, @actor, @now);

-- name: ListSettingChanges :many
SELECT * FROM setting_changes ORDER BY changed_at DESC, id DESC LIMIT @max_rows;
