-- The integrity check (jobs/integrity.go): its reports, and what it needs
-- to know how long an account has been waiting for its recovery probe.

-- One row per run of the integrity check, the last 100 kept. findings is
-- a JSON array of {kind, action, count, accounts}: labels and reasons,
-- never secrets.
CREATE TABLE integrity_reports (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ran_at    timestamptz NOT NULL,
    findings  jsonb NOT NULL
);

-- When the integrity check first saw the account's recovery probe pending
-- with nothing in flight. The trigger below forgets it whenever the probe
-- mark changes, so the age always belongs to the current mark; the clock
-- is the control plane's, not the database's.
ALTER TABLE accounts ADD COLUMN recovery_probe_seen_at timestamptz;

CREATE FUNCTION weir_recovery_probe_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.recovery_probe_seen_at = NULL;
    RETURN NEW;
END;
$$;

CREATE TRIGGER accounts_recovery_probe_changed
    BEFORE UPDATE OF recovery_probe ON accounts
    FOR EACH ROW
    WHEN (OLD.recovery_probe IS DISTINCT FROM NEW.recovery_probe)
    EXECUTE FUNCTION weir_recovery_probe_changed();
