-- name: CreateAccount :one
INSERT INTO accounts (
    id, provider, auth_kind, label, base_url, max_concurrency, priority,
    credential_sealed, credential_hint, upstream_account_id, egress_proxy, egress_proxy_sealed,
    created_at, updated_at
) VALUES (
    @id, @provider, @auth_kind, @label, @base_url, @max_concurrency, @priority,
    @credential_sealed, @credential_hint, @upstream_account_id, @egress_proxy, @egress_proxy_sealed,
    @now, @now
)
RETURNING *;

-- name: GetAccount :one
SELECT * FROM accounts WHERE id = @id;

-- name: GetAccountByLabel :one
SELECT * FROM accounts WHERE label = @label;

-- name: ListAccounts :many
SELECT * FROM accounts ORDER BY label;

-- name: LiveLeaseCounts :many
SELECT account_id, count(*)::integer AS live
FROM leases
WHERE expires_at > @now
GROUP BY account_id;

-- name: LiveCooldowns :many
SELECT * FROM cooldowns WHERE until > @now;

-- name: GetLiveCooldown :one
SELECT * FROM cooldowns WHERE account_id = @account_id AND until > @now;

-- name: UpdateAccount :one
UPDATE accounts SET
    label = coalesce(sqlc.narg('label'), label),
    base_url = coalesce(sqlc.narg('base_url'), base_url),
    max_concurrency = coalesce(sqlc.narg('max_concurrency'), max_concurrency),
    priority = coalesce(sqlc.narg('priority'), priority),
    upstream_account_id = coalesce(sqlc.narg('upstream_account_id'), upstream_account_id),
    updated_at = @now
WHERE id = @id
RETURNING *;

-- The account's egress proxy: '' (the default), 'direct', or the proxy's
-- scheme://host:port with the whole URL sealed.
-- name: SetEgressProxy :one
UPDATE accounts SET
    egress_proxy = @egress_proxy,
    egress_proxy_sealed = @egress_proxy_sealed,
    updated_at = @now
WHERE id = @id
RETURNING *;

-- An account's owner: a client key, a team, or neither (both NULL).
-- name: SetAccountOwner :one
UPDATE accounts SET
    owner_key_id = sqlc.narg('owner_key_id'),
    owner_team_id = sqlc.narg('owner_team_id'),
    updated_at = @now
WHERE id = @id
RETURNING *;

-- The keys and teams that own accounts, for operators: names, and
-- whether an owning key is revoked.
-- name: AccountOwnerNames :many
SELECT k.id, 'key'::text AS kind, k.name, (k.revoked_at IS NOT NULL)::boolean AS revoked
FROM client_keys k
WHERE EXISTS (SELECT 1 FROM accounts a WHERE a.owner_key_id = k.id)
UNION ALL
SELECT t.id, 'team'::text AS kind, t.name, false AS revoked
FROM teams t
WHERE EXISTS (SELECT 1 FROM accounts a WHERE a.owner_team_id = t.id);

-- A new credential gets a new revision, and wipes the verdicts the old one earned.
-- name: ReplaceCredential :one
UPDATE accounts SET
    credential_sealed = @credential_sealed,
    credential_revision = @credential_revision,
    credential_hint = @credential_hint,
    auth_failures = 0,
    broken_reason = NULL,
    broken_at = NULL,
    check_state = 'unverified',
    check_note = NULL,
    updated_at = @now
WHERE id = @id
RETURNING *;

-- name: SetPaused :one
UPDATE accounts SET paused = @paused, updated_at = @now WHERE id = @id RETURNING *;

-- name: ResumeAccount :one
UPDATE accounts SET
    paused = false,
    broken_reason = NULL,
    broken_at = NULL,
    auth_failures = 0,
    quota_backoffs = 0,
    overloaded_at = NULL,
    updated_at = @now
WHERE id = @id
RETURNING *;

-- Deletes an account; its route events keep their rows, without it (route
-- events have no foreign key: migration 0037).
-- name: DeleteAccount :execrows
WITH gone AS (
    DELETE FROM accounts a WHERE a.id = @id RETURNING a.id
)
UPDATE route_events SET account_id = NULL WHERE account_id IN (SELECT g.id FROM gone g);

-- Counts an account-wide quota rejection that carried no usable reset.
-- name: RecordQuotaBackoff :exec
UPDATE accounts SET quota_backoffs = quota_backoffs + 1 WHERE id = @id;

-- Counts consecutive credential rejections; at the threshold the account is
-- marked broken, with the reason an operator reads in `weir accounts list`.
-- name: RecordAuthFailure :one
UPDATE accounts SET
    auth_failures = auth_failures + 1,
    broken_at = CASE WHEN broken_at IS NULL AND auth_failures + 1 >= @threshold::integer THEN @now::timestamptz ELSE broken_at END,
    broken_reason = CASE WHEN broken_at IS NULL AND auth_failures + 1 >= @threshold::integer THEN @reason::text ELSE broken_reason END
WHERE id = @id AND credential_revision = @credential_revision
RETURNING auth_failures, (broken_at IS NOT NULL)::boolean AS broken;

-- The routing cache's accounts (routecache.go): every account, with what
-- routing reads of it (never its credential: the claim reads that), its
-- live cooldown and usage windows. What changes on every request (live
-- leases, waiters) and what a request names (its key, alias and session)
-- are AcquireFacts'; a claim re-checks what must hold.
-- name: RoutingAccounts :many
SELECT a.id, a.label, a.provider, a.auth_kind, a.base_url, a.paused, a.broken_at, a.recovery_probe,
    a.max_concurrency, a.priority, a.last_used_at, a.overloaded_at, a.owner_key_id, a.owner_team_id,
    a.credential_revision,
    c.reason AS cooldown_reason,
    c.transient AS cooldown_transient,
    c.until AS cooldown_until,
    c.written_at AS cooldown_written_at,
    c.evidence AS cooldown_evidence,
    c.quota_kind AS cooldown_quota_kind,
    c.quota_resets_at AS cooldown_quota_resets_at,
    c.quota_window_minutes AS cooldown_quota_window_minutes,
    c.quota_message AS cooldown_quota_message,
    u5.utilization AS five_hour_utilization,
    u5.resets_at AS five_hour_resets_at,
    u7.utilization AS seven_day_utilization,
    u7.resets_at AS seven_day_resets_at
FROM accounts a
LEFT JOIN cooldowns c ON c.account_id = a.id AND c.until > @now
LEFT JOIN usage_windows u5 ON u5.account_id = a.id AND u5.window_name = 'five_hour'
    AND u5.utilization IS NOT NULL AND u5.resets_at > @now
LEFT JOIN usage_windows u7 ON u7.account_id = a.id AND u7.window_name = 'seven_day'
    AND u7.utilization IS NOT NULL AND u7.resets_at > @now
ORDER BY a.label, a.id;

-- RoutingAccounts of the accounts named (an invalidation, a slice of the
-- rolling refresh). A query of its own, not an "all or these" flag: a
-- prepared statement's generic plan for that OR cannot use the primary
-- key, and read the whole pool for every slice.
-- name: RoutingAccountsOf :many
SELECT a.id, a.label, a.provider, a.auth_kind, a.base_url, a.paused, a.broken_at, a.recovery_probe,
    a.max_concurrency, a.priority, a.last_used_at, a.overloaded_at, a.owner_key_id, a.owner_team_id,
    a.credential_revision,
    c.reason AS cooldown_reason,
    c.transient AS cooldown_transient,
    c.until AS cooldown_until,
    c.written_at AS cooldown_written_at,
    c.evidence AS cooldown_evidence,
    c.quota_kind AS cooldown_quota_kind,
    c.quota_resets_at AS cooldown_quota_resets_at,
    c.quota_window_minutes AS cooldown_quota_window_minutes,
    c.quota_message AS cooldown_quota_message,
    u5.utilization AS five_hour_utilization,
    u5.resets_at AS five_hour_resets_at,
    u7.utilization AS seven_day_utilization,
    u7.resets_at AS seven_day_resets_at
FROM accounts a
LEFT JOIN cooldowns c ON c.account_id = a.id AND c.until > @now
LEFT JOIN usage_windows u5 ON u5.account_id = a.id AND u5.window_name = 'five_hour'
    AND u5.utilization IS NOT NULL AND u5.resets_at > @now
LEFT JOIN usage_windows u7 ON u7.account_id = a.id AND u7.window_name = 'seven_day'
    AND u7.utilization IS NOT NULL AND u7.resets_at > @now
WHERE a.id = ANY(@ids::uuid[])
ORDER BY a.label, a.id;

-- The routing cache's live family gates, of every account.
-- name: RoutingGates :many
SELECT account_id, family, until, written_at, evidence FROM family_gates
WHERE until > @now;

-- The live family gates of the accounts named.
-- name: RoutingGatesOf :many
SELECT account_id, family, until, written_at, evidence FROM family_gates
WHERE until > @now AND account_id = ANY(@ids::uuid[]);

-- What one Acquire reads besides the routing cache, in one round trip:
-- the key and alias answers, the settings routing reads, the account the
-- session is bound to, the providers whose breaker for the family is open
-- or probing, the live leases per account and the waiters per account.
-- name: AcquireFacts :one
SELECT
    (SELECT k.id FROM client_keys k WHERE k.key_hash = @key_hash::text AND k.revoked_at IS NULL)::uuid AS key_id,
    (SELECT k.allowed_models FROM client_keys k WHERE k.key_hash = @key_hash::text AND k.revoked_at IS NULL)::text[] AS key_allowed_models,
    coalesce((SELECT k.pinned FROM client_keys k WHERE k.key_hash = @key_hash::text AND k.revoked_at IS NULL), false)::boolean AS key_pinned,
    (SELECT array_agg(ka.account_id) FROM client_key_accounts ka JOIN client_keys k ON k.id = ka.key_id
     WHERE k.key_hash = @key_hash::text AND k.revoked_at IS NULL)::uuid[] AS key_pins,
    coalesce((SELECT k.metered_accounts FROM client_keys k WHERE k.key_hash = @key_hash::text AND k.revoked_at IS NULL), '')::text AS key_metered_accounts,
    coalesce((SELECT s.value FROM settings s WHERE s.name = 'metered_accounts'), '')::text AS metered_setting,
    (SELECT k.team_id FROM client_keys k WHERE k.key_hash = @key_hash::text AND k.revoked_at IS NULL)::uuid AS key_team_id,
    coalesce((SELECT s.value FROM settings s WHERE s.name = 'owned_accounts'), '')::text AS owned_setting,
    (SELECT s.sealed FROM settings s WHERE s.name = 'egress_proxy') AS egress_default_sealed,
    coalesce(
        (SELECT ka.targets FROM key_aliases ka JOIN client_keys kk ON kk.id = ka.key_id WHERE kk.key_hash = @key_hash::text AND ka.alias = @model::text),
        (SELECT ma.targets FROM model_aliases ma WHERE ma.alias = @model::text))::text[] AS alias_targets,
    coalesce(
        (SELECT ka.translate FROM key_aliases ka JOIN client_keys kk ON kk.id = ka.key_id WHERE kk.key_hash = @key_hash::text AND ka.alias = @model::text),
        (SELECT ma.translate FROM model_aliases ma WHERE ma.alias = @model::text), false)::boolean AS alias_translate,
    (SELECT s.account_id FROM session_bindings s
     WHERE s.session_key = @session_key AND @session_key <> '' AND s.last_seen_at > @bound_since)::uuid AS session_account,
    coalesce((SELECT array_agg(ob.provider) FROM overload_breakers ob
              WHERE ob.family = @family AND ob.open_until IS NOT NULL), '{}')::text[] AS breaker_open,
    coalesce(lv.ids, '{}')::uuid[] AS live_ids,
    coalesce(lv.counts, '{}')::integer[] AS live_counts,
    coalesce(wq.ids, '{}')::uuid[] AS waiter_ids,
    coalesce(wq.ahead, '{}')::integer[] AS waiters_ahead,
    coalesce(wq.waiting, '{}')::integer[] AS waiters
FROM (SELECT array_agg(x.account_id) AS ids, array_agg(x.n) AS counts
      FROM (SELECT l.account_id, count(*)::integer AS n FROM leases l
            WHERE l.expires_at > @now GROUP BY l.account_id) x) lv,
     (SELECT array_agg(x.account_id) AS ids, array_agg(x.ahead) AS ahead, array_agg(x.waiting) AS waiting
      FROM (SELECT w.account_id,
                   (count(*) FILTER (WHERE w.since < @waiting_since::timestamptz
                       OR (w.since = @waiting_since::timestamptz AND w.request_id < @request_id::text)))::integer AS ahead,
                   count(*)::integer AS waiting
            FROM lease_waiters w
            WHERE w.seen_at > @waiters_seen_since AND w.request_id <> @request_id::text
            GROUP BY w.account_id) x) wq;

-- The provider took the credential at this revision in a check.
-- name: RecordCheckGood :execrows
UPDATE accounts SET check_state = 'good', check_note = NULL, checked_at = @now::timestamptz
WHERE id = @id AND credential_revision = @credential_revision;

-- Why a check of the credential at this revision has not decided yet.
-- name: RecordCheckNote :execrows
UPDATE accounts SET check_note = @note::text
WHERE id = @id AND credential_revision = @credential_revision AND check_state = 'unverified';
