-- The tables that grow with every request are partitioned by time, and
-- their retention drops whole partitions instead of deleting rows: a
-- DELETE of a day at 100 requests a second is 8.6 M dead rows for vacuum
-- to find and every index to shed, a DROP TABLE of a partition is a
-- catalog change (docs/performance.md has the figures).
--
--   route_events     by started_at, a partition per UTC day
--   account_history  by at, a partition per UTC day
--   usage_hourly     by hour, a partition per UTC month (kept 400 days by
--                    default: a month per partition keeps their number
--                    small)
--
-- route_events is partitioned by started_at, not recorded_at, because a
-- request's pending event and its final event carry the same started_at
-- (the worker's start of the request, or the control plane's receipt of
-- its first event when a worker sends none) while recorded_at moves with
-- each report: the final event replaces the pending one in place, in the
-- same partition, even when it comes after midnight UTC. An INSERT ... ON
-- CONFLICT DO UPDATE cannot move a row to another partition. The queries
-- that read a range (the requests page, the failed attempts, a session's
-- requests) already bound started_at, so they read only its partitions.
--
-- A unique constraint of a partitioned table must hold its partition key:
-- route_events' request id is unique with its started_at, which a request
-- never changes, and its id with started_at; account_history's id with at.
-- usage_hourly's key holds hour already.
--
-- Each table has a DEFAULT partition: a row of a day (or month) with no
-- partition yet (a clock far off, a database that missed its maintenance)
-- is written there, never refused. weir_partition_maintain, run by the
-- retention job and at every control plane's start, creates the
-- partitions ahead, moves what the default partition holds into
-- partitions of its own, and drops the partitions wholly past retention.

-- weir_partition_name names the partition of p_parent for the p_unit (day
-- or month) that starts at p_start: route_events_p20260131,
-- usage_hourly_p202601. Maintenance drops only partitions so named.
CREATE FUNCTION weir_partition_name(p_parent text, p_unit text, p_start timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_parent || '_p' || to_char(p_start AT TIME ZONE 'UTC', CASE p_unit WHEN 'day' THEN 'YYYYMMDD' ELSE 'YYYYMM' END)
$$;

-- weir_partition_start is the start (UTC) of the p_unit holding p_at.
CREATE FUNCTION weir_partition_start(p_unit text, p_at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT date_trunc(p_unit, p_at, 'UTC')
$$;

-- weir_partition_end is the end of the p_unit starting at p_start, in UTC
-- whatever the session's time zone.
CREATE FUNCTION weir_partition_end(p_unit text, p_start timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE AS $$
    SELECT ((p_start AT TIME ZONE 'UTC') + ('1 ' || p_unit)::interval) AT TIME ZONE 'UTC'
$$;

-- weir_partition_key is the partition key column of p_parent.
CREATE FUNCTION weir_partition_key(p_parent text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT a.attname::text
      FROM pg_partitioned_table pt
      JOIN pg_attribute a ON a.attrelid = pt.partrelid AND a.attnum = pt.partattrs[0]
     WHERE pt.partrelid = p_parent::regclass
$$;

-- weir_partition_create creates the partition of p_parent for the p_unit
-- starting at p_start, unless it exists, and returns whether it did. The
-- rows the default partition holds for that range move into it, in the
-- same transaction: a partition cannot be created over rows of the
-- default partition, and none may be lost.
CREATE FUNCTION weir_partition_create(p_parent text, p_unit text, p_start timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_name  text := weir_partition_name(p_parent, p_unit, p_start);
    v_end   timestamptz := weir_partition_end(p_unit, p_start);
    v_key   text := weir_partition_key(p_parent);
    v_def   text := p_parent || '_default';
    v_held  boolean;
BEGIN
    IF to_regclass(v_name) IS NOT NULL THEN
        RETURN false;
    END IF;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE %I >= $1 AND %I < $2)', v_def, v_key, v_key)
       INTO v_held USING p_start, v_end;
    IF v_held THEN
        EXECUTE format('CREATE TEMP TABLE weir_partition_moving (LIKE %I) ON COMMIT DROP', p_parent);
        EXECUTE format('WITH moved AS (DELETE FROM %I WHERE %I >= $1 AND %I < $2 RETURNING *) '
                       'INSERT INTO weir_partition_moving SELECT * FROM moved', v_def, v_key, v_key)
          USING p_start, v_end;
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)', v_name, p_parent, p_start, v_end);
    IF v_held THEN
        -- The rows keep their ids (route_events' identity is GENERATED ALWAYS).
        EXECUTE format('INSERT INTO %I OVERRIDING SYSTEM VALUE SELECT * FROM weir_partition_moving', p_parent);
        DROP TABLE weir_partition_moving;
    END IF;
    RETURN true;
END;
$$;

-- weir_partition_maintain keeps p_parent's partitions, as of p_now:
--
--   1. each p_unit the default partition holds rows of gets its own
--      partition, the rows moved into it; rows of a p_unit wholly past
--      retention are deleted instead;
--   2. the partitions of the p_unit holding p_now and the p_ahead after it
--      exist;
--   3. the partitions wholly older than p_now - p_keep are dropped
--      (p_keep NULL keeps everything).
--
-- A table with a pending_until column (route_events) keeps a partition,
-- and default rows, holding a pending event: a request in progress stays
-- recorded, whatever its age. Each change waits at most a second for its
-- locks (creating or dropping a partition locks the whole table, and
-- writers queue behind a waiting lock): a change that could not lock is
-- left for the next run, which the default partition makes safe.
-- Returns how many partitions it created and dropped, and how many rows of
-- the default partition it deleted.
CREATE FUNCTION weir_partition_maintain(
    p_parent text, p_unit text, p_now timestamptz, p_ahead integer, p_keep interval,
    OUT created integer, OUT dropped integer, OUT purged bigint
)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_key      text := weir_partition_key(p_parent);
    v_def      text := p_parent || '_default';
    v_cutoff   timestamptz := p_now - p_keep;
    v_pending  boolean;
    v_start    timestamptz;
    v_name     text;
    v_busy     boolean;
    v_n        bigint;
BEGIN
    created := 0; dropped := 0; purged := 0;
    IF p_unit NOT IN ('day', 'month') THEN
        RAISE EXCEPTION 'weir_partition_maintain: unit % is neither day nor month', p_unit;
    END IF;
    PERFORM set_config('lock_timeout', '1s', true);
    v_pending := EXISTS (SELECT 1 FROM pg_attribute
                          WHERE attrelid = p_parent::regclass AND attname = 'pending_until' AND NOT attisdropped);

    -- 1. The default partition's rows.
    FOR v_start IN EXECUTE format('SELECT DISTINCT weir_partition_start(%L, %I) FROM %I ORDER BY 1', p_unit, v_key, v_def) LOOP
        IF weir_partition_end(p_unit, v_start) <= v_cutoff THEN
            EXECUTE format('DELETE FROM %I WHERE %I >= $1 AND %I < $2', v_def, v_key, v_key)
                 || CASE WHEN v_pending THEN ' AND pending_until IS NULL' ELSE '' END
              USING v_start, weir_partition_end(p_unit, v_start);
            GET DIAGNOSTICS v_n = ROW_COUNT;
            purged := purged + v_n;
        ELSE
            BEGIN
                IF weir_partition_create(p_parent, p_unit, v_start) THEN
                    created := created + 1;
                END IF;
            EXCEPTION WHEN lock_not_available THEN
                RAISE NOTICE 'weir_partition_maintain: % busy, % left in the default partition', p_parent, v_start;
            END;
        END IF;
    END LOOP;

    -- 2. Ahead.
    FOR i IN 0..p_ahead LOOP
        v_start := weir_partition_start(p_unit, p_now);
        FOR j IN 1..i LOOP
            v_start := weir_partition_end(p_unit, v_start);
        END LOOP;
        BEGIN
            IF weir_partition_create(p_parent, p_unit, v_start) THEN
                created := created + 1;
            END IF;
        EXCEPTION WHEN lock_not_available THEN
            RAISE NOTICE 'weir_partition_maintain: % busy, % not created yet', p_parent, v_start;
        END;
    END LOOP;

    -- 3. Past retention.
    IF v_cutoff IS NULL THEN
        RETURN;
    END IF;
    FOR v_name IN
        SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = p_parent::regclass
           AND c.relname ~ ('^' || p_parent || '_p[0-9]{' || CASE p_unit WHEN 'day' THEN 8 ELSE 6 END || '}$')
         ORDER BY 1
    LOOP
        v_start := to_timestamp(substr(v_name, length(p_parent) + 3)
                                || CASE p_unit WHEN 'day' THEN '' ELSE '01' END, 'YYYYMMDD')::timestamp AT TIME ZONE 'UTC';
        IF weir_partition_end(p_unit, v_start) > v_cutoff THEN
            CONTINUE;
        END IF;
        IF v_pending THEN
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE pending_until IS NOT NULL)', v_name) INTO v_busy;
            IF v_busy THEN
                CONTINUE;
            END IF;
        END IF;
        BEGIN
            EXECUTE format('DROP TABLE %I', v_name);
            dropped := dropped + 1;
        EXCEPTION WHEN lock_not_available THEN
            RAISE NOTICE 'weir_partition_maintain: % busy, not dropped yet', v_name;
        END;
    END LOOP;
END;
$$;

-- route_events. The old table's indexes and constraints give up their
-- names to the new table's; its rows are copied, then it goes.
ALTER TABLE route_events RENAME TO route_events_pre0036;
ALTER TABLE route_events_pre0036 RENAME CONSTRAINT route_events_pkey TO route_events_pre0036_pkey;
ALTER TABLE route_events_pre0036 DROP CONSTRAINT route_events_key_id_fkey, DROP CONSTRAINT route_events_account_id_fkey;
ALTER SEQUENCE route_events_id_seq RENAME TO route_events_pre0036_id_seq;
DROP INDEX route_events_recorded_at_idx, route_events_account_id_idx, route_events_request_id_key,
    route_events_spilled_idx, route_events_pending_idx, route_events_held, route_events_session_idx,
    route_events_key_idx, route_events_started_idx;

CREATE TABLE route_events (
    id             bigint GENERATED ALWAYS AS IDENTITY,
    request_id     text NOT NULL,
    key_id         uuid REFERENCES client_keys (id) ON DELETE SET NULL,
    account_id     uuid REFERENCES accounts (id) ON DELETE SET NULL,
    surface        text NOT NULL,
    model          text NOT NULL,
    stream         boolean NOT NULL,
    status         integer NOT NULL,
    error_type     text NOT NULL,
    attempts       integer NOT NULL,
    duration_ms    double precision NOT NULL,
    ttfb_ms        double precision,
    input_tokens   bigint NOT NULL,
    output_tokens  bigint NOT NULL,
    started_at     timestamptz NOT NULL,
    recorded_at    timestamptz NOT NULL,
    held_ms        double precision NOT NULL DEFAULT 0,
    hold_count     integer NOT NULL DEFAULT 0,
    failure_stage  text NOT NULL DEFAULT '',
    attempts_json  jsonb NOT NULL DEFAULT '[]',
    spilled_to_metered boolean NOT NULL DEFAULT false,
    pending_until  timestamptz,
    held_since     timestamptz,
    hold_reason    text NOT NULL DEFAULT '',
    next_try_at    timestamptz,
    verdict        text NOT NULL DEFAULT '',
    session_key           text NOT NULL DEFAULT '',
    cache_read_tokens     bigint NOT NULL DEFAULT 0,
    cache_creation_tokens bigint NOT NULL DEFAULT 0,
    reasoning_tokens      bigint NOT NULL DEFAULT 0,
    cost_nano_usd         bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (id, started_at)
) PARTITION BY RANGE (started_at);
CREATE UNIQUE INDEX route_events_request_id_key ON route_events (request_id, started_at);
CREATE INDEX route_events_recorded_at_idx ON route_events (recorded_at DESC);
CREATE INDEX route_events_account_id_idx ON route_events (account_id, recorded_at DESC);
CREATE INDEX route_events_spilled_idx ON route_events (id DESC) WHERE spilled_to_metered;
CREATE INDEX route_events_pending_idx ON route_events (pending_until) WHERE pending_until IS NOT NULL;
CREATE INDEX route_events_held ON route_events (id) WHERE pending_until IS NOT NULL AND held_since IS NOT NULL;
CREATE INDEX route_events_session_idx ON route_events (session_key, started_at) WHERE session_key <> '';
CREATE INDEX route_events_key_idx ON route_events (key_id, started_at);
CREATE INDEX route_events_started_idx ON route_events (started_at DESC, id DESC);

-- The ids go on from the old table's.
SELECT setval(pg_get_serial_sequence('route_events', 'id'), max(id)) FROM route_events_pre0036 HAVING max(id) IS NOT NULL;

-- account_history.
ALTER TABLE account_history RENAME TO account_history_pre0036;
ALTER TABLE account_history_pre0036 RENAME CONSTRAINT account_history_pkey TO account_history_pre0036_pkey;
ALTER TABLE account_history_pre0036 DROP CONSTRAINT account_history_account_id_fkey;
ALTER TABLE account_history_pre0036 ALTER COLUMN id DROP DEFAULT;
ALTER SEQUENCE account_history_id_seq OWNED BY NONE;
DROP INDEX account_history_account_idx, account_history_at_idx;

CREATE TABLE account_history (
    id          bigint NOT NULL DEFAULT nextval('account_history_id_seq'),
    account_id  uuid NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
    at          timestamptz NOT NULL,
    -- cooldown or gate.
    kind        text NOT NULL CHECK (kind IN ('cooldown', 'gate')),
    -- A cooldown's reason (rate_limited, quota_exhausted, …), or the gated
    -- model family.
    reason      text NOT NULL,
    until       timestamptz NOT NULL,
    evidence    jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (id, at)
) PARTITION BY RANGE (at);
ALTER SEQUENCE account_history_id_seq OWNED BY account_history.id;
CREATE INDEX account_history_account_idx ON account_history (account_id, at DESC);
CREATE INDEX account_history_at_idx ON account_history (at);

-- usage_hourly.
ALTER TABLE usage_hourly RENAME TO usage_hourly_pre0036;
ALTER TABLE usage_hourly_pre0036 RENAME CONSTRAINT usage_hourly_pkey TO usage_hourly_pre0036_pkey;
DROP INDEX usage_hourly_key_idx, usage_hourly_account_idx;

CREATE TABLE usage_hourly (
    hour                  timestamptz NOT NULL,
    key_id                uuid NOT NULL,
    account_id            uuid NOT NULL,
    model                 text NOT NULL,
    session_key           text NOT NULL,
    requests              bigint NOT NULL DEFAULT 0,
    input_tokens          bigint NOT NULL DEFAULT 0,
    output_tokens         bigint NOT NULL DEFAULT 0,
    cache_read_tokens     bigint NOT NULL DEFAULT 0,
    cache_creation_tokens bigint NOT NULL DEFAULT 0,
    reasoning_tokens      bigint NOT NULL DEFAULT 0,
    cost_nano_usd         bigint NOT NULL DEFAULT 0,
    -- Tokens of models the price table did not know (priced at zero).
    unpriced_tokens       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, key_id, account_id, model, session_key)
) PARTITION BY RANGE (hour);
CREATE INDEX usage_hourly_key_idx ON usage_hourly (key_id, hour);
CREATE INDEX usage_hourly_account_idx ON usage_hourly (account_id, hour);

-- The default partitions; partitions for every day (month) the old rows
-- cover, and for now and the next days, before the rows are copied: they go straight to their
-- partitions, not through the default one. Retention drops what is past
-- it at the next run.
DO $$
DECLARE
    v_start timestamptz;
BEGIN
    -- (Created here, not as statements of their own, so that the code
    -- generator gives them no models: nothing reads them by name.)
    CREATE TABLE route_events_default PARTITION OF route_events DEFAULT;
    CREATE TABLE account_history_default PARTITION OF account_history DEFAULT;
    CREATE TABLE usage_hourly_default PARTITION OF usage_hourly DEFAULT;
    FOR v_start IN SELECT DISTINCT weir_partition_start('day', started_at) FROM route_events_pre0036 LOOP
        PERFORM weir_partition_create('route_events', 'day', v_start);
    END LOOP;
    FOR v_start IN SELECT DISTINCT weir_partition_start('day', at) FROM account_history_pre0036 LOOP
        PERFORM weir_partition_create('account_history', 'day', v_start);
    END LOOP;
    FOR v_start IN SELECT DISTINCT weir_partition_start('month', hour) FROM usage_hourly_pre0036 LOOP
        PERFORM weir_partition_create('usage_hourly', 'month', v_start);
    END LOOP;
    PERFORM weir_partition_maintain('route_events', 'day', now(), 2, NULL);
    PERFORM weir_partition_maintain('account_history', 'day', now(), 2, NULL);
    PERFORM weir_partition_maintain('usage_hourly', 'month', now(), 1, NULL);
END;
$$;

INSERT INTO route_events OVERRIDING SYSTEM VALUE SELECT * FROM route_events_pre0036;
INSERT INTO account_history SELECT * FROM account_history_pre0036;
INSERT INTO usage_hourly SELECT * FROM usage_hourly_pre0036;

DROP TABLE route_events_pre0036, account_history_pre0036, usage_hourly_pre0036;
