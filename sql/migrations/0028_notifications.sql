-- Notifications for operators (docs/notifications.md): the targets events
-- go to, the events raised, one delivery per (event, target), and the
-- watch's last notified state of each thing it watches.

-- A target: a generic webhook (a signed JSON payload) or a Slack-compatible
-- incoming webhook. The URL (Slack's embeds its secret) and the signing
-- secret are sealed like account credentials (seal.Sealer.SealTarget);
-- url_hint is what operators see: the URL's scheme and host.
CREATE TABLE notify_targets (
    id             uuid PRIMARY KEY,
    name           text NOT NULL UNIQUE,
    kind           text NOT NULL CHECK (kind IN ('webhook', 'slack')),
    url_sealed     bytea NOT NULL,
    url_hint       text NOT NULL,
    -- The webhook's HMAC-SHA256 key; NULL for a Slack target.
    secret_sealed  bytea,
    -- The event kinds the target wants; empty is every kind.
    events         text[] NOT NULL DEFAULT '{}',
    created_at     timestamptz NOT NULL
);

-- An event, as raised (notify.Notifier.Enqueue). The same kind and dedup
-- key within the event's dedup window is raised once.
CREATE TABLE notify_events (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind         text NOT NULL,
    dedup_key    text NOT NULL,
    severity     text NOT NULL CHECK (severity IN ('info', 'warning', 'critical')),
    text         text NOT NULL,
    -- Structured fields; never a credential or a secret.
    fields       jsonb NOT NULL,
    created_at   timestamptz NOT NULL
);

CREATE INDEX notify_events_dedup ON notify_events (kind, dedup_key, created_at DESC);
CREATE INDEX notify_events_created_at ON notify_events (created_at);

-- One event's delivery to one target, worked by one River job
-- (notify_delivery): pending until a 2xx (delivered) or its last attempt
-- (failed). last_error is one line without the URL.
CREATE TABLE notify_deliveries (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id      bigint NOT NULL REFERENCES notify_events (id) ON DELETE CASCADE,
    target_id     uuid NOT NULL REFERENCES notify_targets (id) ON DELETE CASCADE,
    status        text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts      integer NOT NULL DEFAULT 0,
    last_error    text NOT NULL DEFAULT '',
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL,
    delivered_at  timestamptz,
    UNIQUE (event_id, target_id)
);

CREATE INDEX notify_deliveries_created_at ON notify_deliveries (created_at DESC, id DESC);
CREATE INDEX notify_deliveries_target ON notify_deliveries (target_id, created_at DESC);

-- The watch's last notified state of each subject (an account, a pool, a
-- breaker; notify.Mark), read and written under one advisory lock per
-- run, so that each transition is notified once whichever control plane
-- runs the check. A subject in its normal state has no row.
CREATE TABLE notify_marks (
    subject     text PRIMARY KEY,
    level       text NOT NULL,
    since       timestamptz NOT NULL,
    notified    boolean NOT NULL,
    updated_at  timestamptz NOT NULL
);
