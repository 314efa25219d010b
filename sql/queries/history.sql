-- name: InsertAccountHistory :exec
INSERT INTO account_history (account_id, at, kind, reason, until, evidence)
VALUES (@account_id, @at::timestamptz, @kind, @reason, @until::timestamptz, @evidence::jsonb);

-- An account's history, the latest first.
-- name: ListAccountHistory :many
SELECT * FROM account_history WHERE account_id = @account_id ORDER BY at DESC, id DESC LIMIT @max_rows;
