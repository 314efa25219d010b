package controlplane

import (
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

func (e *env) getEvent(requestID string) *weirv1.RouteEvent {
	e.t.Helper()
	resp, err := e.admin.routes.GetRouteEvent(e.t.Context(), connect.NewRequest(&weirv1.GetRouteEventRequest{RequestId: requestID}))
	if err != nil {
		e.t.Fatalf("GetRouteEvent %s: %v", requestID, err)
	}
	return resp.Msg.Event
}

// TestRouteEventHoldsAndAttempts: what a worker reports of holds, failure
// stage and attempts comes back from GetRouteEvent and ListRouteEvents.
func TestRouteEventHoldsAndAttempts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	key, _ := e.createKey("")
	a, _ := e.createAccount(acct{label: "a"})
	b, _ := e.createAccount(acct{label: "b"})
	d := durationpb.New
	records := []*weirv1.AttemptRecord{
		{At: d(0), AccountId: a.Id, Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, Status: 529,
			ErrorType: "overloaded_error", Action: weirv1.Action_ACTION_FAILOVER, Duration: d(1200 * time.Millisecond)},
		{At: d(1200 * time.Millisecond), Duration: d(30 * time.Second), HoldReason: "all accounts cooling"},
		{At: d(31200 * time.Millisecond), Duration: d(15 * time.Second), HoldReason: "all accounts at capacity"},
		{At: d(46200 * time.Millisecond), AccountId: b.Id, Class: weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR, Status: 200,
			Action: weirv1.Action_ACTION_RESPOND, Duration: d(4 * time.Second)},
	}
	full := &weirv1.RouteEvent{
		RequestId: "req-held", KeyId: key.Id, AccountId: b.Id, Model: "claude-sonnet-4-5", Status: 200, Attempts: 2,
		Duration: d(50200 * time.Millisecond), TimeToFirstByte: d(47 * time.Second), Stream: true, Surface: "messages",
		StartedAt: timestamppb.New(epoch), Held: d(45 * time.Second), HoldCount: 2,
		FailureStage: weirv1.FailureStage_FAILURE_STAGE_AFTER_OUTPUT, AttemptRecords: records,
	}
	e.report(full)
	e.report(&weirv1.RouteEvent{RequestId: "req-plain", AccountId: a.Id, Status: 200, Attempts: 1, StartedAt: timestamppb.New(epoch)})

	got := e.getEvent("req-held")
	if !proto.Equal(got, full) {
		t.Errorf("GetRouteEvent round trip:\n got %v\nwant %v", got, full)
	}
	plain := e.getEvent("req-plain")
	if plain.Held != nil || plain.HoldCount != 0 || plain.FailureStage != weirv1.FailureStage_FAILURE_STAGE_UNSPECIFIED || len(plain.AttemptRecords) != 0 {
		t.Errorf("a plain event came back with holds or attempts: %v", plain)
	}

	// The list carries the same fields.
	evs := e.listEvents(&weirv1.ListRouteEventsRequest{})
	if len(evs) != 2 || !proto.Equal(evs[1], full) {
		t.Errorf("ListRouteEvents: %v", evs)
	}

	// The columns hold the short vocabulary and readable JSON.
	var stage, attempts string
	var heldMs float64
	if err := e.pool.QueryRow(t.Context(), `SELECT failure_stage, held_ms, attempts_json::text FROM route_events WHERE request_id = 'req-held'`).
		Scan(&stage, &heldMs, &attempts); err != nil {
		t.Fatal(err)
	}
	if stage != "after_output" || heldMs != 45000 || !strings.Contains(attempts, `"OUTCOME_CLASS_OVERLOADED"`) || !strings.Contains(attempts, `"all accounts cooling"`) {
		t.Errorf("stored failure_stage %q held_ms %v attempts_json %s", stage, heldMs, attempts)
	}
	if n := e.count(`SELECT count(*) FROM route_events WHERE request_id = 'req-plain' AND failure_stage = '' AND attempts_json = '[]'::jsonb`); n != 1 {
		t.Errorf("plain event: want empty failure_stage and attempts_json [], %d rows match", n)
	}

	// A stage from a newer worker is stored as none rather than losing the event.
	e.report(&weirv1.RouteEvent{RequestId: "req-future", Status: 500, FailureStage: weirv1.FailureStage(99)})
	if n := e.count(`SELECT count(*) FROM route_events WHERE request_id = 'req-future' AND failure_stage = ''`); n != 1 {
		t.Errorf("unknown failure stage: %d rows stored with an empty stage, want 1", n)
	}

	// A request's event redelivered (a worker sending again a batch whose
	// answer it lost) is stored once: its request id is its identity.
	again := &weirv1.RouteEvent{RequestId: "req-plain", Status: 529, FailureStage: weirv1.FailureStage_FAILURE_STAGE_BEFORE_OUTPUT}
	e.report(again)
	if _, err := e.dp.leases.ReportRoutes(t.Context(), connect.NewRequest(&weirv1.ReportRoutesRequest{
		Events: []*weirv1.RouteEvent{full, again, {RequestId: "req-new", Status: 200}}})); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT count(*) FROM route_events WHERE request_id IN ('req-plain', 'req-held')`); n != 2 {
		t.Errorf("%d rows for two events each reported again, want 2", n)
	}
	if got := e.getEvent("req-plain"); got.Status != 200 {
		t.Errorf("redelivered event replaced the first: %v", got)
	}
	if n := e.count(`SELECT count(*) FROM route_events WHERE request_id = 'req-new'`); n != 1 {
		t.Errorf("the new event in a batch of repeats: %d rows, want 1", n)
	}
}

func TestGetRouteEventErrors(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, err := e.admin.routes.GetRouteEvent(t.Context(), connect.NewRequest(&weirv1.GetRouteEventRequest{RequestId: "nope"}))
	if ce := wantCode(t, err, connect.CodeNotFound); !strings.Contains(ce.Message(), "nope") {
		t.Errorf("message %q does not name the request", ce.Message())
	}
	_, err = e.admin.routes.GetRouteEvent(t.Context(), connect.NewRequest(&weirv1.GetRouteEventRequest{}))
	if ce := wantCode(t, err, connect.CodeInvalidArgument); !strings.HasPrefix(ce.Message(), "request_id:") {
		t.Errorf("message %q", ce.Message())
	}
	// Workers cannot read events.
	_, err = e.dp.routes.GetRouteEvent(t.Context(), connect.NewRequest(&weirv1.GetRouteEventRequest{RequestId: "nope"}))
	wantCode(t, err, connect.CodeUnauthenticated)
}

func TestReportRouteBounds(t *testing.T) {
	t.Parallel()
	e := setup(t)
	many := func(n int) []*weirv1.AttemptRecord {
		out := make([]*weirv1.AttemptRecord, n)
		for i := range out {
			out[i] = &weirv1.AttemptRecord{At: durationpb.New(time.Duration(i) * time.Second), HoldReason: "all accounts cooling"}
		}
		return out
	}
	e.report(&weirv1.RouteEvent{RequestId: strings.Repeat("r", 128), Status: 200, AttemptRecords: many(100)})
	if got := e.getEvent(strings.Repeat("r", 128)); len(got.AttemptRecords) != 100 {
		t.Errorf("%d attempt records back, want 100", len(got.AttemptRecords))
	}
	for _, tc := range []struct {
		name string
		ev   *weirv1.RouteEvent
		want string
	}{
		{"request id too long", &weirv1.RouteEvent{RequestId: strings.Repeat("r", 129)}, "events[0].request_id:"},
		{"too many attempt records", &weirv1.RouteEvent{RequestId: "r", AttemptRecords: many(101)}, "events[0].attempt_records:"},
		{"negative hold count", &weirv1.RouteEvent{RequestId: "r", HoldCount: -1}, "events[0].hold_count:"},
		{"negative held", &weirv1.RouteEvent{RequestId: "r", Held: durationpb.New(-time.Second)}, "events[0].held:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := reportOne(t.Context(), e.dp.leases, tc.ev)
			if ce := wantCode(t, err, connect.CodeInvalidArgument); !strings.HasPrefix(ce.Message(), tc.want) {
				t.Errorf("message %q, want prefix %q", ce.Message(), tc.want)
			}
		})
	}
	if n := e.count(`SELECT count(*) FROM route_events`); n != 1 {
		t.Errorf("%d events stored, want only the valid one", n)
	}
}
