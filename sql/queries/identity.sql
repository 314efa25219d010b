-- name: GetAccountByIdentity :one
SELECT * FROM accounts WHERE provider = @provider AND identity = @identity;

-- name: SetAccountIdentity :one
UPDATE accounts SET identity = @identity WHERE id = @id RETURNING *;

-- Accounts created before identities, whose identity the control plane
-- works out the first time a new account must be compared with them.
-- name: AccountsWithoutIdentity :many
SELECT * FROM accounts WHERE provider = @provider AND identity = '' ORDER BY created_at, id;
