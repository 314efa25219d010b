-- Notifications (controlplane/notify, controlplane/notify.go,
-- jobs/notify.go; docs/notifications.md).

-- name: CreateNotifyTarget :one
INSERT INTO notify_targets (id, name, kind, url_sealed, url_hint, secret_sealed, events, created_at)
VALUES (@id, @name, @kind, @url_sealed, @url_hint, @secret_sealed, @events::text[], @now)
RETURNING *;

-- name: ListNotifyTargets :many
SELECT * FROM notify_targets ORDER BY name;

-- A target by its id or its name.
-- name: GetNotifyTarget :one
SELECT * FROM notify_targets WHERE id::text = @ref::text OR name = @ref::text
ORDER BY (id::text = @ref::text) DESC
LIMIT 1;

-- name: DeleteNotifyTarget :execrows
DELETE FROM notify_targets WHERE id = @id;

-- Serialises the Enqueues of one (kind, dedup key) until their
-- transactions end.
-- name: LockNotifyKey :exec
SELECT pg_advisory_xact_lock(hashtextextended(@key::text, 0));

-- Serialises the watch's runs, whichever control plane runs them.
-- name: LockNotifyWatch :exec
SELECT pg_advisory_xact_lock(@lock_id::bigint);

-- name: RecentNotifyEvent :one
SELECT EXISTS (
    SELECT 1 FROM notify_events
    WHERE kind = @kind AND dedup_key = @dedup_key AND created_at > @since::timestamptz
)::boolean;

-- name: InsertNotifyEvent :one
INSERT INTO notify_events (kind, dedup_key, severity, text, fields, created_at)
VALUES (@kind, @dedup_key, @severity, @text, @fields, @now)
RETURNING id;

-- The targets that want an event of @kind: those naming it, and those
-- naming none (every kind).
-- name: SubscribedNotifyTargets :many
SELECT id FROM notify_targets
WHERE cardinality(events) = 0 OR @kind::text = ANY(events)
ORDER BY name;

-- name: InsertNotifyDeliveries :many
INSERT INTO notify_deliveries (event_id, target_id, created_at, updated_at)
SELECT @event_id::bigint, t, @now::timestamptz, @now::timestamptz FROM unnest(@target_ids::uuid[]) AS t
ON CONFLICT (event_id, target_id) DO NOTHING
RETURNING id;

-- One delivery with what sending it needs: its target's sealed URL and
-- secret, and its event.
-- name: GetNotifyDelivery :one
SELECT d.id, d.status, d.attempts, d.created_at,
    t.id AS target_id, t.name AS target_name, t.kind AS target_kind, t.url_sealed, t.url_hint, t.secret_sealed,
    e.id AS event_id, e.kind AS event_kind, e.dedup_key, e.severity, e.text, e.fields, e.created_at AS event_created_at
FROM notify_deliveries d
JOIN notify_targets t ON t.id = d.target_id
JOIN notify_events e ON e.id = d.event_id
WHERE d.id = @id;

-- name: MarkNotifyDelivered :exec
UPDATE notify_deliveries
SET status = 'delivered', attempts = @attempts, delivered_at = @now::timestamptz, updated_at = @now::timestamptz
WHERE id = @id;

-- A failed attempt: @status is pending while attempts remain, failed after
-- the last. A delivery already delivered stays so.
-- name: RecordNotifyFailure :exec
UPDATE notify_deliveries
SET status = @status, attempts = @attempts, last_error = @last_error, updated_at = @now
WHERE id = @id AND status <> 'delivered';

-- The latest deliveries, newest first; of one target, or one delivery,
-- when named.
-- name: ListNotifyDeliveries :many
SELECT d.id, d.status, d.attempts, d.last_error, d.created_at, d.updated_at, d.delivered_at,
    t.id AS target_id, t.name AS target_name,
    e.kind AS event_kind, e.dedup_key, e.severity, e.text
FROM notify_deliveries d
JOIN notify_targets t ON t.id = d.target_id
JOIN notify_events e ON e.id = d.event_id
WHERE (sqlc.narg('target_id')::uuid IS NULL OR d.target_id = sqlc.narg('target_id')::uuid)
  AND (sqlc.narg('delivery_id')::bigint IS NULL OR d.id = sqlc.narg('delivery_id')::bigint)
ORDER BY d.created_at DESC, d.id DESC
LIMIT @max_rows;

-- Every account as the watch reads it: whether it can serve now for any
-- family, as routing means it (not paused, not broken, no live cooldown,
-- no spent account-wide usage window at @spent_at or above), and its
-- broken state.
-- name: NotifyAccounts :many
SELECT a.id, a.label, a.provider, a.paused, a.broken_at, a.broken_reason,
    EXISTS (SELECT 1 FROM cooldowns c WHERE c.account_id = a.id AND c.until > @now)::boolean AS cooling,
    EXISTS (SELECT 1 FROM usage_windows u
            WHERE u.account_id = a.id AND u.window_name IN ('five_hour', 'seven_day')
              AND u.utilization >= @spent_at::float8 AND u.resets_at > @now)::boolean AS spent
FROM accounts a
ORDER BY a.provider, a.label;

-- name: ListNotifyMarks :many
SELECT * FROM notify_marks ORDER BY subject;

-- name: PutNotifyMark :exec
INSERT INTO notify_marks (subject, level, since, notified, updated_at)
VALUES (@subject, @level, @since, @notified, @now)
ON CONFLICT (subject) DO UPDATE SET
    level = EXCLUDED.level, since = EXCLUDED.since, notified = EXCLUDED.notified, updated_at = EXCLUDED.updated_at;

-- name: DeleteNotifyMarks :exec
DELETE FROM notify_marks WHERE subject = ANY(@subjects::text[]);

-- Events raised before @before, with their deliveries, unless one is
-- still being tried (pending, and attempted since @before: a pending
-- delivery untouched that long lost its job); at most @batch.
-- name: DeleteNotifyEventsBefore :one
WITH doomed AS (
    SELECT e.id FROM notify_events e
    WHERE e.created_at < @before::timestamptz
      AND NOT EXISTS (SELECT 1 FROM notify_deliveries d
                      WHERE d.event_id = e.id AND d.status = 'pending' AND d.updated_at >= @before::timestamptz)
    ORDER BY e.created_at
    LIMIT @batch
), gone AS (
    DELETE FROM notify_events e USING doomed d WHERE e.id = d.id RETURNING 1
)
SELECT count(*)::bigint AS deleted FROM gone;

-- Key rotation ('weir secrets rotate', controlplane/reseal.go): every
-- target's seals, locked for the rotation's transaction.
-- name: LockNotifyTargetSeals :many
SELECT id, name, url_sealed, secret_sealed FROM notify_targets ORDER BY id FOR UPDATE;

-- name: ResealNotifyTarget :exec
UPDATE notify_targets SET url_sealed = @url_sealed, secret_sealed = @secret_sealed WHERE id = @id;
