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

-- A setting whose value is a secret: value is what operators see, sealed
-- the whole (controlplane/settings.go).
-- name: PutSealedSetting :exec
INSERT INTO settings (name, value, sealed, updated_at) VALUES (@name, @value, @sealed, @now)
ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, sealed = EXCLUDED.sealed, updated_at = EXCLUDED.updated_at;

-- The default egress proxy, sealed; no row when it was never set.
-- name: EgressDefault :one
SELECT value, sealed FROM settings WHERE name = 'egress_proxy';

-- The sealed settings, for a key rotation (controlplane/reseal.go), locked.
-- name: LockSealedSettings :many
SELECT name, sealed FROM settings WHERE sealed IS NOT NULL ORDER BY name FOR UPDATE;

-- name: SealedSettings :many
SELECT name, sealed FROM settings WHERE sealed IS NOT NULL ORDER BY name;

-- name: ResealSetting :execrows
UPDATE settings SET sealed = @sealed WHERE name = @name AND sealed IS NOT NULL;
