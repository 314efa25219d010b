-- Banked resets: reset grants an OAuth account may claim to empty its
-- weekly windows. Off unless an operator enables it per account.
ALTER TABLE accounts
    ADD COLUMN banked_resets_enabled boolean NOT NULL DEFAULT false,
    -- The provider organization, for the claim URL; NULL: not set.
    ADD COLUMN org_id text;

-- The grants as the last usage read with include_grants=true saw them.
-- A read replaces an account's grants wholesale.
CREATE TABLE reset_grants (
    account_id uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    grant_id   text NOT NULL,
    program    text NOT NULL,
    -- NULL: never expires.
    expires_at timestamptz,
    -- As the provider spells it: available, used, expired, ...
    status     text NOT NULL,
    seen_at    timestamptz NOT NULL,
    PRIMARY KEY (account_id, grant_id)
);

-- The claim ledger. A row is written pending before the claim is sent; a
-- pending row is replayed with the same request_id (the provider answers a
-- request_id it has seen with its first result and spends nothing).
CREATE TABLE reset_claims (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    grant_id    text NOT NULL,
    program     text NOT NULL,
    request_id  uuid NOT NULL UNIQUE,
    status      text NOT NULL CHECK (status IN ('pending', 'done', 'failed')),
    -- The provider's result (reset, not_limited, ...) or why the call failed.
    result      text,
    created_at  timestamptz NOT NULL,
    finished_at timestamptz
);

CREATE INDEX reset_claims_account_idx ON reset_claims (account_id, created_at DESC);
-- At most one claim in flight per account.
CREATE UNIQUE INDEX reset_claims_one_pending ON reset_claims (account_id) WHERE status = 'pending';
