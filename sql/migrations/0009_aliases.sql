-- Model aliases: a name clients may ask for that routing resolves to the
-- first of its concrete model ids with an eligible account. A concrete
-- model id never changes.
CREATE TABLE model_aliases (
    alias       text PRIMARY KEY CHECK (alias <> ''),
    -- Concrete model ids, in the order routing tries them.
    targets     text[] NOT NULL CHECK (cardinality(targets) > 0),
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);
