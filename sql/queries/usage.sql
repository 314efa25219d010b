-- The usage view of OAuth accounts. The read budget (150 s between two
-- reads of one account, whoever reads) is written here and nowhere else.

-- Claims the right to read an account's usage endpoint now: at most once in
-- 150 s per account, never while the endpoint asked us to wait, and only
-- under the credential the caller is about to use. No row: refused.
-- name: ClaimUsageRead :one
UPDATE usage_polls SET last_read_at = sqlc.arg(now)::timestamptz
WHERE account_id = @account_id
  AND credential_revision = @credential_revision
  AND (last_read_at IS NULL OR last_read_at <= sqlc.arg(now)::timestamptz - interval '150 seconds')
  AND (blocked_until IS NULL OR blocked_until <= sqlc.arg(now)::timestamptz)
RETURNING epoch, failures;

-- When the budget allows the next read of an account.
-- name: UsageReadAllowedAt :one
SELECT greatest(sqlc.arg(now)::timestamptz, last_read_at + interval '150 seconds', blocked_until)::timestamptz AS allowed_at
FROM usage_polls WHERE account_id = @account_id;

-- Ends a read that the endpoint answered, under the epoch it was claimed
-- in. It runs last in the transaction that stored the readings and takes
-- the row lock: no row means the epoch moved on, and the readings are
-- rolled back.
-- name: RecordUsageSuccess :execrows
UPDATE usage_polls SET
    last_ok_at = sqlc.arg(now)::timestamptz,
    failures = 0,
    blocked_until = NULL,
    last_error = NULL,
    next_read_at = greatest(@next_read_at::timestamptz, last_read_at + interval '150 seconds')
WHERE account_id = @account_id AND epoch = @epoch AND credential_revision = @credential_revision;

-- A failed read backs off whatever the epoch: the endpoint limits the
-- account, not the credential.
-- name: RecordUsageFailure :exec
UPDATE usage_polls SET
    failures = failures + 1,
    last_error = @last_error::text,
    blocked_until = greatest(blocked_until, @blocked_until::timestamptz),
    next_read_at = greatest(@blocked_until::timestamptz, last_read_at + interval '150 seconds')
WHERE account_id = @account_id;

-- Stores one window's reading. It lands only under the account's current
-- credential revision (and, for a poll, the epoch its read was claimed in),
-- and only where it is news: a newer revision or epoch replaces what is
-- stored; under the same one, a different reset (a new window) replaces,
-- and the same window (resets within 2 s) keeps the higher utilization
-- (weir_usage_supersedes). Only OAuth accounts have usage windows.
-- name: UpsertUsageWindow :execrows
INSERT INTO usage_windows AS w (
    account_id, window_name, utilization, resets_at, source, observed_at, credential_revision, poll_epoch
)
SELECT p.account_id, @window_name::text, sqlc.narg('utilization')::double precision, sqlc.narg('resets_at')::timestamptz,
       @source::text, sqlc.arg(now)::timestamptz, p.credential_revision, p.epoch
FROM usage_polls p
JOIN accounts a ON a.id = p.account_id
WHERE p.account_id = @account_id
  AND a.auth_kind = 'oauth'
  AND p.credential_revision = @credential_revision
  AND (sqlc.narg('epoch')::bigint IS NULL OR p.epoch = sqlc.narg('epoch')::bigint)
ON CONFLICT (account_id, window_name) DO UPDATE SET
    utilization = EXCLUDED.utilization,
    resets_at = EXCLUDED.resets_at,
    source = EXCLUDED.source,
    observed_at = EXCLUDED.observed_at,
    credential_revision = EXCLUDED.credential_revision,
    poll_epoch = EXCLUDED.poll_epoch
WHERE weir_usage_supersedes(EXCLUDED.credential_revision, EXCLUDED.poll_epoch, EXCLUDED.resets_at, EXCLUDED.utilization,
    w.credential_revision, w.poll_epoch, w.resets_at, w.utilization);

-- Stores a batch of readings from released answers' headers, one row per
-- account and window (the caller folds a batch's readings of one window
-- into one, and sorts them by account and window, the order their rows are
-- locked in). Each lands as UpsertUsageWindow's would: only under the
-- account's current credential revision, in its current epoch, and only
-- over an older reading, one of another window, or a lower utilization.
-- A NULL utilization or reset is sent as a false has_ flag.
-- name: UpsertUsageWindows :execrows
INSERT INTO usage_windows AS w (
    account_id, window_name, utilization, resets_at, source, observed_at, credential_revision, poll_epoch
)
SELECT r.account_id, r.window_name, CASE WHEN r.has_utilization THEN r.utilization END,
       CASE WHEN r.has_resets_at THEN r.resets_at END, @source::text, sqlc.arg(now)::timestamptz,
       p.credential_revision, p.epoch
FROM ROWS FROM (
    unnest(@account_ids::uuid[]), unnest(@window_names::text[]), unnest(@has_utilization::boolean[]),
    unnest(@utilizations::double precision[]), unnest(@has_resets_at::boolean[]),
    unnest(@resets_ats::timestamptz[]), unnest(@credential_revisions::bigint[])
) WITH ORDINALITY AS r(account_id, window_name, has_utilization, utilization, has_resets_at, resets_at,
    credential_revision, ord)
JOIN usage_polls p ON p.account_id = r.account_id AND p.credential_revision = r.credential_revision
JOIN accounts a ON a.id = r.account_id
WHERE a.auth_kind = 'oauth'
ORDER BY r.ord
ON CONFLICT (account_id, window_name) DO UPDATE SET
    utilization = EXCLUDED.utilization,
    resets_at = EXCLUDED.resets_at,
    source = EXCLUDED.source,
    observed_at = EXCLUDED.observed_at,
    credential_revision = EXCLUDED.credential_revision,
    poll_epoch = EXCLUDED.poll_epoch
WHERE weir_usage_supersedes(EXCLUDED.credential_revision, EXCLUDED.poll_epoch, EXCLUDED.resets_at, EXCLUDED.utilization,
    w.credential_revision, w.poll_epoch, w.resets_at, w.utilization);

-- A poll that reports a window as absent removes what was stored for it.
-- name: DeleteUsageWindow :exec
DELETE FROM usage_windows WHERE account_id = @account_id AND window_name = @window_name;

-- Gives every OAuth account (Anthropic or Codex) without a next read one, spread evenly over
-- the next spread_seconds (at boot, and for new accounts or credentials),
-- never inside the read budget.
-- name: StaggerUnscheduledUsagePolls :execrows
UPDATE usage_polls p SET next_read_at = greatest(
    sqlc.arg(now)::timestamptz + make_interval(secs => sqlc.arg(spread_seconds)::float8 * s.i / s.n),
    p.last_read_at + interval '150 seconds',
    p.blocked_until)
FROM (
    SELECT q.account_id,
           (row_number() OVER (ORDER BY q.account_id) - 1)::float8 AS i,
           (count(*) OVER ())::float8 AS n
    FROM usage_polls q
    JOIN accounts a ON a.id = q.account_id
    WHERE q.next_read_at IS NULL AND a.auth_kind = 'oauth' AND a.provider IN ('anthropic', 'codex')
) s
WHERE p.account_id = s.account_id AND p.next_read_at IS NULL;

-- The OAuth accounts due a read, oldest first: Anthropic logins and
-- Codex (ChatGPT) logins; OpenAI API keys have no usage endpoint.
-- name: DueUsagePolls :many
SELECT p.account_id
FROM usage_polls p
JOIN accounts a ON a.id = p.account_id
WHERE a.auth_kind = 'oauth'
  AND a.provider IN ('anthropic', 'codex')
  AND a.broken_at IS NULL
  AND p.next_read_at <= sqlc.arg(now)::timestamptz
ORDER BY p.next_read_at
LIMIT @max_reads::integer;

-- Moves a refused read to when the budget allows it.
-- name: DeferUsagePoll :exec
UPDATE usage_polls
SET next_read_at = greatest(next_read_at, last_read_at + interval '150 seconds', blocked_until)
WHERE account_id = @account_id;

-- Starts a new epoch (a quota cooldown wants a fresh reading): reads
-- claimed before never land, and the next read is scheduled for
-- next_read_at, within the budget.
-- name: RearmUsagePoll :one
UPDATE usage_polls SET
    epoch = epoch + 1,
    next_read_at = greatest(@next_read_at::timestamptz, last_read_at + interval '150 seconds', blocked_until)
WHERE account_id = @account_id
RETURNING epoch;

-- The usage view of every account (account_id NULL) or of one: a row per
-- stored window, or one row with no window for an account without any.
-- name: UsageView :many
SELECT p.account_id, p.last_ok_at,
       w.window_name, w.utilization, w.resets_at, w.source, w.observed_at
FROM usage_polls p
LEFT JOIN usage_windows w ON w.account_id = p.account_id
WHERE sqlc.narg('account_id')::uuid IS NULL OR p.account_id = sqlc.narg('account_id')::uuid
ORDER BY p.account_id, w.window_name;

-- name: GetUsagePoll :one
SELECT * FROM usage_polls WHERE account_id = @account_id;

-- name: SnapshotUsage :execrows
INSERT INTO usage_snapshots (account_id, window_name, utilization, resets_at, taken_at)
SELECT account_id, window_name, utilization, resets_at, sqlc.arg(now)::timestamptz FROM usage_windows
ON CONFLICT DO NOTHING;

-- name: DeleteUsageSnapshotsBefore :execrows
DELETE FROM usage_snapshots WHERE taken_at < @before::timestamptz;
