package controlplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// reportOne stores one route event, as a batch of one.
func reportOne(ctx context.Context, c weirv1connect.LeaseServiceClient, ev *weirv1.RouteEvent) (*connect.Response[weirv1.ReportRoutesResponse], error) {
	return c.ReportRoutes(ctx, connect.NewRequest(&weirv1.ReportRoutesRequest{Events: []*weirv1.RouteEvent{ev}}))
}

func (e *env) report(ev *weirv1.RouteEvent) {
	e.t.Helper()
	if _, err := reportOne(e.t.Context(), e.dp.leases, ev); err != nil {
		e.t.Fatalf("ReportRoutes: %v", err)
	}
}

func (e *env) listEvents(req *weirv1.ListRouteEventsRequest) []*weirv1.RouteEvent {
	e.t.Helper()
	resp, err := e.admin.routes.ListRouteEvents(e.t.Context(), connect.NewRequest(req))
	if err != nil {
		e.t.Fatalf("ListRouteEvents: %v", err)
	}
	return resp.Msg.Events
}

func TestReportRoute(t *testing.T) {
	t.Parallel()
	e := setup(t)
	key, _ := e.createKey("")
	a, _ := e.createAccount(acct{label: "a"})
	b, _ := e.createAccount(acct{label: "b"})
	started := epoch.Add(-3 * time.Second)
	full := &weirv1.RouteEvent{
		RequestId: "req-full", KeyId: key.Id, AccountId: a.Id, Model: "claude-sonnet-4-5",
		Status: 200, Attempts: 2, Duration: durationpb.New(2500 * time.Millisecond),
		TimeToFirstByte: durationpb.New(750 * time.Millisecond), InputTokens: 1234, OutputTokens: 567,
		Stream: true, ErrorType: "", Surface: "messages", StartedAt: timestamppb.New(started),
	}
	e.report(full)
	e.report(&weirv1.RouteEvent{RequestId: "req-b", AccountId: b.Id, Status: 429, Attempts: 3,
		ErrorType: "rate_limit_error", Surface: "responses", StartedAt: timestamppb.New(epoch)})
	e.report(&weirv1.RouteEvent{RequestId: "req-none", Status: 503, ErrorType: "overloaded_error", StartedAt: timestamppb.New(epoch)})

	all := e.listEvents(&weirv1.ListRouteEventsRequest{})
	if len(all) != 3 || all[0].RequestId != "req-none" || all[1].RequestId != "req-b" || all[2].RequestId != "req-full" {
		t.Fatalf("events (newest first): %v", all)
	}
	got := all[2]
	if got.KeyId != key.Id || got.AccountId != a.Id || got.Model != full.Model || got.Status != 200 || got.Attempts != 2 ||
		got.Duration.AsDuration() != 2500*time.Millisecond || got.TimeToFirstByte.AsDuration() != 750*time.Millisecond ||
		got.InputTokens != 1234 || got.OutputTokens != 567 || !got.Stream || got.Surface != "messages" ||
		!got.StartedAt.AsTime().Equal(started) {
		t.Errorf("round trip: %v", got)
	}
	if all[1].TimeToFirstByte != nil || all[0].AccountId != "" || all[0].KeyId != "" {
		t.Errorf("unset fields came back set: %v / %v", all[1], all[0])
	}

	// Filter by account, by id or by label.
	for _, ref := range []string{a.Id, "a"} {
		evs := e.listEvents(&weirv1.ListRouteEventsRequest{AccountId: ref})
		if len(evs) != 1 || evs[0].RequestId != "req-full" {
			t.Errorf("filter %q: %v", ref, evs)
		}
	}
	_, err := e.admin.routes.ListRouteEvents(t.Context(), connect.NewRequest(&weirv1.ListRouteEventsRequest{AccountId: "nope"}))
	wantCode(t, err, connect.CodeNotFound)

	// Limits.
	if evs := e.listEvents(&weirv1.ListRouteEventsRequest{Limit: 2}); len(evs) != 2 || evs[0].RequestId != "req-none" {
		t.Errorf("limit 2: %v", evs)
	}
	_, err = e.admin.routes.ListRouteEvents(t.Context(), connect.NewRequest(&weirv1.ListRouteEventsRequest{Limit: -1}))
	ce := wantCode(t, err, connect.CodeInvalidArgument)
	if !strings.HasPrefix(ce.Message(), "limit:") {
		t.Errorf("message %q", ce.Message())
	}

	// Invalid reports.
	for _, ev := range []*weirv1.RouteEvent{nil, {Status: 200}} {
		_, err := reportOne(t.Context(), e.dp.leases, ev)
		wantCode(t, err, connect.CodeInvalidArgument)
	}
}

func TestListRouteEventsLimitBounds(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if _, err := e.pool.Exec(t.Context(), `
		INSERT INTO route_events (request_id, surface, model, stream, status, error_type, attempts,
		                          duration_ms, input_tokens, output_tokens, started_at, recorded_at)
		SELECT 'bulk-' || g, 'messages', 'm', false, 200, '', 1, 1, 0, 0, $1, $1
		FROM generate_series(1, 1005) g`, epoch); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		limit int32
		want  int
	}{
		{0, 50},
		{1, 1},
		{999, 999},
		{1000, 1000},
		{1001, 1000},
		{1 << 30, 1000},
	} {
		evs := e.listEvents(&weirv1.ListRouteEventsRequest{Limit: tc.limit})
		if len(evs) != tc.want {
			t.Errorf("limit %d: %d events, want %d", tc.limit, len(evs), tc.want)
		}
		if len(evs) > 0 && evs[0].RequestId != "bulk-1005" {
			t.Errorf("limit %d: first %s, want the newest", tc.limit, evs[0].RequestId)
		}
	}
}

// TestReportRouteTouchesKey: a busy key's last_used_at moves at most once
// a minute.
func TestReportRouteTouchesKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	key, _ := e.createKey("busy")
	lastUsed := func() *time.Time {
		t.Helper()
		var ts *time.Time
		if err := e.pool.QueryRow(t.Context(), `SELECT last_used_at FROM client_keys WHERE id = $1`, key.Id).Scan(&ts); err != nil {
			t.Fatal(err)
		}
		return ts
	}
	if lastUsed() != nil {
		t.Fatal("fresh key already used")
	}
	ev := func(i int) *weirv1.RouteEvent {
		return &weirv1.RouteEvent{RequestId: fmt.Sprint("r", i), KeyId: key.Id, Status: 200, StartedAt: timestamppb.New(e.clock.Now())}
	}
	e.report(ev(0))
	if got := lastUsed(); got == nil || !got.Equal(epoch) {
		t.Fatalf("last_used_at %v, want %v", got, epoch)
	}
	for i, step := range []time.Duration{10 * time.Second, 20 * time.Second, 30 * time.Second} {
		e.clock.Advance(step)
		e.report(ev(i + 1))
		if got := lastUsed(); !got.Equal(epoch) {
			t.Fatalf("touched again %v after the first, within a minute", got.Sub(epoch))
		}
	}
	now := e.clock.Advance(time.Second) // 61 s after the first touch
	e.report(ev(9))
	if got := lastUsed(); !got.Equal(now) {
		t.Fatalf("last_used_at %v, want %v", got, now)
	}
	// ListKeys shows it.
	resp, err := e.admin.keys.ListKeys(t.Context(), connect.NewRequest(&weirv1.ListKeysRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if k := resp.Msg.Keys[0]; k.LastUsedAt == nil || !k.LastUsedAt.AsTime().Equal(now) {
		t.Errorf("ListKeys last_used_at %v", k.LastUsedAt)
	}
	if n := e.count(`SELECT count(*) FROM route_events WHERE key_id = $1`, key.Id); n != 5 {
		t.Errorf("%d events stored, want 5", n)
	}
}

// TestReportRouteAfterAccountDeleted: the account that served a request
// can be deleted before the worker reports the route (a request in flight
// while an operator removes the account). The event must still be stored,
// detached from the account; and the events stored before the deletion
// are detached too (route events have no foreign key: DeleteAccount does
// what its ON DELETE SET NULL did).
func TestReportRouteAfterAccountDeleted(t *testing.T) {
	t.Parallel()
	e := setup(t)
	key, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{})
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, RequestId: "in-flight"})
	if _, err := e.admin.accounts.DeleteAccount(t.Context(), connect.NewRequest(&weirv1.DeleteAccountRequest{Id: a.Id})); err != nil {
		t.Fatal(err)
	}
	_, err := reportOne(t.Context(), e.dp.leases, &weirv1.RouteEvent{
		RequestId: "in-flight", KeyId: key.Id, AccountId: l.AccountId, Status: 200, Attempts: 1,
	})
	if err != nil {
		t.Fatalf("ReportRoutes after the account was deleted: %v", err)
	}
	if n := e.count(`SELECT count(*) FROM route_events WHERE request_id = 'in-flight' AND account_id IS NULL`); n != 1 {
		t.Errorf("event not stored detached (%d rows)", n)
	}

	b, _ := e.createAccount(acct{})
	kept, _ := e.createAccount(acct{})
	for i, id := range []string{b.Id, kept.Id} {
		if _, err := reportOne(t.Context(), e.dp.leases, &weirv1.RouteEvent{
			RequestId: fmt.Sprintf("before-%d", i), KeyId: key.Id, AccountId: id, Status: 200, Attempts: 1,
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.admin.accounts.DeleteAccount(t.Context(), connect.NewRequest(&weirv1.DeleteAccountRequest{Id: b.Id})); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT count(*) FROM route_events WHERE request_id = 'before-0' AND account_id IS NULL`); n != 1 {
		t.Errorf("an event stored before its account was deleted still names it (%d detached)", n)
	}
	if n := e.count(`SELECT count(*) FROM route_events WHERE request_id = 'before-1' AND account_id = '` + kept.Id + `'`); n != 1 {
		t.Errorf("another account's event was detached (%d kept)", n)
	}
}

// TestReportRoutesBatch: a worker's batch lands in one call; one bad event
// refuses the call, naming it, and stores nothing; a batch over the limit
// is refused.
func TestReportRoutesBatch(t *testing.T) {
	t.Parallel()
	e := setup(t)
	batch := func(ids ...string) *connect.Request[weirv1.ReportRoutesRequest] {
		req := &weirv1.ReportRoutesRequest{}
		for _, id := range ids {
			req.Events = append(req.Events, &weirv1.RouteEvent{RequestId: id, Model: "m", Status: 200, Surface: "messages"})
		}
		return connect.NewRequest(req)
	}
	first := batch("weir_b1", "weir_b2", "weir_b3")
	// Columns that differ per event land on their own rows: a time to first
	// byte only where one was reported, an unknown account detached.
	first.Msg.Events[1].TimeToFirstByte = durationpb.New(1500 * time.Microsecond)
	first.Msg.Events[1].InputTokens = 42
	first.Msg.Events[2].AccountId = uuid.NewString()
	if _, err := e.dp.leases.ReportRoutes(t.Context(), first); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"weir_b1", "weir_b2", "weir_b3"} {
		ev, err := e.admin.routes.GetRouteEvent(t.Context(), connect.NewRequest(&weirv1.GetRouteEventRequest{RequestId: id}))
		if err != nil {
			t.Errorf("%s not stored: %v", id, err)
			continue
		}
		hasTTFB := ev.Msg.Event.TimeToFirstByte != nil
		if want := id == "weir_b2"; hasTTFB != want || (want && ev.Msg.Event.TimeToFirstByte.AsDuration() != 1500*time.Microsecond) ||
			(ev.Msg.Event.InputTokens == 42) != want || ev.Msg.Event.AccountId != "" {
			t.Errorf("%s stored as %v", id, ev.Msg.Event)
		}
	}
	// The batch keeps its order: the dashboards list by id.
	list, err := e.admin.routes.ListRouteEvents(t.Context(), connect.NewRequest(&weirv1.ListRouteEventsRequest{Limit: 3}))
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, ev := range list.Msg.Events {
		order = append(order, ev.RequestId)
	}
	if !slices.Equal(order, []string{"weir_b3", "weir_b2", "weir_b1"}) {
		t.Errorf("latest first: %v, want the batch's order reversed", order)
	}
	_, err = e.dp.leases.ReportRoutes(t.Context(), batch("weir_c1", "", "weir_c3"))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "events[1].request_id") {
		t.Fatalf("a batch with a bad event: %v, want invalid_argument naming events[1]", err)
	}
	if _, err := e.admin.routes.GetRouteEvent(t.Context(), connect.NewRequest(&weirv1.GetRouteEventRequest{RequestId: "weir_c1"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("a refused batch stored weir_c1: %v", err)
	}
	ids := make([]string, maxRouteBatch+1)
	for i := range ids {
		ids[i] = fmt.Sprintf("weir_d%d", i)
	}
	if _, err := e.dp.leases.ReportRoutes(t.Context(), batch(ids...)); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("a batch of %d: %v, want invalid_argument", len(ids), err)
	}
}

// TestReportRefusals: refusal counts are stored one row per interval,
// key, reason and worker; a count sent again (a redelivered batch) or an
// older, smaller one changes nothing, a larger one replaces it; repeats
// within a batch are merged; ListRefusals sums the workers' rows, newest
// interval first, filtered by key.
func TestReportRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	key, _ := e.createKey("")
	minute := epoch.Truncate(time.Minute)
	count := func(worker, keyID, reason string, start time.Time, n int64) *weirv1.RefusalCount {
		return &weirv1.RefusalCount{WorkerId: worker, KeyId: keyID, Reason: reason, IntervalStart: timestamppb.New(start), Count: n}
	}
	send := func(counts ...*weirv1.RefusalCount) error {
		_, err := e.dp.leases.ReportRoutes(t.Context(), connect.NewRequest(&weirv1.ReportRoutesRequest{Refusals: counts}))
		return err
	}
	batch := []*weirv1.RefusalCount{
		count("w1", key.Id, "key_rate_limit", minute, 500),
		count("w2", key.Id, "key_rate_limit", minute, 250),
		count("w1", "", "invalid_key", minute, 7),
		count("w1", key.Id, "key_rate_limit", minute.Add(-time.Minute), 40),
		count("w1", key.Id, "key_rate_limit", minute, 480), // a repeat: the larger stays
	}
	for range 2 { // the second time, a redelivery
		if err := send(batch...); err != nil {
			t.Fatal(err)
		}
	}
	if err := send(count("w2", key.Id, "key_rate_limit", minute, 100)); err != nil { // older, smaller
		t.Fatal(err)
	}
	var rows int
	if err := e.pool.QueryRow(t.Context(), "SELECT count(*) FROM refusal_counts").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 4 {
		t.Errorf("%d rows, want one per interval, key, reason and worker (4)", rows)
	}
	list := func(req *weirv1.ListRefusalsRequest) []*weirv1.Refusals {
		t.Helper()
		res, err := e.admin.routes.ListRefusals(t.Context(), connect.NewRequest(req))
		if err != nil {
			t.Fatalf("ListRefusals: %v", err)
		}
		return res.Msg.Refusals
	}
	got := list(&weirv1.ListRefusalsRequest{Since: timestamppb.New(minute.Add(-time.Hour))})
	want := []string{
		fmt.Sprintf("%v %s key_rate_limit 750", minute, key.Id),
		fmt.Sprintf("%v  invalid_key 7", minute),
		fmt.Sprintf("%v %s key_rate_limit 40", minute.Add(-time.Minute), key.Id),
	}
	var have []string
	for _, r := range got {
		have = append(have, fmt.Sprintf("%v %s %s %d", r.IntervalStart.AsTime(), r.KeyId, r.Reason, r.Count))
	}
	if !slices.Equal(have, want) {
		t.Errorf("refusals\n got %q\nwant %q", have, want)
	}
	if got := list(&weirv1.ListRefusalsRequest{Since: timestamppb.New(minute), KeyId: key.Id}); len(got) != 1 || got[0].Count != 750 {
		t.Errorf("one key, since the minute: %v", got)
	}
	// A bad count refuses the batch, naming it.
	for _, bad := range []*weirv1.RefusalCount{
		count("", key.Id, "x", minute, 1),
		count("w1", "not-a-uuid", "x", minute, 1),
		count("w1", key.Id, "", minute, 1),
		{WorkerId: "w1", Reason: "x", Count: 1},
		count("w1", key.Id, "x", minute, -1),
	} {
		if err := send(bad); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "refusals[0]") {
			t.Errorf("%v: %v, want invalid_argument naming refusals[0]", bad, err)
		}
	}
}
