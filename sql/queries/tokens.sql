-- Adds a batch's usage to the hourly rollup (0026_token_usage.sql): one
-- row per hour, key, account, model and session, each column an array.
-- A batch holds each row once (the control plane merges repeats).
-- name: AddUsageHourly :exec
INSERT INTO usage_hourly (hour, key_id, account_id, model, session_key, requests, input_tokens,
    output_tokens, cache_read_tokens, cache_creation_tokens, reasoning_tokens, cost_nano_usd, unpriced_tokens)
SELECT u.hour, u.key_id, u.account_id, u.model, u.session_key, u.requests, u.input_tokens,
    u.output_tokens, u.cache_read_tokens, u.cache_creation_tokens, u.reasoning_tokens, u.cost_nano_usd,
    u.unpriced_tokens
FROM ROWS FROM (
    unnest(@hours::timestamptz[]), unnest(@key_ids::uuid[]), unnest(@account_ids::uuid[]),
    unnest(@models::text[]), unnest(@session_keys::text[]), unnest(@requests::bigint[]),
    unnest(@input_tokens::bigint[]), unnest(@output_tokens::bigint[]), unnest(@cache_read_tokens::bigint[]),
    unnest(@cache_creation_tokens::bigint[]), unnest(@reasoning_tokens::bigint[]),
    unnest(@costs_nano_usd::bigint[]), unnest(@unpriced_tokens::bigint[])
) AS u(hour, key_id, account_id, model, session_key, requests, input_tokens, output_tokens,
    cache_read_tokens, cache_creation_tokens, reasoning_tokens, cost_nano_usd, unpriced_tokens)
ORDER BY u.hour, u.key_id, u.account_id, u.model, u.session_key
ON CONFLICT (hour, key_id, account_id, model, session_key) DO UPDATE SET
    requests = usage_hourly.requests + EXCLUDED.requests,
    input_tokens = usage_hourly.input_tokens + EXCLUDED.input_tokens,
    output_tokens = usage_hourly.output_tokens + EXCLUDED.output_tokens,
    cache_read_tokens = usage_hourly.cache_read_tokens + EXCLUDED.cache_read_tokens,
    cache_creation_tokens = usage_hourly.cache_creation_tokens + EXCLUDED.cache_creation_tokens,
    reasoning_tokens = usage_hourly.reasoning_tokens + EXCLUDED.reasoning_tokens,
    cost_nano_usd = usage_hourly.cost_nano_usd + EXCLUDED.cost_nano_usd,
    unpriced_tokens = usage_hourly.unpriced_tokens + EXCLUDED.unpriced_tokens;

-- Usage summed over [@since, @until), grouped by what the by_ flags name
-- (a column not grouped by comes back as its zero value): the key, the
-- account, the model, the session, and the day or the hour it started in
-- (@tz, an IANA zone, sets where a day begins). @key_id, when set, keeps
-- one key's rows.
-- name: QueryUsage :many
SELECT
    CASE WHEN @by_key::boolean THEN key_id ELSE '00000000-0000-0000-0000-000000000000'::uuid END AS key_id,
    CASE WHEN @by_account::boolean THEN account_id ELSE '00000000-0000-0000-0000-000000000000'::uuid END AS account_id,
    CASE WHEN @by_model::boolean THEN model ELSE '' END::text AS model,
    CASE WHEN @by_session::boolean THEN session_key ELSE '' END::text AS session_key,
    (CASE
        WHEN @by_day::boolean THEN date_trunc('day', hour AT TIME ZONE @tz::text) AT TIME ZONE @tz::text
        WHEN @by_hour::boolean THEN hour
        ELSE @since::timestamptz
    END)::timestamptz AS period_start,
    sum(requests)::bigint AS requests,
    sum(input_tokens)::bigint AS input_tokens,
    sum(output_tokens)::bigint AS output_tokens,
    sum(cache_read_tokens)::bigint AS cache_read_tokens,
    sum(cache_creation_tokens)::bigint AS cache_creation_tokens,
    sum(reasoning_tokens)::bigint AS reasoning_tokens,
    sum(cost_nano_usd)::bigint AS cost_nano_usd,
    sum(unpriced_tokens)::bigint AS unpriced_tokens
FROM usage_hourly
WHERE hour >= @since::timestamptz AND hour < @until::timestamptz
  AND (sqlc.narg('key_id')::uuid IS NULL OR key_id = sqlc.narg('key_id'))
GROUP BY 1, 2, 3, 4, 5
ORDER BY 5, sum(cost_nano_usd) DESC, sum(requests) DESC, 1, 2, 3, 4
LIMIT @max_rows;

-- A key's usage from each of @starts (its day, week and month, each
-- truncated to the hour: the rollup is by the hour) up to @until, the
-- hour @until is in included: one row per start, in their order, zeros
-- when it used nothing.
-- name: KeyUsageSince :many
SELECT p.n::bigint AS n,
    coalesce(sum(u.requests), 0)::bigint AS requests,
    coalesce(sum(u.input_tokens), 0)::bigint AS input_tokens,
    coalesce(sum(u.output_tokens), 0)::bigint AS output_tokens,
    coalesce(sum(u.cache_read_tokens), 0)::bigint AS cache_read_tokens,
    coalesce(sum(u.cache_creation_tokens), 0)::bigint AS cache_creation_tokens,
    coalesce(sum(u.reasoning_tokens), 0)::bigint AS reasoning_tokens,
    coalesce(sum(u.cost_nano_usd), 0)::bigint AS cost_nano_usd,
    coalesce(sum(u.unpriced_tokens), 0)::bigint AS unpriced_tokens
FROM unnest(@starts::timestamptz[]) WITH ORDINALITY AS p(start, n)
LEFT JOIN usage_hourly u ON u.key_id = @key_id AND u.hour >= p.start AND u.hour <= @until::timestamptz
GROUP BY p.n
ORDER BY p.n;

-- name: ListModelPrices :many
SELECT * FROM model_prices ORDER BY pattern;

-- name: PutModelPrice :one
INSERT INTO model_prices (pattern, input_usd, output_usd, cache_read_usd, cache_write_usd, updated_at)
VALUES (@pattern, @input_usd, @output_usd, @cache_read_usd, @cache_write_usd, @now::timestamptz)
ON CONFLICT (pattern) DO UPDATE SET input_usd = EXCLUDED.input_usd, output_usd = EXCLUDED.output_usd,
    cache_read_usd = EXCLUDED.cache_read_usd, cache_write_usd = EXCLUDED.cache_write_usd,
    updated_at = EXCLUDED.updated_at
RETURNING *;

-- name: DeleteModelPrice :execrows
DELETE FROM model_prices WHERE pattern = @pattern;

-- The finished requests of sessions that started in [@since, @until), by
-- session and start, for the prompt-cache account (ExplainCache).
-- name: SessionEvents :many
SELECT request_id, key_id, account_id, surface, session_key, started_at, status, input_tokens,
    cache_read_tokens, cache_creation_tokens, hold_count, attempts_json
FROM route_events
WHERE session_key <> '' AND pending_until IS NULL
  AND started_at >= @since::timestamptz AND started_at < @until::timestamptz
  AND (sqlc.narg('key_id')::uuid IS NULL OR key_id = sqlc.narg('key_id'))
  AND (@session_key::text = '' OR session_key = @session_key::text)
ORDER BY session_key, started_at
LIMIT @max_rows;
