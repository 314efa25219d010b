-- The state the 429 decision ladder keeps beyond cooldowns: model-family
-- gates, and the step of the adaptive quota backoff.

-- A gate keeps an account out of routing for one model family while it
-- serves the others: a scoped weekly window (seven_day_opus, 7d_oi) is
-- spent while the account-wide windows have room. An expired row is inert.
CREATE TABLE family_gates (
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    family      text NOT NULL,
    until       timestamptz NOT NULL,
    written_at  timestamptz NOT NULL,
    evidence    jsonb NOT NULL,
    PRIMARY KEY (account_id, family)
);

-- Consecutive account-wide quota rejections that carried no usable reset;
-- each doubles the next backoff (30 s up to 5 min). Reset by a success or
-- an operator's resume, like auth_failures.
ALTER TABLE accounts ADD COLUMN quota_backoffs integer NOT NULL DEFAULT 0;
