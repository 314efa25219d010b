-- name: InsertAccountHistory :exec
INSERT INTO account_history (account_id, at, kind, reason, until, evidence)
VALUES (@account_id, @at::timestamptz, @kind, @reason, @until::timestamptz, @evidence::jsonb);

-- An account's history, the latest first.
-- name: ListAccountHistory :many
SELECT * FROM account_history WHERE account_id = @account_id ORDER BY at DESC, id DESC LIMIT @max_rows;

-- Account history written before @before, in batches (the retention job).
-- name: DeleteAccountHistoryBefore :one
WITH doomed AS (
    SELECT id FROM account_history WHERE at < @before::timestamptz ORDER BY at LIMIT @batch
), gone AS (
    DELETE FROM account_history h USING doomed d WHERE h.id = d.id RETURNING 1
)
SELECT count(*)::bigint AS deleted FROM gone;
