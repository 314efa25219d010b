-- name: CreateTeam :one
INSERT INTO teams (name, created_at) VALUES (@name, @now::timestamptz) RETURNING *;

-- name: ListTeams :many
SELECT t.*, (SELECT count(*) FROM client_keys k WHERE k.team_id = t.id AND k.revoked_at IS NULL)::integer AS keys
FROM teams t ORDER BY t.name;

-- name: TeamByID :one
SELECT * FROM teams WHERE id = @id;

-- name: TeamByName :one
SELECT * FROM teams WHERE name = @name;

-- name: DeleteTeam :execrows
DELETE FROM teams WHERE id = @id;

-- name: SetKeyTeam :exec
UPDATE client_keys SET team_id = sqlc.narg('team_id') WHERE id = @id;

-- Removes the budgets of a key or of a team (before the new set).
-- name: DeleteBudgets :exec
DELETE FROM budgets
WHERE (sqlc.narg('key_id')::uuid IS NOT NULL AND key_id = sqlc.narg('key_id'))
   OR (sqlc.narg('team_id')::uuid IS NOT NULL AND team_id = sqlc.narg('team_id'));

-- name: InsertBudget :exec
INSERT INTO budgets (key_id, team_id, unit, period, amount, created_at)
VALUES (sqlc.narg('key_id'), sqlc.narg('team_id'), @unit, @period, @amount, @now::timestamptz);

-- Keeps client_keys.budgeted true for exactly the keys that have a
-- budget of their own or through their team (run after any change).
-- name: RefreshBudgeted :exec
UPDATE client_keys k SET budgeted = b.has
FROM (
    SELECT k2.id, EXISTS (
        SELECT 1 FROM budgets b WHERE b.key_id = k2.id OR (k2.team_id IS NOT NULL AND b.team_id = k2.team_id)
    ) AS has
    FROM client_keys k2
) b
WHERE k.id = b.id AND k.budgeted IS DISTINCT FROM b.has;

-- Every budget with its current period's spend at @now (sessions: none):
-- the key's and team's as operators see them.
-- name: ListBudgets :many
WITH tz AS (SELECT coalesce((SELECT value FROM settings WHERE name = 'budget_time_zone'), 'UTC') AS name,
    @now::timestamptz AS now)
SELECT b.id, b.key_id, b.team_id, b.unit, b.period, b.amount, tz.name::text AS time_zone,
    (CASE WHEN b.period = 'session' THEN 'epoch'::timestamptz
          ELSE date_trunc(CASE WHEN b.period = 'session' THEN 'day' ELSE b.period END, tz.now AT TIME ZONE tz.name) AT TIME ZONE tz.name END)::timestamptz AS period_start,
    coalesce(s.tokens, 0)::bigint AS spent_tokens, coalesce(s.nano_usd, 0)::bigint AS spent_nano_usd
FROM budgets b CROSS JOIN tz
LEFT JOIN budget_spend s ON s.budget_id = b.id AND s.session_key = '' AND b.period <> 'session'
    AND s.period_start = date_trunc(CASE WHEN b.period = 'session' THEN 'day' ELSE b.period END, tz.now AT TIME ZONE tz.name) AT TIME ZONE tz.name
ORDER BY b.team_id NULLS FIRST, b.key_id, b.period, b.unit;

-- A key's budgets and its team's, each with what its scope spent in the
-- period @now is in (a session cap: what @session_key spent), for
-- Acquire's check.
-- name: KeyBudgets :many
WITH tz AS (SELECT coalesce((SELECT value FROM settings WHERE name = 'budget_time_zone'), 'UTC') AS name,
    @now::timestamptz AS now),
b AS (
    SELECT b.*, (CASE WHEN b.period = 'session' THEN 'epoch'::timestamptz
        ELSE date_trunc(CASE WHEN b.period = 'session' THEN 'day' ELSE b.period END, tz.now AT TIME ZONE tz.name) AT TIME ZONE tz.name END)::timestamptz AS period_start,
        tz.name AS time_zone
    FROM client_keys ck CROSS JOIN tz
    JOIN budgets b ON b.key_id = ck.id OR (ck.team_id IS NOT NULL AND b.team_id = ck.team_id)
    WHERE ck.id = @key_id
)
SELECT b.id, b.key_id, b.team_id, b.unit, b.period, b.amount, b.period_start, b.time_zone::text AS time_zone,
    coalesce(k.name, '')::text AS key_name, coalesce(t.name, '')::text AS team_name,
    coalesce(s.tokens, 0)::bigint AS spent_tokens, coalesce(s.nano_usd, 0)::bigint AS spent_nano_usd
FROM b
LEFT JOIN client_keys k ON k.id = b.key_id
LEFT JOIN teams t ON t.id = b.team_id
LEFT JOIN budget_spend s ON s.budget_id = b.id AND s.period_start = b.period_start
    AND s.session_key = CASE WHEN b.period = 'session' THEN @session_key::text ELSE '' END;

-- Adds a batch's spend (each final route event's, once) to the budgets of
-- its key and its key's team, in the period each request started in (a
-- session cap: the request's session; a request without one counts to
-- no session cap). Returns the rows it touched, with their budgets, for
-- the threshold check.
-- name: AddBudgetSpend :many
WITH tz AS (SELECT coalesce((SELECT value FROM settings WHERE name = 'budget_time_zone'), 'UTC') AS name),
e AS (
    SELECT * FROM ROWS FROM (
        unnest(@key_ids::uuid[]), unnest(@session_keys::text[]), unnest(@started_ats::timestamptz[]),
        unnest(@tokens::bigint[]), unnest(@nanos_usd::bigint[])
    ) AS e(key_id, session_key, started_at, tokens, nano_usd)
),
d AS (
    SELECT b.id AS budget_id,
        (CASE WHEN b.period = 'session' THEN 'epoch'::timestamptz
              ELSE date_trunc(CASE WHEN b.period = 'session' THEN 'day' ELSE b.period END, e.started_at AT TIME ZONE tz.name) AT TIME ZONE tz.name END)::timestamptz AS period_start,
        (CASE WHEN b.period = 'session' THEN e.session_key ELSE '' END)::text AS session_key,
        sum(e.tokens)::bigint AS tokens, sum(e.nano_usd)::bigint AS nano_usd
    FROM e CROSS JOIN tz
    JOIN client_keys k ON k.id = e.key_id
    JOIN budgets b ON b.key_id = k.id OR (k.team_id IS NOT NULL AND b.team_id = k.team_id)
    WHERE b.period <> 'session' OR e.session_key <> ''
    GROUP BY 1, 2, 3
),
up AS (
    INSERT INTO budget_spend (budget_id, period_start, session_key, tokens, nano_usd, updated_at)
    SELECT budget_id, period_start, session_key, tokens, nano_usd, @now::timestamptz FROM d
    ORDER BY budget_id, period_start, session_key
    ON CONFLICT (budget_id, period_start, session_key) DO UPDATE SET
        tokens = budget_spend.tokens + EXCLUDED.tokens, nano_usd = budget_spend.nano_usd + EXCLUDED.nano_usd,
        updated_at = EXCLUDED.updated_at
    RETURNING *
)
SELECT up.budget_id, up.period_start, up.session_key, up.tokens, up.nano_usd, up.notified_percent,
    b.unit, b.period, b.amount, coalesce(k.name, '')::text AS key_name, coalesce(t.name, '')::text AS team_name
FROM up JOIN budgets b ON b.id = up.budget_id
LEFT JOIN client_keys k ON k.id = b.key_id
LEFT JOIN teams t ON t.id = b.team_id;

-- name: SetBudgetNotified :exec
UPDATE budget_spend SET notified_percent = @percent
WHERE budget_id = @budget_id AND period_start = @period_start AND session_key = @session_key
  AND notified_percent < @percent;

-- Retention: spend rows not touched since @before.
-- name: DeleteBudgetSpendBefore :execrows
DELETE FROM budget_spend WHERE updated_at < @before::timestamptz;

-- Which of these requests the control plane stored as finished: their
-- spend is counted already.
-- name: StoredRequests :many
SELECT request_id FROM route_events
WHERE request_id = ANY(@request_ids::text[]) AND pending_until IS NULL;
