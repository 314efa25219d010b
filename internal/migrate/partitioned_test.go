package migrate_test

import (
	"testing"

	"github.com/weirhq/weir/internal/migrate"
	"github.com/weirhq/weir/internal/pgtest"
)

// TestPartitionedEventsMigration: 0036 on a database holding rows keeps
// every one of them, column for column, in a partition of its own day
// (month) rather than the default partition; the ids go on from the old
// tables'. The pre-0036 schema is built in a schema of its own in a test
// database, from the migrations before 0036.
func TestPartitionedEventsMigration(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.NewPool(t)
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	conn := c.Conn()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA pre36; SET search_path = pre36"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Exec(ctx, "RESET search_path") }) //nolint:errcheck // the pool is dropped with the test
	if err := migrate.ApplyOwnBefore(ctx, conn, 36); err != nil {
		t.Fatal(err)
	}
	// Five days of route events (a few pending, with holds, attempts and
	// usage), an account's history over the same days, and usage rolled
	// up over three months.
	if _, err := conn.Exec(ctx, `
		INSERT INTO accounts (id, provider, auth_kind, label, max_concurrency, credential_sealed, credential_hint, created_at, updated_at)
		VALUES ('00000000-0000-0000-0000-00000000000a', 'anthropic', 'api_key', 'a', 1, '\x01', 'h', now(), now());
		INSERT INTO route_events (request_id, account_id, surface, model, stream, status, error_type, attempts, duration_ms,
			ttfb_ms, input_tokens, output_tokens, started_at, recorded_at, held_ms, hold_count, failure_stage, attempts_json,
			spilled_to_metered, pending_until, held_since, hold_reason, next_try_at, verdict, session_key,
			cache_read_tokens, cache_creation_tokens, reasoning_tokens, cost_nano_usd)
		SELECT 'weir_' || g, '00000000-0000-0000-0000-00000000000a', 'messages', 'claude-sonnet-4-5', g % 2 = 0, 200, '',
			1 + g % 3, g * 1.5, CASE WHEN g % 4 = 0 THEN NULL ELSE 3.25 END, g, g * 2,
			now() - g * interval '7 minutes', now() - g * interval '7 minutes' + interval '40 seconds', g % 5, g % 2, '',
			'[{"status": 200}]', g % 7 = 0, CASE WHEN g % 100 = 0 THEN now() + interval '1 minute' END,
			CASE WHEN g % 100 = 0 THEN now() END, CASE WHEN g % 100 = 0 THEN 'capacity' ELSE '' END,
			CASE WHEN g % 100 = 0 THEN now() + interval '5 seconds' END, '', 'session-' || g % 10, g, g, g, g * 1000
		FROM generate_series(1, 1000) g;
		INSERT INTO account_history (account_id, at, kind, reason, until, evidence)
		SELECT '00000000-0000-0000-0000-00000000000a', now() - g * interval '1 hour', 'cooldown', 'rate_limited',
			now() - g * interval '1 hour' + interval '1 minute', '{"status": 429}'
		FROM generate_series(1, 120) g;
		INSERT INTO usage_hourly (hour, key_id, account_id, model, session_key, requests, input_tokens, cost_nano_usd)
		SELECT date_trunc('hour', now()) - g * interval '1 day', '00000000-0000-0000-0000-000000000000',
			'00000000-0000-0000-0000-00000000000a', 'claude-sonnet-4-5', '', g, g * 10, g * 100
		FROM generate_series(0, 80) g`); err != nil {
		t.Fatal(err)
	}
	digests := map[string]string{
		"route_events":    `SELECT count(*) || ':' || md5(string_agg(t::text, ',' ORDER BY id)) FROM route_events t`,
		"account_history": `SELECT count(*) || ':' || md5(string_agg(t::text, ',' ORDER BY id)) FROM account_history t`,
		"usage_hourly":    `SELECT count(*) || ':' || md5(string_agg(t::text, ',' ORDER BY hour)) FROM usage_hourly t`,
	}
	was := map[string]string{}
	for table, q := range digests {
		var d string
		if err := conn.QueryRow(ctx, q).Scan(&d); err != nil {
			t.Fatal(err)
		}
		was[table] = d
	}

	if err := migrate.ApplyOwn(ctx, conn); err != nil {
		t.Fatal(err)
	}
	for table, q := range digests {
		var d string
		if err := conn.QueryRow(ctx, q).Scan(&d); err != nil {
			t.Fatal(err)
		}
		if d != was[table] {
			t.Errorf("%s: %s after the migration, %s before", table, d, was[table])
		}
		var kind string
		var strays int
		if err := conn.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = $1::regclass`, table).Scan(&kind); err != nil || kind != "p" {
			t.Errorf("%s: relkind %q (%v), want partitioned", table, kind, err)
		}
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+table+`_default`).Scan(&strays); err != nil || strays != 0 {
			t.Errorf("%s: %d rows in the default partition (%v), want each in its own", table, strays, err)
		}
	}
	var id int64
	if err := conn.QueryRow(ctx, `INSERT INTO route_events (request_id, surface, model, stream, status, error_type, attempts,
		duration_ms, input_tokens, output_tokens, started_at, recorded_at)
		VALUES ('weir_new', 'messages', 'm', false, 200, '', 1, 1, 0, 0, now(), now()) RETURNING id`).Scan(&id); err != nil || id != 1001 {
		t.Errorf("a new route event's id is %d (%v), want 1001, after the old ones", id, err)
	}
	if err := conn.QueryRow(ctx, `INSERT INTO account_history (account_id, at, kind, reason, until)
		VALUES ('00000000-0000-0000-0000-00000000000a', now(), 'gate', 'opus', now()) RETURNING id`).Scan(&id); err != nil || id != 121 {
		t.Errorf("a new account history row's id is %d (%v), want 121", id, err)
	}
}
