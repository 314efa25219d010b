-- name: GetBreaker :one
SELECT * FROM overload_breakers WHERE provider = @provider AND family = @family;

-- name: LockBreaker :one
SELECT * FROM overload_breakers WHERE provider = @provider AND family = @family FOR UPDATE;

-- name: PutBreaker :exec
INSERT INTO overload_breakers (provider, family, overloads, probe_every_ms, window_start, open_until, open_count, probe_until, updated_at,
    seen_accounts, judged_accounts, probed_accounts)
VALUES (@provider, @family, @overloads, @probe_every_ms, @window_start, sqlc.narg('open_until'), @open_count, sqlc.narg('probe_until'), @now,
    @seen_accounts::uuid[], @judged_accounts::uuid[], @probed_accounts::uuid[])
ON CONFLICT (provider, family) DO UPDATE SET
    probe_every_ms = EXCLUDED.probe_every_ms,
    overloads = EXCLUDED.overloads,
    seen_accounts = EXCLUDED.seen_accounts,
    judged_accounts = EXCLUDED.judged_accounts,
    probed_accounts = EXCLUDED.probed_accounts,
    window_start = EXCLUDED.window_start,
    open_until = EXCLUDED.open_until,
    open_count = EXCLUDED.open_count,
    probe_until = EXCLUDED.probe_until,
    updated_at = EXCLUDED.updated_at;

-- A success closes the breaker; the WHERE keeps the common case a no-op.
-- name: ResetBreaker :exec
UPDATE overload_breakers
SET overloads = 0, open_until = NULL, open_count = 0, probe_until = NULL, updated_at = @now,
    seen_accounts = '{}', judged_accounts = '{}', probed_accounts = '{}'
WHERE provider = @provider AND family = @family
  AND (overloads > 0 OR open_until IS NOT NULL OR probe_until IS NOT NULL);

-- Takes the next probe of an open breaker whose wait has passed: the one
-- after it may go at next_probe, probe_every_ms on (probes already out
-- keep going).
-- name: ClaimProbe :one
UPDATE overload_breakers
SET probe_until = @probe_until, updated_at = @now, open_until = @next_probe
WHERE provider = @provider AND family = @family
  AND open_until IS NOT NULL AND open_until <= @now
RETURNING probed_accounts;

-- A probe that ended without a verdict on the provider's load (a dropped
-- connection, a client that left), or got no lease, gives its turn back:
-- the next request may probe at once.
-- name: FreeProbe :exec
UPDATE overload_breakers SET probe_until = NULL, updated_at = @now, open_until = least(open_until, @now)
WHERE provider = @provider AND family = @family AND probe_until IS NOT NULL AND open_until IS NOT NULL;

-- A probe's account, recorded when its lease is granted so that the next
-- probe, which may go before this one answers, goes elsewhere. restart
-- begins a new round of the pool.
-- name: MarkProbed :exec
UPDATE overload_breakers
SET probed_accounts = CASE WHEN @restart::boolean THEN ARRAY[@account_id::uuid]
        ELSE array_append(array_remove(probed_accounts, @account_id::uuid), @account_id::uuid) END,
    updated_at = @now
WHERE provider = @provider AND family = @family AND open_until IS NOT NULL;

-- How many accounts of a provider could serve the family now (not
-- paused, not broken, not cooling, not gated for it): the breaker's
-- measure of "every account that can serve". An account spent for the
-- week does not make a storm on the others look like one account's.
-- Seats (accounts with an owner) count, whoever may use them under
-- owned_accounts: overload is the provider's condition for the family,
-- one breaker for every key, and a seat's overload answers are evidence
-- of it like any other account's. A key kept from a seat (owners_only)
-- never probes it: its probe routes among the accounts it may use.
-- name: CountServingAccounts :one
SELECT count(*)::integer FROM accounts a
WHERE a.provider = @provider AND NOT a.paused AND a.broken_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM cooldowns c WHERE c.account_id = a.id AND c.until > @now)
  AND NOT EXISTS (SELECT 1 FROM family_gates g WHERE g.account_id = a.id AND g.family = @family AND g.until > @now);

-- Whether another account of the provider answered since: an overloaded
-- account's request then fails over at once instead of retrying it.
-- name: OthersAnswering :one
SELECT EXISTS (
    SELECT 1 FROM accounts a
    WHERE a.provider = @provider AND a.id <> @account_id AND NOT a.paused AND a.broken_at IS NULL
      AND a.last_success_at >= @since::timestamptz
)::boolean;

-- An overload answer's account, remembered until its next success; an
-- account already marked within the last second is not written again (a
-- storm's probes would rewrite its row several times a second).
-- name: MarkOverloaded :exec
UPDATE accounts SET overloaded_at = @now::timestamptz
WHERE id = @id AND (overloaded_at IS NULL OR overloaded_at < @rewrite_before::timestamptz);

-- The open breakers, for operators.
-- name: ListOpenBreakers :many
SELECT * FROM overload_breakers WHERE open_until IS NOT NULL ORDER BY provider, family;
