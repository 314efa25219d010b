package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/weirhq/weir/controlplane"

	"github.com/weirhq/weir/dataplane"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/internal/sim"
)

// More of the capacity hold, end to end: streams that stall, what weir
// explain reads of a held request, and a control plane that is briefly
// unreachable. Virtual time as in hold_test.go; a stream's idle watchdog
// runs on real time (200 ms here).

// holdMoreWorker starts a worker like newDataplane, with a stream idle
// timeout and, when cp is set, its own LeaseService client; edit may
// change the config last.
func (e *env) holdMoreWorker(idle time.Duration, cp *http.Client, edit ...func(*dataplane.Config)) *httptest.Server {
	e.t.Helper()
	cfg := dataplane.Config{
		ControlPlaneURL:   e.cpSrv.URL,
		Token:             e.dpToken,
		KeyCacheTTL:       50 * time.Millisecond,
		MaxAttempts:       e.opts.maxAttempts,
		ControlPlane:      cp,
		Logger:            slog.New(slog.DiscardHandler),
		CapacityHold:      e.opts.holdBudget(),
		StreamIdleTimeout: idle,
	}
	if v := e.opts.virtual; v != nil {
		cfg.Now = v.Now
		cfg.Sleep = func(ctx context.Context, d time.Duration) bool {
			v.AdvanceTo(v.Now().Add(d))
			return ctx.Err() == nil
		}
		cfg.Rand = func() float64 { return 0.5 }
	}
	for _, f := range edit {
		f(&cfg)
	}
	dp, err := dataplane.New(cfg)
	if err != nil {
		e.t.Fatalf("dataplane.New: %v", err)
	}
	srv := httptest.NewServer(dp.Handler())
	e.t.Cleanup(func() {
		closeServer(srv)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		dp.Close(ctx)
	})
	return srv
}

// Events of the stream that stalls; the ids say whose bytes a client got.
const (
	stallStart = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_stalled\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"" + model + "\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n"
	stallBlock = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
	stallDelta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"stalled-\"}}\n\n"
)

// stallFirst answers the first Messages request with a 200 stream that
// sends prefix and then nothing, until the worker cuts it; every later
// request goes to next.
type stallFirst struct {
	prefix string
	next   http.Handler
	n      atomic.Int32
	cut    chan struct{} // closed when the stalled request's connection ended
}

func (s *stallFirst) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/messages" || s.n.Add(1) > 1 {
		s.next.ServeHTTP(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Request-Id", "req_stalled")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, s.prefix)           //nolint:errcheck // test upstream
	http.NewResponseController(w).Flush() //nolint:errcheck // test upstream
	<-r.Context().Done()
	close(s.cut)
}

// waitClosed waits for ch to close, failing the test after waitFor.
func waitClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitFor):
		t.Fatalf("timed out after %v waiting for %s", waitFor, what)
	}
}

func eventNames(evs [][2]string) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev[0])
	}
	return out
}

// TestHoldStallBeforeOutputIsReplayed: a stream that goes silent after
// message_start, before any output, is cut by the idle watchdog and
// replayed; the client gets one clean stream, none of the stalled one.
func TestHoldStallBeforeOutputIsReplayed(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: time.Minute, noDataplane: true, accounts: []account{{label: "only"}}})
	st := &stallFirst{prefix: stallStart, next: e.sim, cut: make(chan struct{})}
	e.upstream.next = st
	srv := e.holdMoreWorker(200*time.Millisecond, nil)

	r := e.doWith(srv.Client(), srv.URL, http.MethodPost, "/v1/messages", messagesBody(true), nil)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	waitClosed(t, "the stalled upstream stream to be cut", st.cut)
	if strings.Contains(string(r.body), "msg_stalled") {
		t.Fatalf("the client got bytes of the stalled stream: %s", r.body)
	}
	evs := sseEvents(t, r.body)
	names := eventNames(evs)
	var starts, deltas int
	for _, n := range names {
		switch n {
		case "message_start":
			starts++
		case "content_block_delta":
			deltas++
		case "error":
			t.Fatalf("the client saw an error event: %v", names)
		}
	}
	if starts != 1 || deltas == 0 || names[0] != "message_start" || names[len(names)-1] != "message_stop" {
		t.Fatalf("want one clean stream from the replay, got %v", names)
	}
	if got := e.attempts(); len(got) != 1 || got[0] != "only:ok:200" {
		t.Errorf("simulator attempts %v, want the replay only", got)
	}
	if n := len(e.upstream.exchanges()); n != 2 {
		t.Errorf("upstream saw %d requests, want the stalled one and the replay", n)
	}

	ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
	if ev.Attempts != 2 || ev.Status != http.StatusOK || ev.FailureStage != weirv1.FailureStage_FAILURE_STAGE_UNSPECIFIED {
		t.Errorf("route event: attempts %d status %d stage %v, want 2, 200, none", ev.Attempts, ev.Status, ev.FailureStage)
	}
	var atts []*weirv1.AttemptRecord
	for _, a := range ev.AttemptRecords {
		if a.HoldReason == "" {
			atts = append(atts, a)
		}
	}
	if len(atts) != 2 {
		t.Fatalf("attempt records %v, want 2", ev.AttemptRecords)
	}
	if a := atts[0]; a.Class != weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR || a.Status != http.StatusOK || a.Action != weirv1.Action_ACTION_FAILOVER {
		t.Errorf("stalled attempt: %v, want a transport error after a 200, failed over", a)
	}
	if a := atts[1]; a.Class != weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS || a.Action != weirv1.Action_ACTION_RESPOND {
		t.Errorf("replay: %v", a)
	}
	// The stall cooled the only account (transport, 10 s): the request was
	// held for it, not failed.
	if ev.HoldCount != 1 || ev.Held.AsDuration() != 10*time.Second {
		t.Errorf("hold_count %d held %v, want one hold of the 10s transport cooldown", ev.HoldCount, ev.Held.AsDuration())
	}
}

// TestHoldStallAfterOutput: a stream that goes silent after output cannot
// be replayed: the client keeps what it got and then weir's error event.
func TestHoldStallAfterOutput(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: time.Minute, noDataplane: true, accounts: []account{{label: "only"}}})
	st := &stallFirst{prefix: stallStart + stallBlock + stallDelta, next: e.sim, cut: make(chan struct{})}
	e.upstream.next = st
	srv := e.holdMoreWorker(200*time.Millisecond, nil)

	r := e.doWith(srv.Client(), srv.URL, http.MethodPost, "/v1/messages", messagesBody(true), nil)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	waitClosed(t, "the stalled upstream stream to be cut", st.cut)
	want := stallStart + stallBlock + stallDelta
	if !strings.HasPrefix(string(r.body), want) {
		t.Fatalf("client got %q, want the partial stream %q first", r.body, want)
	}
	evs := sseEvents(t, r.body)
	if names := eventNames(evs); len(names) != 4 || names[3] != "error" {
		t.Fatalf("events %v, want the 3 relayed and weir's error", names)
	}
	var body struct {
		Type  string `json:"type"`
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(evs[3][1]), &body); err != nil || body.Type != "error" || body.Error.Type != "api_error" {
		t.Errorf("error event %s (%v), want an api_error in the Anthropic shape", evs[3][1], err)
	}
	if n := len(e.upstream.exchanges()); n != 1 || len(e.sim.Attempts()) != 0 {
		t.Errorf("upstream saw %d requests: nothing may be replayed after output", n)
	}
	ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
	if ev.FailureStage != weirv1.FailureStage_FAILURE_STAGE_AFTER_OUTPUT || ev.Attempts != 1 || ev.HoldCount != 0 {
		t.Errorf("route event: stage %v attempts %d holds %d, want after_output, 1, 0", ev.FailureStage, ev.Attempts, ev.HoldCount)
	}
	if len(ev.AttemptRecords) != 1 || ev.AttemptRecords[0].Class != weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR ||
		ev.AttemptRecords[0].Action != weirv1.Action_ACTION_RESPOND {
		t.Errorf("attempt records %v, want one stream error", ev.AttemptRecords)
	}
	e.leasesReleased()
}

// getRouteEvent polls GetRouteEvent (what weir explain reads) until the
// worker's report has landed.
func (e *env) getRouteEvent(requestID string) *weirv1.RouteEvent {
	e.t.Helper()
	var found *weirv1.RouteEvent
	eventually(e.t, "GetRouteEvent "+requestID, func() bool {
		res, err := e.routes.GetRouteEvent(e.t.Context(), connect.NewRequest(&weirv1.GetRouteEventRequest{RequestId: requestID}))
		if connect.CodeOf(err) == connect.CodeNotFound {
			return false
		}
		if err != nil {
			e.t.Fatalf("GetRouteEvent: %v", err)
		}
		found = res.Msg.Event
		return !found.Pending // a request in progress is recorded as such first
	})
	return found
}

// TestExplainHeldRequest: the route event of a held request lists its
// attempts and holds in time order, each hold with its reason.
func TestExplainHeldRequest(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{{label: "only", faults: []sim.Fault{
		{Kind: sim.FaultOverloaded},
		{Kind: sim.FaultRateLimit, RetryAfter: 5},
	}}}})
	r := e.post(false)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	ev := e.getRouteEvent(r.header.Get("Weir-Request-Id"))
	recs := ev.AttemptRecords
	type step struct {
		hold   bool
		class  weirv1.OutcomeClass
		status int32
		errTyp string
		action weirv1.Action
		reason []string // substrings of the hold reason
		wait   time.Duration
	}
	id := e.ids["only"]
	want := []step{
		{class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, status: 529, errTyp: "overloaded_error", action: weirv1.Action_ACTION_RETRY_SAME},
		{hold: true, reason: []string{"overloaded", "same account"}, wait: time.Second},
		{class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, status: 429, errTyp: "rate_limit_error", action: weirv1.Action_ACTION_FAILOVER},
		{hold: true, reason: []string{"tried", "recovers at"}, wait: 5 * time.Second},
		{class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, status: 200, action: weirv1.Action_ACTION_RESPOND},
	}
	if len(recs) != len(want) {
		t.Fatalf("records %v, want %d", recs, len(want))
	}
	var held time.Duration
	for i, w := range want {
		rec := recs[i]
		if w.hold {
			held += rec.Duration.AsDuration()
			if rec.AccountId != "" || rec.Class != weirv1.OutcomeClass_OUTCOME_CLASS_UNSPECIFIED || rec.Duration.AsDuration() != w.wait {
				t.Errorf("record %d: %v, want a hold of %v", i, rec, w.wait)
			}
			for _, s := range w.reason {
				if !strings.Contains(rec.HoldReason, s) {
					t.Errorf("record %d: hold reason %q lacks %q", i, rec.HoldReason, s)
				}
			}
		} else if rec.HoldReason != "" || rec.AccountId != id || rec.Class != w.class || rec.Status != w.status ||
			rec.ErrorType != w.errTyp || rec.Action != w.action {
			t.Errorf("record %d: %v, want an attempt on only: %v %d %q %v", i, rec, w.class, w.status, w.errTyp, w.action)
		}
		if i == 0 {
			continue
		}
		prev := recs[i-1]
		if rec.At.AsDuration() < prev.At.AsDuration()+prev.Duration.AsDuration() {
			t.Errorf("record %d at %v begins before record %d (at %v for %v) ended", i, rec.At.AsDuration(), i-1,
				prev.At.AsDuration(), prev.Duration.AsDuration())
		}
	}
	if ev.HoldCount != 2 || ev.Attempts != 3 || ev.Held.AsDuration() != held || ev.Status != http.StatusOK {
		t.Errorf("event: holds %d attempts %d held %v (records %v) status %d", ev.HoldCount, ev.Attempts, ev.Held.AsDuration(), held, ev.Status)
	}
}

// flakyAcquire fails the first fail Acquire calls as a control plane that
// is restarting would (connection refused), and passes everything else.
type flakyAcquire struct {
	base  http.RoundTripper
	fail  int32
	calls atomic.Int32
}

var errRestarting = errors.New("dial tcp: connection refused (control plane restarting)")

func (f *flakyAcquire) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/Acquire") && f.calls.Add(1) <= f.fail {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, errRestarting
	}
	return f.base.RoundTrip(r)
}

// TestHoldControlPlaneBriefUnavailable: a worker that cannot reach the
// control plane for its first three Acquires holds the request and serves
// it once the control plane answers; with no hold budget it answers a
// retryable 503 at once.
func TestHoldControlPlaneBriefUnavailable(t *testing.T) {
	t.Parallel()

	t.Run("held", func(t *testing.T) {
		t.Parallel()
		v := virtualClock()
		e := setup(t, options{virtual: v, hold: 20 * time.Minute, noDataplane: true, accounts: []account{{label: "only"}}})
		flaky := &flakyAcquire{base: rpcclient.HTTPClient().Transport, fail: 3}
		srv := e.holdMoreWorker(0, &http.Client{Transport: flaky})
		start := v.Now()
		r := e.doWith(srv.Client(), srv.URL, http.MethodPost, "/v1/messages", messagesBody(false), nil)
		if r.status != http.StatusOK {
			t.Fatalf("status %d, want 200 once the control plane answers: %s", r.status, r.body)
		}
		if n := flaky.calls.Load(); n != 4 {
			t.Errorf("%d Acquire calls, want 3 failed and 1 served", n)
		}
		if got := e.attempts(); len(got) != 1 {
			t.Errorf("upstream attempts %v, want 1", got)
		}
		ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
		// Backoff 0.5 s doubling (no jitter under the virtual clock).
		waits := []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}
		if ev.HoldCount != 3 || ev.Attempts != 1 || ev.Held.AsDuration() != 3500*time.Millisecond {
			t.Errorf("holds %d attempts %d held %v, want 3, 1, 3.5s", ev.HoldCount, ev.Attempts, ev.Held.AsDuration())
		}
		var holds []*weirv1.AttemptRecord
		for _, a := range ev.AttemptRecords {
			if a.HoldReason != "" {
				holds = append(holds, a)
			}
		}
		if len(holds) != len(waits) {
			t.Fatalf("hold records %v", ev.AttemptRecords)
		}
		for i, h := range holds {
			if h.HoldReason != "control plane unreachable" || h.Duration.AsDuration() != waits[i] {
				t.Errorf("hold %d: %q for %v, want control plane unreachable for %v", i, h.HoldReason, h.Duration.AsDuration(), waits[i])
			}
		}
		if elapsed := v.Now().Sub(start); elapsed < 3500*time.Millisecond {
			t.Errorf("served after %v of virtual time, want at least the 3.5s held", elapsed)
		}
	})

	t.Run("no budget", func(t *testing.T) {
		t.Parallel()
		v := virtualClock()
		e := setup(t, options{virtual: v, noDataplane: true, accounts: []account{{label: "only"}}})
		flaky := &flakyAcquire{base: rpcclient.HTTPClient().Transport, fail: 3}
		srv := e.holdMoreWorker(0, &http.Client{Transport: flaky})
		start := v.Now()
		r := e.doWith(srv.Client(), srv.URL, http.MethodPost, "/v1/messages", messagesBody(false), nil)
		weirError(t, r, http.StatusServiceUnavailable, "api_error")
		if got := r.header.Get("Retry-After"); got != "2" {
			t.Errorf("Retry-After %q, want 2", got)
		}
		if got := r.header.Get("X-Should-Retry"); got != "true" {
			t.Errorf("X-Should-Retry %q, want true", got)
		}
		if v.Now() != start {
			t.Errorf("held %v with no budget", v.Now().Sub(start))
		}
		if n := flaky.calls.Load(); n != 1 {
			t.Errorf("%d Acquire calls, want 1", n)
		}
		if n := len(e.sim.Attempts()); n != 0 {
			t.Errorf("%d upstream attempts, want none", n)
		}
		ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
		if ev.HoldCount != 0 || ev.Attempts != 0 || ev.FailureStage != weirv1.FailureStage_FAILURE_STAGE_BEFORE_OUTPUT || ev.ErrorType != "api_error" {
			t.Errorf("route event: holds %d attempts %d stage %v error %q", ev.HoldCount, ev.Attempts, ev.FailureStage, ev.ErrorType)
		}
	})
}

// TestHoldBreakerOpenUnderClockSkew: a worker whose clock runs ahead of
// the control plane's by more than breakerPoll (1 s) reads every
// "BREAKER_OPEN, retry at control-plane now + 1 s" as already past. Since
// breaker waits are not backed off, it must still wait before asking
// again, not re-Acquire in a tight loop while the probe runs.
func TestHoldBreakerOpenUnderClockSkew(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, noDataplane: true, accounts: []account{{label: "only", maxConc: 8}}})
	ctx := t.Context()
	keyHash := controlplane.HashKey(e.key)
	acquire := func() *weirv1.AcquireResponse {
		res, err := e.leases.Acquire(ctx, connect.NewRequest(&weirv1.AcquireRequest{KeyHash: keyHash, Model: model, RequestId: "other-worker"}))
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		return res.Msg
	}
	// Another worker's overloads open the sonnet breaker...
	var leases []*weirv1.Lease
	for range 3 {
		l := acquire().GetLease()
		if l == nil {
			t.Fatal("no lease before the breaker opened")
		}
		leases = append(leases, l)
	}
	for _, l := range leases {
		if _, err := e.leases.Release(ctx, connect.NewRequest(&weirv1.ReleaseRequest{LeaseId: l.Id, Outcome: &weirv1.Outcome{
			Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, Status: 529, ErrorType: "overloaded_error",
		}})); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	// ...and, once its wait is over, that worker's request is the probe.
	v.Advance(2 * time.Second)
	if acquire().GetLease() == nil {
		t.Fatal("no probe lease")
	}
	if none := acquire().GetNoAccount(); none.GetReason() != weirv1.NoAccountReason_NO_ACCOUNT_REASON_BREAKER_OPEN {
		t.Fatalf("want BREAKER_OPEN while the probe runs, got %v", none)
	}

	const skew = 5 * time.Second
	var zero atomic.Int32
	srv := e.holdMoreWorker(0, nil, func(c *dataplane.Config) {
		c.Now = func() time.Time { return v.Now().Add(skew) }
		c.Sleep = func(ctx context.Context, d time.Duration) bool {
			if d <= 0 {
				// A busy loop: stop it here rather than spin forever.
				zero.Add(1)
				return false
			}
			v.AdvanceTo(v.Now().Add(d))
			return ctx.Err() == nil
		}
	})
	r := e.doWith(srv.Client(), srv.URL, http.MethodPost, "/v1/messages", messagesBody(false), nil)
	if n := zero.Load(); n > 0 {
		t.Fatalf("the worker held for 0s behind an open breaker (clock %v ahead): it would re-Acquire in a tight loop", skew)
	}
	// The probe never reports: its slot frees after probeTTL, and the
	// skewed worker's request is served then.
	if r.status != http.StatusOK {
		t.Errorf("status %d, want 200 once the probe slot frees: %s", r.status, r.body)
	}
}
