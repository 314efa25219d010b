-- Translation between the wires. An alias marked translate may be served
-- by an account of the other wire's provider: a Messages request for it
-- by a Codex or OpenAI account, a Responses or Chat Completions request
-- by an Anthropic account, the request and its answer translated by the
-- data plane. Unmarked (the default, and every alias before this), such a
-- target is refused: translation is never silent.
ALTER TABLE model_aliases ADD COLUMN translate boolean NOT NULL DEFAULT false;

-- A key's own aliases: the same as model_aliases, for one key's requests,
-- which they take before the global alias of the same name (a person may
-- fall back to another wire where the team does not). They go with the
-- key.
CREATE TABLE key_aliases (
    key_id      uuid NOT NULL REFERENCES client_keys (id) ON DELETE CASCADE,
    alias       text NOT NULL CHECK (alias <> ''),
    targets     text[] NOT NULL CHECK (cardinality(targets) > 0),
    translate   boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (key_id, alias)
);

CREATE TRIGGER key_aliases_notify_pool
    AFTER INSERT OR UPDATE OR DELETE ON key_aliases
    FOR EACH ROW EXECUTE FUNCTION weir_notify_pool_wide();
