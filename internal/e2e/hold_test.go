package e2e

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/clock"
	"github.com/weirhq/weir/internal/sim"
)

// The capacity hold, end to end. Every test here runs on one virtual clock
// shared by the control plane, the worker and the simulator, and a
// worker's wait advances it at once: minutes of storm take milliseconds,
// and the simulator's attempt times are on the same clock as cooldowns.

func virtualClock() *clock.Manual {
	return clock.NewManual(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC))
}

// heldFor reads the request's route event.
func heldFor(t *testing.T, e *env, r response) *weirv1.RouteEvent {
	t.Helper()
	return e.routeEvent(r.header.Get("Weir-Request-Id"))
}

// sameBodyAndModel checks that every upstream attempt replayed the same
// body on the same model.
func sameBodyAndModel(t *testing.T, e *env) []sim.Attempt {
	t.Helper()
	return sameBodyAnd(t, e, model)
}

// sameBodyAnd is sameBodyAndModel for requests that named want.
func sameBodyAnd(t *testing.T, e *env, want string) []sim.Attempt {
	t.Helper()
	atts := e.sim.Attempts()
	if len(atts) == 0 {
		t.Fatal("no upstream attempts")
	}
	for _, a := range atts[1:] {
		if a.BodySHA256 != atts[0].BodySHA256 || a.Model != atts[0].Model {
			t.Fatalf("attempt %+v differs from the first %+v: a hold must replay the same body on the same model", a, atts[0])
		}
	}
	if atts[0].Model != want {
		t.Fatalf("model %q, want %q (no substitution)", atts[0].Model, want)
	}
	return atts
}

func TestHoldCarriesOneAccountThroughMixedStorm(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{{label: "only", faults: []sim.Fault{
		{Kind: sim.FaultOverloaded},
		{Kind: sim.FaultRateLimit, RetryAfter: 5},
		{Kind: sim.FaultDropConnection},
		{Kind: sim.FaultOverloaded},
	}}}})
	start := v.Now()
	r := e.post(false)
	if r.status != http.StatusOK {
		t.Fatalf("status %d, want 200 after the storm: %s", r.status, r.body)
	}
	atts := sameBodyAndModel(t, e)
	if got := e.attempts(); len(got) != 5 {
		t.Fatalf("upstream attempts %v, want 529, 429, dropped, 529, 200", got)
	}
	ev := heldFor(t, e, r)
	if ev.HoldCount != 4 {
		t.Errorf("hold_count = %d, want 4 (one per transient failure)", ev.HoldCount)
	}
	// The 429's retry-after (5 s) and the transport cooldown (10 s) are
	// floors for the next attempt on the account.
	if gap := atts[2].Time.Sub(atts[1].Time); gap < 5*time.Second {
		t.Errorf("attempt after the 429 came %v later, before its retry-after", gap)
	}
	if gap := atts[3].Time.Sub(atts[2].Time); gap < 10*time.Second {
		t.Errorf("attempt after the transport error came %v later, before its cooldown", gap)
	}
	if gap := atts[1].Time.Sub(atts[0].Time); gap < time.Second || gap > 2*time.Second {
		t.Errorf("overload retry after %v, want 1s on the same account", gap)
	}
	if held := ev.Held.AsDuration(); held < 16*time.Second || v.Now().Sub(start) < held {
		t.Errorf("held %v (virtual elapsed %v)", held, v.Now().Sub(start))
	}
	var holds int
	for _, a := range ev.AttemptRecords {
		if a.HoldReason != "" {
			holds++
		}
	}
	if holds != 4 || ev.Attempts != 5 {
		t.Errorf("records: %d holds, %d attempts; want 4 and 5", holds, ev.Attempts)
	}
}

func TestHoldNeverAttemptsBeforeRetryAfter(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	limited := sim.Fault{Kind: sim.FaultRateLimit, RetryAfter: 5, Times: 2}
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "a", faults: []sim.Fault{limited}}, {label: "b", faults: []sim.Fault{limited}},
	}})
	r := e.post(false)
	if r.status != http.StatusOK {
		t.Fatalf("status %d, want 200: %s", r.status, r.body)
	}
	atts := sameBodyAndModel(t, e)
	last := map[string]time.Time{}
	for _, a := range atts {
		if prev, ok := last[a.Account]; ok && a.Time.Sub(prev) < 5*time.Second {
			t.Errorf("account %s attempted %v after its 429, before retry-after 5s", a.Account, a.Time.Sub(prev))
		}
		if a.Status == http.StatusTooManyRequests {
			last[a.Account] = a.Time
		} else {
			delete(last, a.Account)
		}
	}
	if n := len(atts); n != 5 {
		t.Errorf("attempts %v, want 4 rate-limited then 1 success", e.attempts())
	}
}

func TestHoldOverloadedEventBeforeContentIsInvisible(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{{label: "only", faults: []sim.Fault{
		{Kind: sim.FaultOverloadedEvent, Times: 2},
	}}}})
	r := e.post(true)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	events := sseEvents(t, r.body)
	var starts, stops int
	for _, ev := range events {
		switch ev[0] {
		case "message_start":
			starts++
		case "message_stop":
			stops++
		case "error":
			t.Fatalf("the client saw an error event: %s", ev[1])
		}
	}
	if starts != 1 || stops != 1 || events[0][0] != "message_start" {
		t.Fatalf("want one clean stream, got %d starts, %d stops: %v", starts, stops, events)
	}
	sameBodyAndModel(t, e)
	if got := e.attempts(); len(got) != 3 {
		t.Fatalf("attempts %v, want 2 overloaded events then a stream", got)
	}
}

func TestHoldNeverAfterOutput(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{{label: "only", faults: []sim.Fault{
		{Kind: sim.FaultErrorAfterContent, AfterDeltas: 2},
	}}}})
	r := e.post(true)
	events := sseEvents(t, r.body)
	if len(events) == 0 || events[len(events)-1][0] != "error" {
		t.Fatalf("want the content and then an error event, got %v", events)
	}
	var deltas int
	for _, ev := range events {
		if ev[0] == "content_block_delta" {
			deltas++
		}
	}
	if deltas != 2 {
		t.Errorf("deltas %d, want the 2 sent before the error", deltas)
	}
	if got := e.attempts(); len(got) != 1 {
		t.Fatalf("attempts %v: nothing may be replayed after output", got)
	}
	ev := heldFor(t, e, r)
	if ev.HoldCount != 0 || ev.FailureStage != weirv1.FailureStage_FAILURE_STAGE_AFTER_OUTPUT {
		t.Errorf("hold_count %d, failure_stage %v; want 0 and after_output", ev.HoldCount, ev.FailureStage)
	}
}

func TestHoldFailsAtOnceWhenEveryCredentialIsRevoked(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	revoked := []sim.Fault{{Kind: sim.FaultRevoked, Times: -1}}
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "a", faults: revoked}, {label: "b", faults: revoked},
	}})
	start := v.Now()
	r := e.post(false)
	if v.Now() != start {
		t.Errorf("the worker held %v: waiting cannot help with rejected credentials", v.Now().Sub(start))
	}
	apiErr := weirError(t, r, http.StatusServiceUnavailable, "api_error")
	if !strings.Contains(apiErr.Error.Message, "rejected") || r.header.Get("X-Should-Retry") != "false" {
		t.Errorf("message %q, x-should-retry %q: want a final error naming rejected credentials", apiErr.Error.Message, r.header.Get("X-Should-Retry"))
	}
	if got := e.attempts(); len(got) != 2 {
		t.Errorf("attempts %v, want one per account", got)
	}
}

func TestHoldFailsAtOnceWhenQuotaResetsAfterBudget(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	hour := []sim.Fault{{Kind: sim.FaultRateLimit, RetryAfter: 3600, Times: -1}}
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "a", faults: hour}, {label: "b", faults: hour},
	}})
	start := v.Now()
	r := e.post(false)
	if v.Now() != start {
		t.Errorf("the worker held %v though every account resets after the budget", v.Now().Sub(start))
	}
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "3600" {
		t.Fatalf("status %d retry-after %q, want the upstream 429 with its reset (3600)", r.status, r.header.Get("Retry-After"))
	}
}

func TestHoldEndsWhenBudgetIsSpent(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	const budget = 2 * time.Minute
	e := setup(t, options{virtual: v, hold: budget, accounts: []account{{label: "only", faults: []sim.Fault{
		{Kind: sim.FaultOverloaded, Times: -1},
	}}}})
	start := v.Now()
	r := e.post(false)
	elapsed := v.Now().Sub(start)
	if r.status != 529 {
		t.Fatalf("status %d, want the upstream's 529 when the budget is spent: %s", r.status, r.body)
	}
	// It answers when the budget is spent, or as soon as the breaker's next
	// probe falls after it (no attempt could be made in time): never later,
	// and never more than one probe interval (2 s) early.
	if elapsed > budget || elapsed < budget-2*time.Second {
		t.Errorf("answered after %v, want within the last 2s of the %v budget and never after it", elapsed, budget)
	}
	if ev := heldFor(t, e, r); ev.Attempts < 50 || len(ev.AttemptRecords) > 100 {
		t.Errorf("%d attempts in %d records, want a probe every 2 s (about 60) in at most 100 records", ev.Attempts, len(ev.AttemptRecords))
	}
	ev := heldFor(t, e, r)
	if ev.Held.AsDuration() > budget || ev.FailureStage != weirv1.FailureStage_FAILURE_STAGE_BEFORE_OUTPUT {
		t.Errorf("held %v, stage %v", ev.Held.AsDuration(), ev.FailureStage)
	}
}

func TestHoldBudgetZeroFailsFast(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, accounts: []account{{label: "only", faults: []sim.Fault{{Kind: sim.FaultOverloaded}}}}})
	start := v.Now()
	r := e.post(false)
	if r.status != 529 || v.Now() != start {
		t.Fatalf("status %d after %v, want the 529 at once with budget 0", r.status, v.Now().Sub(start))
	}
	if got := e.attempts(); len(got) != 1 {
		t.Errorf("attempts %v, want exactly one", got)
	}
}

// storm answers 529 overloaded_error while the virtual clock is before
// until, and records when each upstream attempt arrived.
type storm struct {
	clock *clock.Manual
	until time.Time
	next  http.Handler

	mu       sync.Mutex
	attempts []time.Time
}

func (s *storm) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := s.clock.Now()
	s.mu.Lock()
	s.attempts = append(s.attempts, now)
	s.mu.Unlock()
	if now.Before(s.until) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(529)
		w.Write([]byte(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_storm"}`)) //nolint:errcheck // test upstream
		return
	}
	s.next.ServeHTTP(w, r)
}

// TestHoldThroughStormWithSharedBreaker: three workers under concurrent
// load through 529 storms of 10 s, a minute and five minutes. Every request
// succeeds within 3 s of the storm's end, and the shared breaker keeps the
// upstream to one probe of each account every 2 s during it.
func TestHoldThroughStormWithSharedBreaker(t *testing.T) {
	t.Parallel()
	for _, length := range []time.Duration{10 * time.Second, time.Minute, 5 * time.Minute} {
		t.Run(length.String(), func(t *testing.T) {
			t.Parallel()
			holdThroughStorm(t, length)
		})
	}
}

func holdThroughStorm(t *testing.T, length time.Duration) {
	v := virtualClock()
	sched := &scheduler{clock: v}
	cpReg := prometheus.NewRegistry()
	e := setup(t, options{virtual: v, sleep: sched.Sleep, hold: 20 * time.Minute, cpRegistry: cpReg, accounts: []account{
		{label: "a", maxConc: 16}, {label: "b", maxConc: 16}, {label: "c", maxConc: 16},
	}})
	start := v.Now()
	st := &storm{clock: v, until: start.Add(length), next: e.sim}
	e.upstream.next = st
	workers := []string{e.dpSrv.URL}
	for range 2 {
		_, srv := e.newDataplane(nil)
		workers = append(workers, srv.URL)
	}

	const perWorker = 6
	var wg sync.WaitGroup
	statuses := make(chan int, perWorker*len(workers))
	for _, url := range workers {
		for range perWorker {
			wg.Add(1)
			sched.begin()
			go func() {
				defer wg.Done()
				defer sched.end()
				statuses <- e.doWith(http.DefaultClient, url, http.MethodPost, "/v1/messages", messagesBody(false), nil).status
			}()
		}
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != http.StatusOK {
			t.Errorf("a request ended with %d, want 200 after the storm", s)
		}
	}

	st.mu.Lock()
	defer st.mu.Unlock()
	var during []time.Time
	for _, at := range st.attempts {
		if at.Before(st.until) {
			during = append(during, at)
		}
	}
	// Without the breaker every request retries on its own (a same-account
	// retry, then failover and backoff): dozens of attempts per request in
	// a minute, hundreds for 18 requests. With it, after the first wave
	// (every request's first attempt, sent before any answer came back)
	// each of the three accounts is probed once every 2 s: 90 a minute,
	// whatever the number of requests held.
	requests := perWorker * len(workers)
	var offs []string
	afterFirstWave := 0
	for _, at := range during {
		offs = append(offs, at.Sub(start).String())
		if at.Sub(start) >= time.Second {
			afterFirstWave++
		}
	}
	t.Logf("%d requests, %d upstream attempts during the %v storm at %v; all served %v after it began",
		requests, len(during), length, offs, v.Now().Sub(start))
	probes := int(length / policy.ProbeEvery(3))
	if afterFirstWave > probes {
		t.Errorf("%d upstream attempts after the first wave of the storm, want at most %d (each account probed every 2 s)", afterFirstWave, probes)
	}
	// Each account probed every 2 s notices the end of the storm within that.
	if done := v.Now().Sub(st.until); done > 3*time.Second {
		t.Errorf("the last request was served %v after the storm, want within 3s", done)
	}
	// The held requests of each worker park on their model and one asks
	// for all: each worker's leader asks about twice per probe (when the
	// breaker reopens, and when the next probe is due), so about 180
	// Acquires are refused over a minute's storm for 18 requests on 3
	// workers, where each request asking on its own would make 30 times
	// that.
	refused := metricValue(t, cpReg, "weir_controlplane_acquire_seconds", map[string]string{"result": "breaker_open"})
	t.Logf("the control plane refused %v Acquires with the breaker open", refused)
	if limit := float64(2*probes*len(workers) + 2*requests); refused > limit {
		t.Errorf("%v Acquires refused with the breaker open, want at most %v (the held requests share them)", refused, limit)
	}
}

// scheduler runs concurrent requests on virtual time as a discrete-event
// simulation: a worker's wait blocks until every request in flight is
// waiting, then the clock jumps to the earliest wake-up. Concurrent waits
// overlap as they would in real time, in milliseconds.
type scheduler struct {
	clock *clock.Manual

	mu      sync.Mutex
	active  int // requests in flight
	waiters []*waiter
}

type waiter struct {
	at   time.Time
	wake chan struct{}
}

func (s *scheduler) begin() {
	s.mu.Lock()
	s.active++
	s.mu.Unlock()
}

func (s *scheduler) end() {
	s.mu.Lock()
	s.active--
	s.advanceLocked()
	s.mu.Unlock()
}

func (s *scheduler) Sleep(ctx context.Context, d time.Duration) bool {
	w := &waiter{at: s.clock.Now().Add(d), wake: make(chan struct{})}
	s.mu.Lock()
	s.waiters = append(s.waiters, w)
	s.advanceLocked()
	s.mu.Unlock()
	select {
	case <-w.wake:
		return true
	case <-ctx.Done():
		s.mu.Lock()
		s.waiters = slices.DeleteFunc(s.waiters, func(x *waiter) bool { return x == w })
		s.advanceLocked()
		s.mu.Unlock()
		return false
	}
}

// advanceLocked wakes the earliest waiters once everyone is waiting.
func (s *scheduler) advanceLocked() {
	if len(s.waiters) == 0 || len(s.waiters) < s.active {
		return
	}
	next := s.waiters[0].at
	for _, w := range s.waiters[1:] {
		if w.at.Before(next) {
			next = w.at
		}
	}
	s.clock.AdvanceTo(next)
	s.waiters = slices.DeleteFunc(s.waiters, func(w *waiter) bool {
		if w.at.After(next) {
			return false
		}
		close(w.wake)
		return true
	})
}
