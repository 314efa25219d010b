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

// TestRetention: refusal counts of intervals begun before the retention
// are deleted, in batches, at most so many a run (the rest goes in the
// next); newer rows stay. The setting is read each run. Route events are
// not deleted row by row (partitions_test.go).
func TestRetention(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	keep := 30 * 24 * time.Hour
	d := Deps{Queries: f.q, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return now },
		Retention: func(context.Context) (time.Duration, error) { return keep, nil }}
	old, recent := now.Add(-keep-time.Hour), now.Add(-keep+time.Hour)
	refusal := func(at time.Time, reason string) {
		t.Helper()
		if _, err := f.pool.Exec(ctx, `INSERT INTO refusal_counts (interval_start, key_id, reason, worker_id, count, recorded_at)
			VALUES ($1, $2, $3, 'w1', 5, $1)`, at, uuid.Nil, reason); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 12 {
		refusal(old.Add(-time.Duration(i)*time.Minute), "key_rate_limit")
	}
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
	if refusals, err := enforceRetention(ctx, d, 5, 2); err != nil || refusals != 10 {
		t.Fatalf("first run: %d refusal counts, %v; want 10", refusals, err)
	}
	if refusals, err := enforceRetention(ctx, d, 5, 2); err != nil || refusals != 2 {
		t.Fatalf("second run: %d refusal counts, %v; want the last 2", refusals, err)
	}
	if m := count("refusal_counts"); m != 1 {
		t.Errorf("%d refusal counts left, want the recent one", m)
	}

	// A shorter retention takes the recent rows too, at the next run.
	keep = time.Hour
	if refusals, err := EnforceRetention(ctx, d); err != nil || refusals != 1 {
		t.Errorf("after shortening: %d refusal counts, %v; want 1", refusals, err)
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
