package jobs

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/notify"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/syncbuf"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var now = time.Date(2030, time.March, 4, 12, 0, 0, 0, time.UTC)

// lockedBuffer collects a job's log output.
type lockedBuffer = syncbuf.Buffer

type fixture struct {
	pool    *pgxpool.Pool
	q       *db.Queries
	account uuid.UUID
	logs    *lockedBuffer
	reaper  *LeaseReaper
}

func setup(t *testing.T) *fixture {
	t.Helper()
	pool := pgtest.NewPool(t)
	f := &fixture{pool: pool, q: db.New(pool), account: uuid.New(), logs: &lockedBuffer{}}
	if _, err := f.q.CreateAccount(t.Context(), db.CreateAccountParams{
		ID: f.account, Provider: "anthropic", AuthKind: "api_key", Label: "reaper",
		MaxConcurrency: 100, CredentialSealed: []byte{1}, CredentialHint: "…****", Now: now.Add(-24 * time.Hour),
	}); err != nil {
		t.Fatalf("create account: %v", err)
	}
	aliveAt(t, pool, now)
	f.reaper = &LeaseReaper{deps: Deps{
		Queries:    f.q,
		Logger:     slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), f.logs), nil)),
		Now:        func() time.Time { return now },
		LeaseGrace: 10 * time.Minute,
		LeaseTTL:   30 * time.Second,
		SessionTTL: time.Hour,
	}}
	return f
}

// claim leases the account at a time, for ttl, binding session if set.
func (f *fixture) claim(t *testing.T, at time.Time, ttl time.Duration, session string) uuid.UUID {
	t.Helper()
	row, err := f.q.ClaimLease(t.Context(), db.ClaimLeaseParams{
		AccountID: f.account, Revision: 1, RequestID: "r", Model: "m",
		SessionKey: session, Now: at, ExpiresAt: at.Add(ttl),
	})
	if err != nil || row.LeaseID == uuid.Nil {
		t.Fatalf("claim at %v: %v (id %v)", at, err, row.LeaseID)
	}
	return row.LeaseID
}

func (f *fixture) leases(t *testing.T) map[uuid.UUID]bool {
	t.Helper()
	rows, err := f.pool.Query(t.Context(), `SELECT id FROM leases`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[uuid.UUID]bool{}
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		out[id] = true
	}
	return out
}

func (f *fixture) sessions(t *testing.T) map[string]bool {
	t.Helper()
	rows, err := f.pool.Query(t.Context(), `SELECT session_key FROM session_bindings`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		out[k] = true
	}
	return out
}

func job() *river.Job[LeaseReaperArgs] {
	return &river.Job[LeaseReaperArgs]{JobRow: &rivertype.JobRow{ID: 1, Kind: LeaseReaperArgs{}.Kind()}, Args: LeaseReaperArgs{}}
}

func TestLeaseReaper(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const ttl = 30 * time.Second
	ancient := f.claim(t, now.Add(-3*time.Hour), ttl, "ancient")
	pastGrace := f.claim(t, now.Add(-11*time.Minute), ttl, "")      // expired 10m30s ago
	idle61 := f.claim(t, now.Add(-61*time.Minute), ttl, "idle-61m") // lease long expired too
	inGrace := f.claim(t, now.Add(-5*time.Minute), ttl, "recent")   // expired 4m30s ago
	live := f.claim(t, now.Add(-10*time.Second), ttl, "live")       // expires in 20s
	renewed := f.claim(t, now.Add(-2*time.Hour), 3*time.Hour, "")   // long-lived lease, still live
	f.claim(t, now.Add(-2*time.Hour), ttl, "sticky")                // bound long ago...
	sticky := f.claim(t, now.Add(-time.Minute), ttl, "sticky")      // ...but seen a minute ago

	if err := f.reaper.Work(t.Context(), job()); err != nil {
		t.Fatalf("Work: %v", err)
	}
	ls := f.leases(t)
	for name, tc := range map[string]struct {
		id   uuid.UUID
		kept bool
	}{
		"ancient":       {ancient, false},
		"past grace":    {pastGrace, false},
		"idle 61m":      {idle61, false},
		"within grace":  {inGrace, true},
		"live":          {live, true},
		"renewed":       {renewed, true},
		"sticky recent": {sticky, true},
	} {
		if ls[tc.id] != tc.kept {
			t.Errorf("lease %s: kept %v, want %v", name, ls[tc.id], tc.kept)
		}
	}
	// 8 claimed: the first sticky one (expired 1h59m30s ago) goes too.
	if len(ls) != 4 {
		t.Errorf("%d leases left, want 4", len(ls))
	}
	ss := f.sessions(t)
	for key, kept := range map[string]bool{"ancient": false, "idle-61m": false, "recent": true, "live": true, "sticky": true} {
		if ss[key] != kept {
			t.Errorf("session %s: kept %v, want %v", key, ss[key], kept)
		}
	}
	if len(ss) != 3 {
		t.Errorf("%d sessions left, want 3", len(ss))
	}
	if logs := f.logs.String(); !strings.Contains(logs, "reaped") || !strings.Contains(logs, "leases=4") || !strings.Contains(logs, "sessions=2") {
		t.Errorf("log %q", logs)
	}

	// A second run finds nothing and says nothing.
	before := f.logs.String()
	if err := f.reaper.Work(t.Context(), job()); err != nil {
		t.Fatalf("second Work: %v", err)
	}
	if len(f.leases(t)) != 4 || len(f.sessions(t)) != 3 {
		t.Error("second run deleted more")
	}
	if f.logs.String() != before {
		t.Error("an idle run logged")
	}
}

// TestLeaseReaperKeepsCountsHonest: reaping only tidies; leases that
// expired already stopped counting, so the live count is the same before
// and after.
func TestLeaseReaperKeepsCountsHonest(t *testing.T) {
	t.Parallel()
	f := setup(t)
	for i := 1; i <= 5; i++ {
		f.claim(t, now.Add(-time.Duration(i)*20*time.Minute), 30*time.Second, "")
	}
	f.claim(t, now, time.Minute, "")
	count := func() int32 {
		rows, err := f.q.LiveLeaseCounts(t.Context(), now)
		if err != nil || len(rows) != 1 {
			t.Fatalf("LiveLeaseCounts: %v %v", rows, err)
		}
		return rows[0].Live
	}
	if count() != 1 {
		t.Fatalf("live before reaping: %d", count())
	}
	if err := f.reaper.Work(t.Context(), job()); err != nil {
		t.Fatal(err)
	}
	if count() != 1 {
		t.Errorf("live after reaping: %d", count())
	}
}

func TestLeaseReaperError(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := f.reaper.Work(ctx, job()); err == nil {
		t.Error("Work with a canceled context succeeded")
	}
	f.pool.Close()
	if err := f.reaper.Work(t.Context(), job()); err == nil || !strings.Contains(err.Error(), "reap leases") {
		t.Errorf("Work on a closed pool: %v", err)
	}
}

func TestRegister(t *testing.T) {
	t.Parallel()
	workers := river.NewWorkers()
	periodic := Register(workers, Deps{Now: time.Now, LeaseGrace: time.Minute, SessionTTL: time.Hour})
	if len(periodic) != 3 {
		t.Fatalf("%d periodic jobs, want 3 (reaper, usage snapshots, integrity check)", len(periodic))
	}
	withUsage := Register(river.NewWorkers(), Deps{Now: time.Now, Usage: usageReaderFunc(func(context.Context) (int, error) { return 0, nil })})
	if len(withUsage) != 4 {
		t.Fatalf("%d periodic jobs with a usage reader, want 4", len(withUsage))
	}
	if withNotify := Register(river.NewWorkers(), Deps{Now: time.Now, Notify: notifications{}}); len(withNotify) != 4 {
		t.Fatalf("%d periodic jobs with notifications, want 4 (the watch too)", len(withNotify))
	}
	if opts := (NotifyWatchArgs{}).InsertOpts(); !opts.UniqueOpts.ByArgs || opts.UniqueOpts.ByPeriod != notify.WatchInterval {
		t.Errorf("watch insert opts %+v: one run queued at a time", opts.UniqueOpts)
	}
	if opts := (notify.DeliveryArgs{}).InsertOpts(); !opts.UniqueOpts.ByArgs || opts.MaxAttempts != notify.MaxAttempts {
		t.Errorf("delivery insert opts %+v: one job per delivery, %d attempts", opts, notify.MaxAttempts)
	}
	if (LeaseReaperArgs{}).Kind() != "lease_reaper" {
		t.Errorf("kind %q", LeaseReaperArgs{}.Kind())
	}
	opts := LeaseReaperArgs{}.InsertOpts()
	if !opts.UniqueOpts.ByArgs || opts.UniqueOpts.ByPeriod != ReapInterval {
		t.Errorf("insert opts %+v: the reaper must be unique per interval", opts.UniqueOpts)
	}
}

// notifications is a jobs.Notifications that does nothing.
type notifications struct{}

func (notifications) DeliverNotification(context.Context, int64, int, bool) error { return nil }
func (notifications) WatchNotifications(context.Context) error                    { return nil }

// aliveAt sets the lease clock (0021_lease_clock.sql) as a control plane
// touching it at t does: the history a test makes of claims in the past
// happened while control planes were up.
func aliveAt(t *testing.T, pool *pgxpool.Pool, at time.Time) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), `UPDATE lease_clock SET alive_at = $1`, at); err != nil {
		t.Fatalf("lease clock: %v", err)
	}
}

// TestLeaseReaperAfterOutage: after an outage in which no control plane
// reached Postgres, the reaper first moves the lease clock, which renews
// the leases live when the outage began. A lease of a stream that ran
// through a 15-minute outage is neither reaped nor lapsed; one that
// lapsed before the outage is reaped as usual.
func TestLeaseReaperAfterOutage(t *testing.T) {
	t.Parallel()
	f := setup(t)
	down := now.Add(-15 * time.Minute)
	before := f.claim(t, down.Add(-time.Hour), 30*time.Second, "")
	through := f.claim(t, down.Add(-10*time.Second), 30*time.Second, "")
	aliveAt(t, f.pool, down) // the last touch before the outage
	if err := f.reaper.Work(t.Context(), job()); err != nil {
		t.Fatal(err)
	}
	rows, err := f.pool.Query(t.Context(), `SELECT id FROM leases WHERE expires_at > $1`, now)
	if err != nil {
		t.Fatal(err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0] != through {
		t.Errorf("live leases after the outage: %v, want only the one live when it began (%v)", left, through)
	}
	var n int
	if err := f.pool.QueryRow(t.Context(), `SELECT count(*) FROM leases WHERE id = $1`, before).Scan(&n); err != nil || n != 0 {
		t.Errorf("lease lapsed before the outage: %d rows (%v), want reaped", n, err)
	}
}

// pendingEvent stores a pending route event (a request in progress, as a
// worker records it) open until until.
func (f *fixture) pendingEvent(t *testing.T, id string, started, until time.Time) {
	t.Helper()
	if _, err := f.q.InsertRouteEvents(t.Context(), db.InsertRouteEventsParams{
		Now: started, PendingUntil: until, RequestIds: []string{id}, KeyIds: []uuid.UUID{uuid.Nil},
		AccountIds: []uuid.UUID{uuid.Nil}, Surfaces: []string{"messages"}, Models: []string{"m"},
		Streams: []bool{true}, Statuses: []int32{0}, ErrorTypes: []string{"in_progress"}, AttemptCounts: []int32{0},
		DurationsMs: []float64{0}, HasTtfb: []bool{false}, TtfbsMs: []float64{0}, InputTokens: []int64{0},
		OutputTokens: []int64{0}, StartedAts: []time.Time{started}, HeldsMs: []float64{0}, HoldCounts: []int32{0},
		FailureStages: []string{""}, AttemptsJsons: []string{"[]"}, Spilled: []bool{false}, Pendings: []bool{true},
		SessionKeys: []string{""}, CacheReadTokens: []int64{0}, CacheCreationTokens: []int64{0}, ReasoningTokens: []int64{0},
		CostsNanoUsd: []int64{0},
	}); err != nil {
		t.Fatalf("pending event: %v", err)
	}
}

// TestLeaseReaperClosesLostRequests: a pending route event that no
// worker renewed past its pending_until (its worker died) is closed as
// worker_lost under the request's own id, dated as far as it was known to
// run; one still renewed stays in progress.
func TestLeaseReaperClosesLostRequests(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.pendingEvent(t, "weir_lost", now.Add(-2*time.Minute), now.Add(-time.Minute))
	f.pendingEvent(t, "weir_running", now.Add(-2*time.Minute), now.Add(20*time.Second))
	if err := f.reaper.Work(t.Context(), job()); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]string{"weir_lost": "worker_lost", "weir_running": "in_progress"} {
		var typ string
		var pending bool
		var ms float64
		if err := f.pool.QueryRow(t.Context(), `SELECT error_type, pending_until IS NOT NULL, duration_ms FROM route_events WHERE request_id = $1`, id).
			Scan(&typ, &pending, &ms); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if typ != want || pending != (want == "in_progress") {
			t.Errorf("%s: %s (pending %v), want %s", id, typ, pending, want)
		}
		if id == "weir_lost" && ms != 60000 {
			t.Errorf("%s: duration %v ms, want 60000 (from its start to when it was last known to run)", id, ms)
		}
	}
	if logs := f.logs.String(); !strings.Contains(logs, "lost_requests=1") {
		t.Errorf("log %q", logs)
	}
}
