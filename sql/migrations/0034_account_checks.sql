-- An account is checked as soon as it is added (or its credential
-- replaced): one cheap authenticated read, off the RPC's path (a River job
-- enqueued with the account). check_state is what that read found:
-- 'unverified' until it answers, 'good' once the provider took the
-- credential. A rejected credential breaks the account (broken_at), as a
-- rejection on a request does. check_note says why a check has not
-- decided yet (the provider unreachable, the read budget spent).
ALTER TABLE accounts
    ADD COLUMN check_state text NOT NULL DEFAULT 'unverified'
        CHECK (check_state IN ('unverified', 'good')),
    ADD COLUMN check_note  text,
    ADD COLUMN checked_at  timestamptz;

-- Accounts from before checks: one that served a request is known good.
UPDATE accounts SET check_state = 'good', checked_at = last_success_at
WHERE last_success_at IS NOT NULL;
