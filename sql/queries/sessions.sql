-- name: CreateDashboardSession :exec
INSERT INTO dashboard_sessions (id_hash, person, credential, created_at, expires_at)
VALUES (@id_hash, @person, @credential, @created_at, @expires_at);

-- name: GetDashboardSession :one
-- A live session: neither revoked nor expired.
SELECT person, credential, expires_at FROM dashboard_sessions
WHERE id_hash = @id_hash AND revoked_at IS NULL AND expires_at > @now;

-- name: RevokeDashboardSession :exec
UPDATE dashboard_sessions SET revoked_at = @now WHERE id_hash = @id_hash AND revoked_at IS NULL;

-- name: DeleteExpiredDashboardSessions :exec
-- Run at each sign-in: a revoked session's row is kept until its expiry,
-- when its cookie would be refused anyway.
DELETE FROM dashboard_sessions WHERE expires_at <= @now;
