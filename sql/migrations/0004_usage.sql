-- Usage windows of OAuth accounts: the current reading per window, the read
-- budget of the upstream usage endpoint, and the history.
--
-- The window name column is window_name: WINDOW is a reserved word.

-- The read state of each account's usage endpoint. Every account has a
-- row from its creation on (the triggers below keep it), so the read budget
-- is one compare-and-set on an existing row.
CREATE TABLE usage_polls (
    account_id     uuid PRIMARY KEY REFERENCES accounts (id) ON DELETE CASCADE,
    -- The account's credential revision, kept here by the triggers below so
    -- that the epoch and the revision a reading is fenced by sit on one row.
    credential_revision bigint NOT NULL,
    -- The last read claimed (whatever its result). No read is claimed
    -- within 150 s of it, by any replica, poller or operator.
    last_read_at   timestamptz,
    -- The last read that answered 200.
    last_ok_at     timestamptz,
    -- When the poller reads next; NULL until the poller schedules it.
    next_read_at   timestamptz,
    -- Consecutive failed reads; sets the backoff.
    failures       integer NOT NULL DEFAULT 0,
    -- No read before this (the endpoint's retry-after, or our backoff).
    blocked_until  timestamptz,
    -- Bumped when the credential changes or a quota cooldown re-arms
    -- polling: a read claimed under an older epoch never lands.
    epoch          bigint NOT NULL DEFAULT 1,
    -- Why the last read failed, without secrets; NULL after a success.
    last_error     text
);
CREATE INDEX usage_polls_next_read_at_idx ON usage_polls (next_read_at);

-- The current reading per account and window. A window without evidence
-- has no row, or a NULL utilization: never 0.
CREATE TABLE usage_windows (
    account_id           uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    -- five_hour, seven_day, seven_day_opus, seven_day_sonnet, seven_day_oauth_apps
    window_name          text NOT NULL,
    -- A fraction, 0..1.
    utilization          double precision CHECK (utilization >= 0 AND utilization <= 1),
    resets_at            timestamptz,
    source               text NOT NULL CHECK (source IN ('poll', 'header')),
    observed_at          timestamptz NOT NULL,
    -- The credential revision and poll epoch the reading was taken under.
    credential_revision  bigint NOT NULL,
    poll_epoch           bigint NOT NULL,
    PRIMARY KEY (account_id, window_name)
);

-- History of usage_windows, copied every few minutes, kept 14 days.
CREATE TABLE usage_snapshots (
    account_id   uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    window_name  text NOT NULL,
    utilization  double precision,
    resets_at    timestamptz,
    taken_at     timestamptz NOT NULL,
    PRIMARY KEY (account_id, window_name, taken_at)
);
CREATE INDEX usage_snapshots_taken_at_idx ON usage_snapshots (taken_at);

INSERT INTO usage_polls (account_id, credential_revision)
SELECT id, credential_revision FROM accounts;

CREATE FUNCTION weir_usage_account_created() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO usage_polls (account_id, credential_revision)
    VALUES (NEW.id, NEW.credential_revision);
    RETURN NULL;
END;
$$;

CREATE TRIGGER accounts_usage_account_created
    AFTER INSERT ON accounts
    FOR EACH ROW
    EXECUTE FUNCTION weir_usage_account_created();

-- A new credential starts a new poll epoch, whoever replaces it (an
-- operator, a token refresh), in the same transaction: a read in flight
-- under the old credential must not land, and the poller reads again soon.
-- blocked_until stays: the endpoint limits the account, not the token.
CREATE FUNCTION weir_usage_credential_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE usage_polls
       SET credential_revision = NEW.credential_revision,
           epoch = epoch + 1,
           next_read_at = NULL,
           failures = 0
     WHERE account_id = NEW.id;
    RETURN NULL;
END;
$$;

CREATE TRIGGER accounts_usage_credential_changed
    AFTER UPDATE OF credential_revision ON accounts
    FOR EACH ROW
    WHEN (OLD.credential_revision IS DISTINCT FROM NEW.credential_revision)
    EXECUTE FUNCTION weir_usage_credential_changed();
