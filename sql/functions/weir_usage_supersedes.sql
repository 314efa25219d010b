-- weir_usage_supersedes says whether a usage reading (new_*) replaces the
-- one stored for the same account and window (old_*): the rule both
-- UpsertUsageWindow and UpsertUsageWindows store by, kept in one place.
-- A newer credential revision or poll epoch replaces what is stored;
-- under the same one, a reading without a reset, a stored one without a
-- reset or a utilization, or a reset more than 2 s away (another window)
-- replaces, and within the same window the higher utilization stays.
-- controlplane/usage.go supersedes is the same rule within one revision
-- and epoch, for folding a batch before it is stored (usagefold_test.go
-- checks the two agree).
--
-- A single SQL expression, IMMUTABLE and not STRICT: the planner inlines
-- it into the statements' ON CONFLICT clauses.
--
-- This file is the function's one definition. internal/migrate applies it
-- after the numbered migrations whenever its text changes; edit it here and
-- never redefine it in a migration (TestFunctionsNotRedefined).
CREATE OR REPLACE FUNCTION weir_usage_supersedes(
    new_revision    bigint,
    new_epoch       bigint,
    new_resets_at   timestamptz,
    new_utilization double precision,
    old_revision    bigint,
    old_epoch       bigint,
    old_resets_at   timestamptz,
    old_utilization double precision
) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT (new_revision, new_epoch) > (old_revision, old_epoch)
        OR ((new_revision, new_epoch) = (old_revision, old_epoch)
            AND (old_resets_at IS NULL OR new_resets_at IS NULL
                 OR abs(extract(epoch FROM new_resets_at - old_resets_at)) > 2
                 OR old_utilization IS NULL
                 OR new_utilization > old_utilization))
$$;
