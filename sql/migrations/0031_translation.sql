-- Translation between the wires. An alias marked translate may be served
-- by an account of the other wire's provider: a Messages request for it
-- by a Codex or OpenAI account, a Responses or Chat Completions request
-- by an Anthropic account, the request and its answer translated by the
-- data plane. Unmarked (the default, and every alias before this), such a
-- target is refused: translation is never silent.
ALTER TABLE model_aliases ADD COLUMN translate boolean NOT NULL DEFAULT false;
