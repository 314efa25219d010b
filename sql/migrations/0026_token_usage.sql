-- Who used what: every request's tokens and cost, kept.
--
-- A route event carries the request's whole usage (summed over its
-- attempts, in weir.v1.TokenUsage's vocabulary: input_tokens is input
-- neither read from nor written to the prompt cache), its session and its
-- cost at API-equivalent prices (nano-dollars: integers add up exactly;
-- a token of the cheapest cache read is still a whole number of them).
ALTER TABLE route_events
    ADD COLUMN session_key           text NOT NULL DEFAULT '',
    ADD COLUMN cache_read_tokens     bigint NOT NULL DEFAULT 0,
    ADD COLUMN cache_creation_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN reasoning_tokens      bigint NOT NULL DEFAULT 0,
    ADD COLUMN cost_nano_usd         bigint NOT NULL DEFAULT 0;
-- A session's requests in order, for the prompt-cache account.
CREATE INDEX route_events_session_idx ON route_events (session_key, started_at) WHERE session_key <> '';
CREATE INDEX route_events_key_idx ON route_events (key_id, started_at);

-- usage_hourly rolls usage up by the hour the request started in, key,
-- account, the model it was served as, and session, in the same
-- transaction that stores the route events (controlplane/routes.go
-- storeRoutes): a batch a worker sends again adds nothing (only events
-- stored for the first time as final are added), and nothing is lost on
-- any restart. An attempt's tokens go to the account that served the
-- attempt; the request counts once, for its last attempt's account.
-- The nil uuid stands for "no key" and "no account" (a key id is kept
-- when the key is later deleted: the usage stays). Kept usage_retention
-- (jobs/retention.go), much longer than the route events.
CREATE TABLE usage_hourly (
    hour                  timestamptz NOT NULL,
    key_id                uuid NOT NULL,
    account_id            uuid NOT NULL,
    model                 text NOT NULL,
    session_key           text NOT NULL,
    requests              bigint NOT NULL DEFAULT 0,
    input_tokens          bigint NOT NULL DEFAULT 0,
    output_tokens         bigint NOT NULL DEFAULT 0,
    cache_read_tokens     bigint NOT NULL DEFAULT 0,
    cache_creation_tokens bigint NOT NULL DEFAULT 0,
    reasoning_tokens      bigint NOT NULL DEFAULT 0,
    cost_nano_usd         bigint NOT NULL DEFAULT 0,
    -- Tokens of models the price table did not know (priced at zero).
    unpriced_tokens       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, key_id, account_id, model, session_key)
);
CREATE INDEX usage_hourly_key_idx ON usage_hourly (key_id, hour);
CREATE INDEX usage_hourly_account_idx ON usage_hourly (account_id, hour);

-- An operator's prices, over the table weir ships (internal/pricing):
-- dollars per million tokens for one model, or for every model a pattern
-- ending in * matches.
CREATE TABLE model_prices (
    pattern          text PRIMARY KEY,
    input_usd        double precision NOT NULL,
    output_usd       double precision NOT NULL,
    cache_read_usd   double precision NOT NULL,
    cache_write_usd  double precision NOT NULL,
    updated_at       timestamptz NOT NULL
);
