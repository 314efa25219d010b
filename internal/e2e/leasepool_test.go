package e2e

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/prometheus/client_golang/prometheus"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/internal/sim"
)

// metricValue sums the samples of a counter or gauge whose labels include
// every pair in labels.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue metrics
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// poolReady waits until a worker's pool watch is connected.
func poolReady(t *testing.T, reg *prometheus.Registry) {
	t.Helper()
	eventually(t, "the worker's pool watch to be ready", func() bool {
		return metricValue(t, reg, "weir_dataplane_lease_pool_ready", nil) == 1
	})
}

// TestLeaseReuse: consecutive requests of one key and model reuse one
// lease without asking the control plane, every success is still recorded
// (route events, the account's last success), and the idle lease goes back
// to the pool on its own.
func TestLeaseReuse(t *testing.T) {
	t.Parallel()
	cpReg, dpReg := prometheus.NewRegistry(), prometheus.NewRegistry()
	e := setup(t, options{cpRegistry: cpReg, dpRegistry: dpReg, leaseIdle: time.Second, accounts: []account{{label: "solo", maxConc: 4}}})
	poolReady(t, dpReg)

	const n = 20
	var ids []string
	for i := range n {
		r := e.post(i%2 == 1)
		if r.status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, r.status, r.body)
		}
		ids = append(ids, r.header.Get("Weir-Request-Id"))
	}
	reused := metricValue(t, dpReg, "weir_dataplane_lease_pool_total", map[string]string{"result": "reused"})
	acquired := metricValue(t, dpReg, "weir_dataplane_lease_pool_total", map[string]string{"result": "acquired"})
	// One Acquire, and every other request on the kept lease; on a slow
	// run the 2 s reuse deadline can lapse once or twice mid-sequence.
	if reused+acquired != n || acquired < 1 || acquired > 3 {
		t.Fatalf("pool served reused=%v acquired=%v, want %d in all, 1 to 3 of them asked", reused, acquired, n)
	}
	// A prefetch may still be on its way to the control plane.
	eventually(t, "the control plane's Acquires to be the worker's", func() bool {
		return metricValue(t, cpReg, "weir_controlplane_acquire_seconds", nil) ==
			acquired+metricValue(t, dpReg, "weir_dataplane_lease_pool_total", map[string]string{"result": "prefetch"})
	})
	for _, id := range ids {
		if ev := e.routeEvent(id); ev.AccountId != e.ids["solo"] || ev.Status != http.StatusOK {
			t.Fatalf("route event %s = account %s status %d", id, ev.AccountId, ev.Status)
		}
	}
	eventually(t, "the successes to be recorded", func() bool {
		return e.account("solo").LastSuccessAt != nil
	})
	// The idle lease is returned after the worker's idle period.
	e.leasesReleased()
}

// TestLeaseReuseStopsOnAnotherWorkersCooldown: a cooldown written by one
// worker's outcome reaches every other worker through the pool watch, and
// the next request there does not reuse its lease on the cooling account.
func TestLeaseReuseStopsOnAnotherWorkersCooldown(t *testing.T) {
	t.Parallel()
	const limited = "claude-limited-1"
	dpReg := prometheus.NewRegistry()
	e := setup(t, options{dpRegistry: dpReg, leaseIdle: time.Second, accounts: []account{
		{label: "first", priority: 10, faults: []sim.Fault{{Kind: sim.FaultRateLimit, RetryAfter: 60, Times: -1, Model: limited}}},
		{label: "second"},
	}})
	poolReady(t, dpReg)
	_, otherSrv := e.newDataplane(nil)

	// The first worker now holds a reusable lease on first. A client can
	// have its answer a moment before the lease is back to idle, so its
	// next request may ask again: up to five requests to see one reuse.
	for i := 0; metricValue(t, dpReg, "weir_dataplane_lease_pool_total", map[string]string{"result": "reused"}) < 1; i++ {
		if i == 5 {
			t.Fatal("five sequential requests and no reuse")
		}
		if r := e.post(false); r.status != http.StatusOK {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
	before := metricValue(t, dpReg, "weir_dataplane_lease_pool_invalidations_total", map[string]string{"scope": "account"})

	// The other worker's request is refused on first (429, a minute):
	// first cools, and that worker fails over to second.
	body := strings.Replace(messagesBody(false), model, limited, 1)
	r := e.doWith(otherSrv.Client(), otherSrv.URL, http.MethodPost, "/v1/messages", body, nil)
	if r.status != http.StatusOK {
		t.Fatalf("other worker: status %d: %s", r.status, r.body)
	}
	if cd := e.account("first").GetCooldown(); cd.GetReason() != weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED {
		t.Fatalf("first's cooldown = %v, want rate_limited", cd)
	}
	eventually(t, "the cooldown to reach the first worker", func() bool {
		return metricValue(t, dpReg, "weir_dataplane_lease_pool_invalidations_total", map[string]string{"scope": "account"}) > before
	})

	start := len(e.sim.Attempts())
	if r := e.post(false); r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	got := e.sim.Attempts()[start:]
	if len(got) != 1 || got[0].Account != "second" {
		t.Fatalf("after the cooldown the first worker sent %+v, want one attempt on second", got)
	}
}

// TestLeaseReuseKeepsTheConcurrencyCap: two workers reusing leases on one
// account with a cap of two never run more than two requests on it at
// once, and a third concurrent request waits its turn rather than
// exceeding it.
func TestLeaseReuseKeepsTheConcurrencyCap(t *testing.T) {
	t.Parallel()
	dpReg := prometheus.NewRegistry()
	e := setup(t, options{dpRegistry: dpReg, hold: 3 * waitFor, deltaDelay: 5e6, accounts: []account{{label: "capped", maxConc: 2}}})
	poolReady(t, dpReg)
	_, otherSrv := e.newDataplane(nil)

	var wg sync.WaitGroup
	statuses := make(chan int, 12)
	for i := range 12 {
		wg.Go(func() {
			c, base := e.client, e.dpSrv.URL
			if i%2 == 1 {
				c, base = otherSrv.Client(), otherSrv.URL
			}
			statuses <- e.doWith(c, base, http.MethodPost, "/v1/messages", messagesBody(true), nil).status
		})
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != http.StatusOK {
			t.Fatalf("a request got %d, want every one served in turn", s)
		}
	}
	switch peak := e.upstream.peakConcurrency(e.creds["capped"]); {
	case peak > 2:
		t.Fatalf("capped ran %d requests at once, cap 2", peak)
	case peak < 2:
		t.Fatalf("capped ran at most %d request at once: the test did not load it", peak)
	}
}

// TestHeldRequestsShareOneAcquire: while an account cools, a worker's held
// requests of one class share the control plane's "no account" answer:
// dozens of held requests cost a handful of Acquires, not dozens per probe.
func TestHeldRequestsShareOneAcquire(t *testing.T) {
	t.Parallel()
	cpReg, dpReg := prometheus.NewRegistry(), prometheus.NewRegistry()
	e := setup(t, options{cpRegistry: cpReg, dpRegistry: dpReg, hold: waitFor, accounts: []account{
		{label: "only", faults: []sim.Fault{{Kind: sim.FaultRateLimit, RetryAfter: 2}}},
	}})
	poolReady(t, dpReg)
	// The first request meets the 429 and is held until the account's
	// two-second cooldown ends; the second, arriving while it cools, is
	// refused and marks its class as refused.
	early := make(chan response, 2)
	go func() { early <- e.post(false) }()
	eventually(t, "the account to cool", func() bool { return e.account("only").GetCooldown() != nil })
	go func() { early <- e.post(false) }()
	eventually(t, "the class to be refused", func() bool {
		return metricValue(t, cpReg, "weir_controlplane_acquire_seconds", map[string]string{"result": "all_cooling"}) >= 1
	})

	const held = 40
	var wg sync.WaitGroup
	statuses := make(chan int, held)
	for range held {
		wg.Go(func() { statuses <- e.post(false).status })
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != http.StatusOK {
			t.Fatalf("a held request got %d, want 200 after the cooldown", s)
		}
	}
	for range 2 {
		if r := <-early; r.status != http.StatusOK {
			t.Fatalf("an early request: status %d: %s", r.status, r.body)
		}
	}
	refused := metricValue(t, cpReg, "weir_controlplane_acquire_seconds", map[string]string{"result": "all_cooling"})
	shared := metricValue(t, dpReg, "weir_dataplane_lease_pool_total", map[string]string{"result": "shared_none"})
	// A new request asks unless one of its class is asking already, so a
	// few of the 40 ask (more on a loaded machine, where they arrive
	// spread out); held, they share. Each asking on its own would make
	// at least held.
	if refused > held/2 || shared == 0 {
		t.Fatalf("control plane refused %v Acquires and the worker shared %v answers; want ≤ %d and some", refused, shared, held/2)
	}
	t.Logf("%d held requests: %v refused Acquires, %v shared answers", held, refused, shared)
}

// rpcCounter is a worker's LeaseService transport that counts the calls
// of each method, and the Acquire calls in flight at once.
type rpcCounter struct {
	next           http.RoundTripper
	mu             sync.Mutex
	inFlight, peak int // Acquire
	calls          map[string]int
}

func newRPCCounter() *rpcCounter {
	return &rpcCounter{next: rpcclient.HTTPClient().Transport, calls: map[string]int{}}
}

func (a *rpcCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	method := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
	a.mu.Lock()
	a.calls[method]++
	if method == "Acquire" {
		a.inFlight++
		a.peak = max(a.peak, a.inFlight)
	}
	a.mu.Unlock()
	if method == "Acquire" {
		defer func() {
			a.mu.Lock()
			a.inFlight--
			a.mu.Unlock()
		}()
	}
	return a.next.RoundTrip(r)
}

func (a *rpcCounter) count(method string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls[method]
}

// TestColdBurstAsksAFewAtATime: a burst of one class on a worker with no
// lease yet does not send every request to Acquire at once (under load
// that stampede is what slows Acquire down for everyone): a few ask, the
// rest wait for a lease to come back or a slot to ask, and all are served.
func TestColdBurstAsksAFewAtATime(t *testing.T) {
	t.Parallel()
	dpReg := prometheus.NewRegistry()
	e := setup(t, options{dpRegistry: dpReg, noDataplane: true, deltaDelay: 2e6, accounts: []account{{label: "a", maxConc: 50}, {label: "b", maxConc: 50}}})
	counter := newRPCCounter()
	e.dp, e.dpSrv = e.newDataplane(&http.Client{Transport: counter})
	e.client = e.dpSrv.Client()
	poolReady(t, dpReg)

	const burst = 40
	var wg sync.WaitGroup
	statuses := make(chan int, burst)
	for range burst {
		wg.Go(func() {
			statuses <- e.do(http.MethodPost, "/v1/messages", messagesBody(true), nil).status
		})
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != http.StatusOK {
			t.Fatalf("a request got %d, want all %d served", s, burst)
		}
	}
	counter.mu.Lock()
	peak, calls := counter.peak, counter.calls["Acquire"]
	counter.mu.Unlock()
	// Four for requests, and up to four replacements asked off the path.
	if peak > 8 {
		t.Errorf("%d Acquires in flight at once, want at most 8", peak)
	}
	if q := metricValue(t, dpReg, "weir_dataplane_lease_pool_total", map[string]string{"result": "queued"}); q == 0 {
		t.Errorf("no request waited (Acquires %d, peak %d): the burst did not test the gate", calls, peak)
	}
	t.Logf("%d requests: %d Acquires, at most %d at once", burst, calls, peak)
}

// TestReportsAreBatched: under load a worker sends its route events and
// kept leases' successes at most once per ReportInterval, each call
// carrying everything queued since, and every event still arrives.
func TestReportsAreBatched(t *testing.T) {
	t.Parallel()
	const interval = 100 * time.Millisecond
	dpReg := prometheus.NewRegistry()
	e := setup(t, options{dpRegistry: dpReg, noDataplane: true, reportInterval: interval, accounts: []account{{label: "a", maxConc: 50}}})
	counter := newRPCCounter()
	e.dp, e.dpSrv = e.newDataplane(&http.Client{Transport: counter})
	e.client = e.dpSrv.Client()
	poolReady(t, dpReg)

	const requests, clients = 400, 8
	ids := make(chan string, requests)
	start := time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for range requests / clients {
				r := e.do(http.MethodPost, "/v1/messages", messagesBody(false), nil)
				if r.status != http.StatusOK {
					t.Errorf("client %d: status %d", c, r.status)
					return
				}
				ids <- r.header.Get("Weir-Request-Id")
			}
		})
	}
	wg.Wait()
	close(ids)
	var last string
	for id := range ids {
		last = id
	}
	e.routeEvent(last)
	elapsed := time.Since(start)
	// One call per interval at most, plus the first (it goes at once) and
	// the one that may be in flight as the clock is read.
	bound := int(elapsed/interval) + 2
	for _, m := range []string{"ReportRoutes", "ReleaseBatch"} {
		if n := counter.count(m); n > bound {
			t.Errorf("%s: %d calls in %v for %d requests, want at most %d", m, n, elapsed.Round(time.Millisecond), requests, bound)
		}
	}
	res, err := e.routes.ListRouteEvents(t.Context(), connect.NewRequest(&weirv1.ListRouteEventsRequest{Limit: 1000}))
	if err != nil {
		t.Fatal(err)
	}
	if got := len(res.Msg.Events); got < requests {
		t.Errorf("%d route events stored, want all %d", got, requests)
	}
	t.Logf("%d requests in %v: %d ReportRoutes, %d ReleaseBatch calls", requests, elapsed.Round(time.Millisecond),
		counter.count("ReportRoutes"), counter.count("ReleaseBatch"))
}
