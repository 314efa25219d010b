package jobs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/notify"
)

// TestRetention: route events recorded, and refusal counts of intervals
// begun, before the retention are deleted, in batches, at most so many a
// run (the rest goes in the next); newer rows and pending events (their
// request still in progress) stay. The setting is read each run.
func TestRetention(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	keep := 30 * 24 * time.Hour
	d := Deps{Queries: f.q, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return now },
		Retention: func(context.Context) (time.Duration, error) { return keep, nil }}
	old, recent := now.Add(-keep-time.Hour), now.Add(-keep+time.Hour)
	event := func(id string, at time.Time, pending bool) {
		t.Helper()
		var until any
		if pending {
			until = now.Add(time.Minute)
		}
		if _, err := f.pool.Exec(ctx, `INSERT INTO route_events (request_id, surface, model, stream, status, error_type,
			attempts, duration_ms, input_tokens, output_tokens, started_at, recorded_at, pending_until)
			VALUES ($1, 'messages', 'm', false, 200, '', 1, 1, 0, 0, $2, $2, $3)`, id, at, until); err != nil {
			t.Fatal(err)
		}
	}
	refusal := func(at time.Time, reason string) {
		t.Helper()
		if _, err := f.pool.Exec(ctx, `INSERT INTO refusal_counts (interval_start, key_id, reason, worker_id, count, recorded_at)
			VALUES ($1, $2, $3, 'w1', 5, $1)`, at, uuid.Nil, reason); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 12 {
		event(fmt.Sprintf("old-%d", i), old.Add(-time.Duration(i)*time.Minute), false)
		refusal(old.Add(-time.Duration(i)*time.Minute), "key_rate_limit")
	}
	event("old-pending", old, true)
	event("recent", recent, false)
	refusal(recent, "key_rate_limit")
	count := func(table string) int {
		t.Helper()
		var n int
		if err := f.pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Batches of 5, two a run: ten of the twelve old rows go.
	events, refusals, err := enforceRetention(ctx, d, 5, 2)
	if err != nil || events != 10 || refusals != 10 {
		t.Fatalf("first run: %d events, %d refusal counts, %v; want 10 and 10", events, refusals, err)
	}
	events, refusals, err = enforceRetention(ctx, d, 5, 2)
	if err != nil || events != 2 || refusals != 2 {
		t.Fatalf("second run: %d events, %d refusal counts, %v; want the last 2 and 2", events, refusals, err)
	}
	if n, m := count("route_events"), count("refusal_counts"); n != 2 || m != 1 {
		t.Errorf("%d route events and %d refusal counts left, want the recent and the pending one, and the recent count", n, m)
	}
	var ids []string
	rows, err := f.pool.Query(ctx, "SELECT request_id FROM route_events ORDER BY request_id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if fmt.Sprint(ids) != "[old-pending recent]" {
		t.Errorf("left %v", ids)
	}

	// A shorter retention takes the recent rows too, at the next run.
	keep = time.Hour
	if events, refusals, err := EnforceRetention(ctx, d); err != nil || events != 1 || refusals != 1 {
		t.Errorf("after shortening: %d events, %d refusal counts, %v; want 1 and 1", events, refusals, err)
	}
}

// TestUsageRetention: the usage rollup's hours past usage_retention go,
// the rest stay; with no setting reader, nothing goes.
func TestUsageRetention(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	keep := 400 * 24 * time.Hour
	d := Deps{Queries: f.q, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return now }}
	for i, at := range []time.Time{now.Add(-keep - 2*time.Hour), now.Add(-keep - time.Hour), now.Add(-keep + time.Hour), now.Truncate(time.Hour)} {
		if _, err := f.pool.Exec(ctx, `INSERT INTO usage_hourly (hour, key_id, account_id, model, session_key, requests, input_tokens)
			VALUES ($1, $2, $2, 'm', $3, 1, 10)`, at.Truncate(time.Hour), uuid.Nil, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := EnforceUsageRetention(ctx, d); err != nil || n != 0 {
		t.Fatalf("no retention reader: %d deleted, %v", n, err)
	}
	d.UsageRetention = func(context.Context) (time.Duration, error) { return keep, nil }
	if n, err := EnforceUsageRetention(ctx, d); err != nil || n != 2 {
		t.Fatalf("%d rows deleted, %v; want the 2 past the retention", n, err)
	}
	var left int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM usage_hourly`).Scan(&left); err != nil || left != 2 {
		t.Errorf("%d rows left (%v), want 2", left, err)
	}
}

// TestNotifyRetention: notification events raised before notify.Retention
// go with their deliveries, in batches; newer ones stay, and so does an
// old one whose delivery is still being tried; one pending but untouched
// as long (its job lost) goes.
func TestNotifyRetention(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	d := Deps{Queries: f.q, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return now }}
	old, recent := now.Add(-notify.Retention-time.Hour), now.Add(-notify.Retention+time.Hour)
	target := uuid.New()
	if _, err := f.pool.Exec(ctx, `INSERT INTO notify_targets (id, name, kind, url_sealed, url_hint, created_at)
		VALUES ($1, 'ops', 'slack', '\x01', 'https://hooks.example.com', $2)`, target, old); err != nil {
		t.Fatal(err)
	}
	event := func(key string, at, updated time.Time, status string) {
		t.Helper()
		if _, err := f.pool.Exec(ctx, `WITH e AS (
				INSERT INTO notify_events (kind, dedup_key, severity, text, fields, created_at)
				VALUES ('pool_low', $1, 'warning', 'low', '{}', $2) RETURNING id)
			INSERT INTO notify_deliveries (event_id, target_id, status, created_at, updated_at)
			SELECT id, $3, $4, $2, $5 FROM e`, key, at, target, status, updated); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 6 {
		at := old.Add(-time.Duration(i) * time.Minute)
		event(fmt.Sprint("old-", i), at, at, []string{"delivered", "failed"}[i%2])
	}
	event("old-lost", old, old, "pending")
	event("old-pending", old, now.Add(-time.Minute), "pending")
	event("recent", recent, recent, "delivered")
	if n, err := enforceNotifyRetention(ctx, d, 5, 1); err != nil || n != 5 {
		t.Fatalf("first run: %d events, %v; want a batch of 5", n, err)
	}
	if n, err := EnforceNotifyRetention(ctx, d); err != nil || n != 2 {
		t.Fatalf("second run: %d events, %v; want the last 2", n, err)
	}
	var keys string
	if err := f.pool.QueryRow(ctx, `SELECT string_agg(e.dedup_key, ' ' ORDER BY e.dedup_key) FROM notify_events e
		JOIN notify_deliveries d ON d.event_id = e.id`).Scan(&keys); err != nil {
		t.Fatal(err)
	}
	if keys != "old-pending recent" {
		t.Errorf("left %q, want the pending and the recent one, each with its delivery", keys)
	}
}
