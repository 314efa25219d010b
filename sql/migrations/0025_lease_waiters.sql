-- Held requests are served in turn. A request that found every account it
-- could use at its cap waits on those accounts here, in the order it
-- began to wait (since, then its id). Routing counts, per account, the
-- live waiters ahead of a request as places already promised
-- (policy.Candidate.Waiting): a later arrival on any worker does not take
-- a place that frees while an earlier one waits for it. A waiter that
-- stops asking (its client left, its worker died) drops out once its
-- seen_at is older than the control plane's waiter TTL, and the reaper
-- deletes it.
CREATE TABLE lease_waiters (
    account_id uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    request_id text NOT NULL,
    since      timestamptz NOT NULL,
    seen_at    timestamptz NOT NULL,
    PRIMARY KEY (account_id, request_id)
);

CREATE INDEX lease_waiters_request ON lease_waiters (request_id);

-- A new waiter on an account: workers stop reusing that account's idle
-- leases (a reused lease would hand a later arrival the place), and give
-- them back.
CREATE TRIGGER lease_waiters_notify_pool
    AFTER INSERT ON lease_waiters
    FOR EACH ROW EXECUTE FUNCTION weir_notify_pool_account();
