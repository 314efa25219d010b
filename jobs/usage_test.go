package jobs

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/weirhq/weir/controlplane/db"
)

// usageReaderFunc adapts a function to UsageReader.
type usageReaderFunc func(context.Context) (int, error)

func (f usageReaderFunc) ReadDue(ctx context.Context) (int, error) { return f(ctx) }

func TestUsagePoller(t *testing.T) {
	t.Parallel()
	calls := 0
	var fail error
	w := &UsagePoller{deps: Deps{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Usage: usageReaderFunc(func(context.Context) (int, error) {
			calls++
			return 2, fail
		}),
	}}
	j := &river.Job[UsagePollArgs]{JobRow: &rivertype.JobRow{ID: 1, Kind: UsagePollArgs{}.Kind()}}
	if err := w.Work(t.Context(), j); err != nil || calls != 1 {
		t.Fatalf("Work: %v after %d calls", err, calls)
	}
	fail = errors.New("database gone")
	if err := w.Work(t.Context(), j); err == nil || !strings.Contains(err.Error(), "poll usage: database gone") {
		t.Fatalf("Work with a failing reader: %v", err)
	}
	opts := UsagePollArgs{}.InsertOpts()
	if (UsagePollArgs{}).Kind() != "usage_poll" || !opts.UniqueOpts.ByArgs || opts.UniqueOpts.ByPeriod != UsagePollInterval {
		t.Errorf("kind %q, insert opts %+v: the poller must be unique per interval", UsagePollArgs{}.Kind(), opts.UniqueOpts)
	}
}

func TestUsageSnapshotter(t *testing.T) {
	t.Parallel()
	f := setup(t)
	acct := uuid.New()
	if _, err := f.q.CreateAccount(t.Context(), db.CreateAccountParams{
		ID: acct, Provider: "anthropic", AuthKind: "oauth", Label: "max",
		MaxConcurrency: 1, CredentialSealed: []byte{1}, CredentialHint: "…****", Now: now.Add(-24 * time.Hour),
	}); err != nil {
		t.Fatal(err)
	}
	half, reset := 0.5, now.Add(3*time.Hour)
	for _, w := range []struct {
		name string
		util *float64
	}{{"five_hour", &half}, {"seven_day", nil}} {
		if n, err := f.q.UpsertUsageWindow(t.Context(), db.UpsertUsageWindowParams{
			AccountID: acct, WindowName: w.name, Utilization: w.util, ResetsAt: &reset,
			Source: "poll", Now: now, CredentialRevision: 1,
		}); err != nil || n != 1 {
			t.Fatalf("seed %s: %d rows, %v", w.name, n, err)
		}
	}
	for _, age := range []time.Duration{15 * 24 * time.Hour, 14*24*time.Hour + time.Second, 13 * 24 * time.Hour} {
		if _, err := f.pool.Exec(t.Context(),
			`INSERT INTO usage_snapshots (account_id, window_name, utilization, resets_at, taken_at) VALUES ($1, 'five_hour', 0.1, NULL, $2)`,
			acct, now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	snap := &UsageSnapshotter{deps: Deps{
		Queries: f.q, Now: func() time.Time { return now },
		Logger: slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), f.logs), nil)),
	}}
	j := &river.Job[UsageSnapshotArgs]{JobRow: &rivertype.JobRow{ID: 1, Kind: UsageSnapshotArgs{}.Kind()}}
	for range 2 { // a second run at the same instant adds nothing
		if err := snap.Work(t.Context(), j); err != nil {
			t.Fatal(err)
		}
	}
	count := func(where string, args ...any) int {
		t.Helper()
		var n int
		if err := f.pool.QueryRow(t.Context(), `SELECT count(*) FROM usage_snapshots WHERE `+where, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(`taken_at = $1`, now); n != 2 {
		t.Errorf("%d snapshots taken now, want 2", n)
	}
	if n := count(`taken_at = $1 AND window_name = 'five_hour' AND utilization = 0.5 AND resets_at = $2`, now, reset); n != 1 {
		t.Error("the five_hour snapshot is not a copy of the window")
	}
	if n := count(`taken_at = $1 AND window_name = 'seven_day' AND utilization IS NULL`, now); n != 1 {
		t.Error("a window without evidence must be snapshotted as NULL, never 0")
	}
	if n := count(`taken_at < $1`, now); n != 1 {
		t.Errorf("%d old snapshots left, want 1 (13 days old; the 14- and 15-day ones go)", n)
	}
	if !strings.Contains(f.logs.String(), "usage snapshots trimmed") {
		t.Errorf("log %q", f.logs.String())
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := snap.Work(ctx, j); err == nil {
		t.Error("Work with a canceled context succeeded")
	}
}

// tokenRefresherFunc adapts a function to TokenRefresher.
type tokenRefresherFunc func(context.Context) (int, error)

func (f tokenRefresherFunc) RefreshDue(ctx context.Context) (int, error) { return f(ctx) }

func TestTokenRefreshWorker(t *testing.T) {
	t.Parallel()
	calls := 0
	var fail error
	w := &TokenRefreshWorker{deps: Deps{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Tokens: tokenRefresherFunc(func(context.Context) (int, error) {
			calls++
			return 1, fail
		}),
	}}
	j := &river.Job[TokenRefreshArgs]{JobRow: &rivertype.JobRow{ID: 1, Kind: TokenRefreshArgs{}.Kind()}}
	if err := w.Work(t.Context(), j); err != nil || calls != 1 {
		t.Fatalf("Work: %v after %d calls", err, calls)
	}
	fail = errors.New("database gone")
	if err := w.Work(t.Context(), j); err == nil || !strings.Contains(err.Error(), "refresh tokens: database gone") {
		t.Fatalf("Work with a failing refresher: %v", err)
	}
	opts := TokenRefreshArgs{}.InsertOpts()
	if (TokenRefreshArgs{}).Kind() != "token_refresh" || !opts.UniqueOpts.ByArgs || opts.UniqueOpts.ByPeriod != TokenRefreshInterval {
		t.Errorf("kind %q, insert opts %+v: the refresher must be unique per interval", TokenRefreshArgs{}.Kind(), opts.UniqueOpts)
	}
	if TokenRefreshInterval != time.Minute {
		t.Errorf("interval %v, want 60s", TokenRefreshInterval)
	}
}
