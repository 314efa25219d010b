-- The overload breaker judges per account first: one account's overloads
-- are that account's trouble (its request retries once, then fails over),
-- and the provider is overloaded only when several of the accounts that
-- can serve are. The breaker keeps which accounts overloaded in its
-- window, and which it probed since it opened, so that the next probe
-- goes to another account.
ALTER TABLE overload_breakers
    -- Accounts with one overload answer in the current window.
    ADD COLUMN seen_accounts uuid[] NOT NULL DEFAULT '{}',
    -- Accounts with two or more: judged overloaded.
    ADD COLUMN judged_accounts uuid[] NOT NULL DEFAULT '{}',
    -- Accounts whose probe failed since the breaker opened.
    ADD COLUMN probed_accounts uuid[] NOT NULL DEFAULT '{}';
