-- Leases the account if it is still eligible (weir_claim_lease), and
-- reads what the lease carries from the account's row, not from the
-- routing cache the choice was made on: its credential (of the revision
-- claimed), upstream and egress proxy as they are now. No row when the
-- claim failed.
-- name: ClaimLease :one
WITH c AS MATERIALIZED (
    -- Materialized: the claim runs once, whatever the plan.
    SELECT weir_claim_lease(
        sqlc.arg(account_id), sqlc.arg(revision), sqlc.narg(key_id), sqlc.arg(request_id),
        sqlc.arg(model), sqlc.arg(session_key), sqlc.arg(now), sqlc.arg(expires_at)
    )::uuid AS lease_id
)
SELECT c.lease_id::uuid AS lease_id, a.label, a.provider, a.auth_kind, a.base_url,
    a.credential_sealed, a.upstream_account_id, a.egress_proxy, a.egress_proxy_sealed, a.recovery_probe
FROM c JOIN accounts a ON a.id = sqlc.arg(account_id) AND c.lease_id IS NOT NULL;

-- Renews live leases, and lapsed ones while their account has room
-- (weir_renew_leases, 0021_lease_clock.sql). Returns the ids renewed.
-- name: RenewLeases :many
SELECT r::uuid AS id
FROM weir_renew_leases(@ids::uuid[], @now::timestamptz, @expires_at::timestamptz) AS r;

-- Moves the lease clock (0021_lease_clock.sql): after a gap in which no
-- control plane reached Postgres, the leases live when it began are
-- renewed as of now. Returns how many that renewed.
-- name: TickLeaseClock :one
SELECT weir_lease_clock(@now::timestamptz, make_interval(secs => @gap_seconds::float8),
    make_interval(secs => @ttl_seconds::float8))::bigint AS renewed;

-- name: ReleaseLease :one
DELETE FROM leases WHERE leases.id = @id
RETURNING account_id, key_id, model, credential_revision, acquired_at,
    (SELECT provider FROM accounts WHERE accounts.id = leases.account_id)::text AS provider,
    (SELECT auth_kind FROM accounts WHERE accounts.id = leases.account_id)::text AS auth_kind,
    (SELECT quota_backoffs FROM accounts WHERE accounts.id = leases.account_id)::integer AS quota_backoffs,
    (SELECT recovery_probe FROM accounts WHERE accounts.id = leases.account_id)::boolean AS recovery_probe;

-- A lease stops counting at expires_at; the row stays a while so a late
-- Release can still report its outcome. One still here past that was never
-- released: its worker died (or was cut off from every control plane for
-- that long). The request it served is recorded by its pending route
-- event (CloseLostRequests), under the id its client got. Returns how
-- many leases were reaped.
-- name: DeleteLeasesExpiredBefore :execrows
DELETE FROM leases WHERE expires_at < @before;

-- name: SessionAccount :one
SELECT account_id FROM session_bindings
WHERE session_key = @session_key AND last_seen_at > @since;

-- name: DeleteSessionsIdleSince :execrows
DELETE FROM session_bindings WHERE last_seen_at < @since;

-- A success's account-side writes in one statement, for Release's fast
-- path (the lease is already gone): the success record (which ends a
-- recovery probe: the account is back to its cap), an out-of-credits
-- cooldown written before the request was admitted, and the family's
-- overload breaker, which any real answer closes. Returns what changed,
-- for the logs. Sent as a pipelined batch: Release sends one, ReleaseBatch
-- one per account and model family in the call, in one round trip. A busy
-- account's success record is rewritten at most once a second when there
-- is nothing to reset: at hundreds of successes a second the row's lock
-- and its new version are what Acquire's claim waited behind. The lock is
-- FOR NO KEY UPDATE, like the update's own: it must not wait for (or
-- block) the KEY SHARE locks of inserts referencing the account, which a
-- batch of route events takes in its own order (a deadlock otherwise).
-- name: RecordReleaseSuccess :batchone
WITH acct AS (
    UPDATE accounts a SET last_success_at = @now::timestamptz, auth_failures = 0, quota_backoffs = 0,
        recovery_probe = false, overloaded_at = NULL
    FROM (SELECT s.id, s.recovery_probe AS was_probe FROM accounts s
          WHERE s.id = @account_id::uuid
            AND (s.last_success_at IS NULL OR s.last_success_at < @rewrite_before::timestamptz
                 OR s.auth_failures <> 0 OR s.quota_backoffs <> 0 OR s.recovery_probe OR s.overloaded_at IS NOT NULL)
          FOR NO KEY UPDATE) old
    WHERE a.id = old.id
    RETURNING old.was_probe
), credits AS (
    DELETE FROM cooldowns
    WHERE account_id = @account_id::uuid AND reason = 'out_of_credits' AND written_at < @admitted_at::timestamptz
    RETURNING 1
), breaker AS (
    UPDATE overload_breakers
    SET overloads = 0, open_until = NULL, open_count = 0, probe_until = NULL, updated_at = @now::timestamptz,
        seen_accounts = '{}', judged_accounts = '{}', probed_accounts = '{}'
    WHERE @has_family::boolean AND provider = @provider::text AND family = @family::text
      AND (overloads > 0 OR open_until IS NOT NULL OR probe_until IS NOT NULL)
    RETURNING 1
)
SELECT coalesce((SELECT was_probe FROM acct), false)::boolean AS probe_ended,
    (SELECT count(*) FROM credits)::integer AS credits_cleared,
    (SELECT count(*) FROM breaker)::integer AS breakers_closed;

-- ReleaseBatch's one statement: reads every item's lease with what a
-- success needs of its account; ends the leases the items end, and the
-- kept ones that already expired (they no longer count against the cap,
-- so they must not be reused); and keeps the items' sessions alive where
-- they are still bound to the lease's account. A lease that no longer
-- exists is simply not returned.
-- name: SettleLeases :many
WITH found AS (
    SELECT l.id, l.account_id, l.key_id, l.model, l.credential_revision, l.acquired_at,
        (l.expires_at <= @now::timestamptz)::boolean AS expired
    FROM leases l
    WHERE l.id = ANY(@ids::uuid[])
), ended AS (
    DELETE FROM leases l USING found f
    WHERE l.id = f.id AND (f.id = ANY(@end_ids::uuid[]) OR f.expired)
), touched AS (
    UPDATE session_bindings s SET last_seen_at = @now::timestamptz
    FROM unnest(@session_lease_ids::uuid[]) WITH ORDINALITY AS tl(lease_id, n)
    JOIN unnest(@session_keys::text[]) WITH ORDINALITY AS tk(session_key, n) ON tk.n = tl.n
    JOIN found f ON f.id = tl.lease_id
    WHERE s.session_key = tk.session_key AND s.account_id = f.account_id
)
SELECT f.id, f.account_id, f.key_id, f.model, f.credential_revision, f.acquired_at, f.expired,
    a.provider, a.auth_kind, a.quota_backoffs, a.recovery_probe
FROM found f
JOIN accounts a ON a.id = f.account_id;

-- A request waits for a place on these accounts, since @since (kept if
-- it waited earlier).
-- name: WaitFor :exec
INSERT INTO lease_waiters (account_id, request_id, since, seen_at)
SELECT unnest(@account_ids::uuid[]), @request_id::text, @since::timestamptz, @now::timestamptz
ON CONFLICT (account_id, request_id) DO UPDATE
SET seen_at = EXCLUDED.seen_at, since = least(lease_waiters.since, EXCLUDED.since);

-- The request got a place, or left: it waits no more.
-- name: StopWaiting :exec
DELETE FROM lease_waiters WHERE request_id = @request_id;

-- Waiters that stopped asking long ago.
-- name: DeleteStaleWaiters :execrows
DELETE FROM lease_waiters WHERE seen_at < @before;
