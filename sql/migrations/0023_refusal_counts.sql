-- Refused requests, counted instead of recorded one by one.
--
-- A request refused before routing (a missing, invalid or unverifiable
-- key, the key's rate limit, the body buffer, a body that did not come in
-- time, bad input, a model the key may not use, too many WebSocket
-- connections) leaves no route event: a client flooding refusals would
-- otherwise write a row per request (tens of thousands a minute, more
-- through HTTP/2 rapid resets). Each worker counts them per key, reason
-- and interval (a minute by default) and reports each count once the
-- interval is over, with its route events: one row per worker, interval,
-- key and reason, however many requests. key_id is the nil uuid when the
-- worker did not know the key. A count reported twice (a batch sent
-- again) is stored once: the row keeps the larger count.
CREATE TABLE refusal_counts (
    interval_start timestamptz NOT NULL,
    key_id         uuid NOT NULL,
    reason         text NOT NULL,
    worker_id      text NOT NULL,
    count          bigint NOT NULL,
    recorded_at    timestamptz NOT NULL,
    PRIMARY KEY (interval_start, key_id, reason, worker_id)
);
CREATE INDEX refusal_counts_key_idx ON refusal_counts (key_id, interval_start DESC);
