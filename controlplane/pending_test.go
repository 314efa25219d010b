package controlplane

import (
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/jobs"
)

// reportBatch sends events as one ReportRoutes batch.
func (e *env) reportBatch(events ...*weirv1.RouteEvent) {
	e.t.Helper()
	if _, err := e.dp.leases.ReportRoutes(e.t.Context(), connect.NewRequest(&weirv1.ReportRoutesRequest{Events: events})); err != nil {
		e.t.Fatalf("ReportRoutes: %v", err)
	}
}

// pendingUntil reads until when a route event is kept open: the later
// of its pending_until and its last renewal's; nil when it is final.
func (e *env) pendingUntil(id string) *time.Time {
	e.t.Helper()
	var until *time.Time
	if err := e.pool.QueryRow(e.t.Context(), `SELECT CASE WHEN e.pending_until IS NOT NULL THEN greatest(e.pending_until, r.until) END
FROM route_events e LEFT JOIN route_pending r USING (request_id) WHERE e.request_id = $1`, id).Scan(&until); err != nil {
		e.t.Fatalf("route event %s: %v", id, err)
	}
	return until
}

// TestPendingRouteEvents: a request a worker recorded as in progress is
// recorded once, under its id, whatever order its events arrive in: its
// final event replaces the pending one (in a later batch or the same
// one), a pending one arriving after the final changes nothing, and a
// final one replaces the worker_lost record the reaper made of it. A
// final event is never replaced.
func TestPendingRouteEvents(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pending := func(id string) *weirv1.RouteEvent {
		return &weirv1.RouteEvent{RequestId: id, Model: "m", Surface: "messages", Stream: true, Pending: true}
	}
	final := func(id string, status int32) *weirv1.RouteEvent {
		return &weirv1.RouteEvent{RequestId: id, Model: "m", Surface: "messages", Stream: true, Status: status, Attempts: 1}
	}

	e.reportBatch(pending("weir_later"))
	if ev := e.getEvent("weir_later"); !ev.Pending || ev.ErrorType != "in_progress" || ev.Status != 0 {
		t.Errorf("pending event stored as %v", ev)
	}
	if until := e.pendingUntil("weir_later"); until == nil || !until.Equal(e.clock.Now().Add(e.cfg.LeaseTTL)) {
		t.Errorf("pending until %v, want a lease TTL from now", until)
	}
	e.reportBatch(final("weir_later", 200))
	e.reportBatch(pending("weir_same"), final("weir_same", 200))
	e.reportBatch(final("weir_first", 200))
	e.reportBatch(pending("weir_first"))
	e.reportBatch(final("weir_twice", 200))
	e.reportBatch(final("weir_twice", 500))
	for _, id := range []string{"weir_later", "weir_same", "weir_first", "weir_twice"} {
		if ev := e.getEvent(id); ev.Pending || ev.Status != 200 || ev.ErrorType != "" {
			t.Errorf("%s stored as %v, want its first final event", id, ev)
		}
	}
	if n := e.count(`SELECT count(*) FROM route_events`); n != 4 {
		t.Errorf("%d route events, want one per request (4)", n)
	}

	// The keeper keeps a pending event open with its renewals, which
	// leave the event's row as it is (no new version of it or of its
	// indexes' entries).
	e.reportBatch(pending("weir_held"))
	version := func() string {
		var xmin string
		if err := e.pool.QueryRow(t.Context(), `SELECT xmin::text FROM route_events WHERE request_id = 'weir_held'`).Scan(&xmin); err != nil {
			t.Fatal(err)
		}
		return xmin
	}
	now := e.advanceAlive(10 * time.Second)
	stored := version()
	if _, err := e.dp.leases.RenewBatch(t.Context(), connect.NewRequest(&weirv1.RenewBatchRequest{RequestIds: []string{"weir_held", "weir_later"}})); err != nil {
		t.Fatal(err)
	}
	if until := e.pendingUntil("weir_held"); until == nil || !until.Equal(now.Add(e.cfg.LeaseTTL)) {
		t.Errorf("renewed pending until %v, want %v", until, now.Add(e.cfg.LeaseTTL))
	}
	if until := e.pendingUntil("weir_later"); until != nil {
		t.Errorf("a renewal reopened a final event: pending until %v", until)
	}
	if got := version(); got != stored {
		t.Errorf("the renewal wrote the event's row again (xmin %s, was %s)", got, stored)
	}
	// Past its report's until, within its renewal's: still open.
	e.advanceAlive(e.cfg.LeaseTTL - 5*time.Second)
	if n, err := e.q.CloseLostRequests(t.Context(), e.clock.Now()); err != nil || n != 0 {
		t.Fatalf("CloseLostRequests within the renewal = %d, %v; want 0", n, err)
	}

	// Closed as lost (the reaper's query), then its final event arrives:
	// its worker was cut off, not dead. The renewals past are gone.
	e.advanceAlive(10 * time.Second)
	if n, err := e.q.CloseLostRequests(t.Context(), e.clock.Now()); err != nil || n != 1 {
		t.Fatalf("CloseLostRequests = %d, %v; want 1", n, err)
	}
	if n := e.count(`SELECT count(*) FROM route_pending`); n != 0 {
		t.Errorf("%d renewals left past their until", n)
	}
	if ev := e.getEvent("weir_held"); ev.ErrorType != "worker_lost" || ev.Pending {
		t.Fatalf("closed as %v", ev)
	}
	e.reportBatch(final("weir_held", 200))
	if ev := e.getEvent("weir_held"); ev.ErrorType != "" || ev.Status != 200 {
		t.Errorf("the final event did not replace worker_lost: %v", ev)
	}
}

// TestPendingAcrossMidnight: route events are partitioned by the day
// (UTC) their request started; a request that started before midnight
// and ended after it is still recorded once: its final event replaces
// its pending one in the partition of its start, whether the worker sent
// the start (it always does) or the control plane dated the first event
// it got. Its usage is rolled up once, in the hour it started.
func TestPendingAcrossMidnight(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	now := e.clock.Now().UTC()
	midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	e.clock.AdvanceTo(midnight.Add(-10 * time.Second))
	if _, err := jobs.MaintainPartitions(ctx, jobs.Deps{Queries: e.q, Logger: e.cfg.Logger, Now: e.clock.Now}); err != nil {
		t.Fatal(err)
	}
	start := timestamppb.New(midnight.Add(-20 * time.Second))
	e.reportBatch(
		&weirv1.RouteEvent{RequestId: "weir_sent", Model: "m", Surface: "messages", Stream: true, Pending: true, StartedAt: start},
		&weirv1.RouteEvent{RequestId: "weir_dated", Model: "m", Surface: "messages", Stream: true, Pending: true})
	e.advanceAlive(40 * time.Second)
	e.reportBatch(
		&weirv1.RouteEvent{RequestId: "weir_sent", Model: "m", Surface: "messages", Stream: true, Status: 200, Attempts: 1,
			StartedAt: start, InputTokens: 7},
		&weirv1.RouteEvent{RequestId: "weir_dated", Model: "m", Surface: "messages", Stream: true, Status: 200, Attempts: 1,
			InputTokens: 5})
	day := "route_events_p" + midnight.Add(-time.Second).Format("20060102")
	for _, id := range []string{"weir_sent", "weir_dated"} {
		if n := e.count(`SELECT count(*) FROM route_events WHERE request_id = $1`, id); n != 1 {
			t.Errorf("%s: %d route events, want 1", id, n)
		}
		if ev := e.getEvent(id); ev.Pending || ev.Status != 200 || ev.StartedAt.AsTime().After(midnight) {
			t.Errorf("%s stored as %v, want the final event started before midnight", id, ev)
		}
		if n := e.count(`SELECT count(*) FROM `+day+` WHERE request_id = $1`, id); n != 1 {
			t.Errorf("%s is not in %s, its start's partition", id, day)
		}
	}
	if n := e.count(`SELECT coalesce(sum(requests), 0)::int FROM usage_hourly WHERE hour = $1`, midnight.Add(-time.Hour)); n != 2 {
		t.Errorf("%d requests rolled up in the hour before midnight, want 2", n)
	}
}

// TestPendingAcrossOutage: a request kept open by its worker's renewal
// (its event's own until long past) stays open through an outage of
// every control plane: the first touch of the lease clock after it keeps
// the renewal open a TTL more, as it does leases, and the request is
// closed as lost only once nobody renewed it for a TTL after that.
func TestPendingAcrossOutage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.reportBatch(&weirv1.RouteEvent{RequestId: "weir_long", Model: "m", Surface: "messages", Stream: true, Pending: true})
	e.advanceAlive(20 * time.Second)
	if _, err := e.dp.leases.RenewBatch(t.Context(), connect.NewRequest(&weirv1.RenewBatchRequest{RequestIds: []string{"weir_long"}})); err != nil {
		t.Fatal(err)
	}
	e.advanceAlive(15 * time.Second) // the event's own until passed; the renewal's not
	if n, err := e.q.CloseLostRequests(t.Context(), e.clock.Now()); err != nil || n != 0 {
		t.Fatalf("CloseLostRequests before the outage = %d, %v; want 0", n, err)
	}

	e.clock.Advance(e.cfg.LeaseTTL + 15*time.Second) // nobody reaches Postgres
	after := e.advanceAlive(time.Second)             // the first touch after it
	if until := e.pendingUntil("weir_long"); until == nil || !until.Equal(after.Add(e.cfg.LeaseTTL)) {
		t.Errorf("after the outage open until %v, want a TTL from its end (%v)", until, after.Add(e.cfg.LeaseTTL))
	}
	if n, err := e.q.CloseLostRequests(t.Context(), e.clock.Now()); err != nil || n != 0 {
		t.Fatalf("CloseLostRequests right after the outage = %d, %v; want 0", n, err)
	}
	e.advanceAlive(e.cfg.LeaseTTL + time.Second) // and no renewal since
	if n, err := e.q.CloseLostRequests(t.Context(), e.clock.Now()); err != nil || n != 1 {
		t.Fatalf("CloseLostRequests a TTL later = %d, %v; want 1", n, err)
	}
	if ev := e.getEvent("weir_long"); ev.ErrorType != "worker_lost" {
		t.Errorf("closed as %v", ev)
	}
}
