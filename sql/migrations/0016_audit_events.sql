-- audit_events records every admin call that can change something
-- (controlplane/audit.go): who declared they made it, with which
-- credential, what it named, a summary of the request that never holds
-- secret material, and how it ended. Rows are kept: nothing prunes them.

CREATE TABLE audit_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL,
    -- Self-declared by the caller (the CLI's Weir-Actor header, the
    -- dashboard's session); the credential is what was checked.
    actor       text NOT NULL,
    credential  text NOT NULL,
    -- The Connect procedure, /weir.v1.AccountService/PauseAccount.
    procedure   text NOT NULL,
    -- The account, key or alias the call named, '' when none is known.
    target      text NOT NULL,
    -- The request's allowlisted fields and the names of the others it set.
    summary     jsonb NOT NULL,
    -- ok, or the Connect error code (invalid_argument, not_found, ...).
    outcome     text NOT NULL,
    peer        text NOT NULL
);

CREATE INDEX audit_events_at ON audit_events (at DESC, id DESC);
