-- name: GetBreaker :one
SELECT * FROM overload_breakers WHERE provider = @provider AND family = @family;

-- name: LockBreaker :one
SELECT * FROM overload_breakers WHERE provider = @provider AND family = @family FOR UPDATE;

-- name: PutBreaker :exec
INSERT INTO overload_breakers (provider, family, overloads, window_start, open_until, open_count, probe_until, updated_at,
    seen_accounts, judged_accounts, probed_accounts)
VALUES (@provider, @family, @overloads, @window_start, sqlc.narg('open_until'), @open_count, sqlc.narg('probe_until'), @now,
    @seen_accounts::uuid[], @judged_accounts::uuid[], @probed_accounts::uuid[])
ON CONFLICT (provider, family) DO UPDATE SET
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

-- Takes the one probe slot of an open breaker whose wait has passed.
-- name: ClaimProbe :one
UPDATE overload_breakers SET probe_until = @probe_until, updated_at = @now
WHERE provider = @provider AND family = @family
  AND open_until IS NOT NULL AND open_until <= @now
  AND (probe_until IS NULL OR probe_until <= @now)
RETURNING probe_until;

-- A probe that ended without a verdict on the provider's load (a dropped
-- connection, a client that left) gives its slot back.
-- name: FreeProbe :exec
UPDATE overload_breakers SET probe_until = NULL, updated_at = @now
WHERE provider = @provider AND family = @family AND probe_until IS NOT NULL;

-- How many accounts of a provider could serve at all (not paused, not
-- broken): the breaker's measure of "every account that can serve".
-- name: CountServingAccounts :one
SELECT count(*)::integer FROM accounts WHERE provider = @provider AND NOT paused AND broken_at IS NULL;
