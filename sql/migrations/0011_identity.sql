-- The upstream identity of an account: a stable, non-secret name of the
-- upstream account its credential belongs to (Codex: the ChatGPT account
-- id; Claude OAuth: the profile's account uuid, else a hash of the token;
-- API keys: a hash of the key). Two accounts of one provider with the same
-- identity would be one upstream account counted twice, so the pool
-- refuses the second. '' means not known yet (accounts from before 0011
-- whose credential only the control plane can unseal).
ALTER TABLE accounts ADD COLUMN identity text NOT NULL DEFAULT '';

-- Codex accounts already name their ChatGPT account; when two do, the
-- older keeps the identity and the younger stays unnamed.
UPDATE accounts a SET identity = a.upstream_account_id
WHERE a.provider = 'codex' AND a.upstream_account_id <> ''
  AND NOT EXISTS (
    SELECT 1 FROM accounts b
    WHERE b.provider = 'codex' AND b.upstream_account_id = a.upstream_account_id
      AND (b.created_at, b.id) < (a.created_at, a.id)
  );

CREATE UNIQUE INDEX accounts_provider_identity ON accounts (provider, identity) WHERE identity <> '';
