-- Budgets per key, per team and per agent session.
--
-- A key may belong to a team. A budget belongs to a key or to a team and
-- counts tokens (every token the upstream reported) or nano-dollars at
-- API-equivalent prices, per calendar day, week (from Monday) or month in
-- the budget_time_zone setting's zone, or per session (a cap on each of
-- the key's, or the team's keys', agent sessions).
CREATE TABLE teams (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    name        text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL
);

ALTER TABLE client_keys
    ADD COLUMN team_id  uuid REFERENCES teams (id) ON DELETE SET NULL,
    -- The key or its team has a budget (kept by the control plane when
    -- either changes): its workers then ask Acquire for every request.
    ADD COLUMN budgeted boolean NOT NULL DEFAULT false;
CREATE INDEX client_keys_team_idx ON client_keys (team_id) WHERE team_id IS NOT NULL;

CREATE TABLE budgets (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    key_id      uuid REFERENCES client_keys (id) ON DELETE CASCADE,
    team_id     uuid REFERENCES teams (id) ON DELETE CASCADE,
    unit        text NOT NULL CHECK (unit IN ('tokens', 'usd')),
    period      text NOT NULL CHECK (period IN ('day', 'week', 'month', 'session')),
    -- Tokens, or nano-dollars.
    amount      bigint NOT NULL CHECK (amount > 0),
    created_at  timestamptz NOT NULL,
    CHECK ((key_id IS NULL) <> (team_id IS NULL)),
    UNIQUE NULLS NOT DISTINCT (key_id, team_id, unit, period)
);
CREATE INDEX budgets_key_idx ON budgets (key_id) WHERE key_id IS NOT NULL;
CREATE INDEX budgets_team_idx ON budgets (team_id) WHERE team_id IS NOT NULL;

-- What a budget's scope spent in one period (period_start, in the time
-- zone the period began in), or one session of it (period_start is the
-- epoch, session_key set). Added to in the transaction that stores the
-- route events (controlplane/routes.go), so it counts each request once.
-- notified_percent is the highest threshold already announced (0, 80 or
-- 100), so that each crossing is announced once.
CREATE TABLE budget_spend (
    budget_id         uuid NOT NULL REFERENCES budgets (id) ON DELETE CASCADE,
    period_start      timestamptz NOT NULL,
    session_key       text NOT NULL DEFAULT '',
    tokens            bigint NOT NULL DEFAULT 0,
    nano_usd          bigint NOT NULL DEFAULT 0,
    notified_percent  integer NOT NULL DEFAULT 0,
    updated_at        timestamptz NOT NULL,
    PRIMARY KEY (budget_id, period_start, session_key)
);
CREATE INDEX budget_spend_updated_idx ON budget_spend (updated_at);

-- A key's team or budgeted flag changing reaches every worker like a
-- restriction: cached verifications are dropped, so that a budgeted key's
-- requests start asking Acquire at once.
CREATE TRIGGER client_keys_notify_pool_budgets
    AFTER UPDATE ON client_keys
    FOR EACH ROW
    WHEN (OLD.budgeted IS DISTINCT FROM NEW.budgeted OR OLD.team_id IS DISTINCT FROM NEW.team_id)
    EXECUTE FUNCTION weir_notify_pool_keys();
