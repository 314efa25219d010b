package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weirhq/weir/internal/sim"
)

// TestCooldownStopsEveryWorker: three workers each keep a reusable lease
// on one account when it starts answering 429 (retry after a minute). The
// first 429, on one worker, cools it for all of them: the simulator sees
// no second 429 on it, neither from the other workers' next requests
// (which would otherwise reuse their leases on it) nor under concurrent
// load from all three afterwards, and every client gets a 200.
func TestCooldownStopsEveryWorker(t *testing.T) {
	t.Parallel()
	dpReg := prometheus.NewRegistry()
	e := setup(t, options{noDataplane: true, dpRegistry: dpReg, leaseIdle: 2 * time.Second, accounts: []account{
		{label: "busy", priority: 10, maxConc: 50},
		{label: "spare", maxConc: 50},
	}})
	var workers []string
	var clients []*http.Client
	for range 3 {
		_, srv := e.newDataplane(nil)
		workers, clients = append(workers, srv.URL), append(clients, srv.Client())
	}
	poolReady(t, dpReg)
	post := func(i int) response {
		return e.doWith(clients[i], workers[i], http.MethodPost, "/v1/messages", messagesBody(false), nil)
	}
	// Each worker now keeps a lease on busy for reuse.
	for i := range workers {
		for range 2 {
			if r := post(i); r.status != http.StatusOK {
				t.Fatalf("worker %d: status %d: %s", i, r.status, r.body)
			}
		}
	}
	if got := metricValue(t, dpReg, "weir_dataplane_lease_pool_total", map[string]string{"result": "reused"}); got < 1 {
		t.Fatalf("the first worker reused %v leases, want its second request on the first's lease", got)
	}

	if err := e.sim.AddFaults("busy", sim.Fault{Kind: sim.FaultRateLimit, RetryAfter: 60, Times: -1}); err != nil {
		t.Fatal(err)
	}
	before := metricValue(t, dpReg, "weir_dataplane_lease_pool_invalidations_total", map[string]string{"scope": "account"})
	if r := post(0); r.status != http.StatusOK {
		t.Fatalf("the first 429 was not failed over: status %d: %s", r.status, r.body)
	}
	// The cooldown reached the first worker's pool watch; the others'
	// streams carry the same notification.
	eventually(t, "the cooldown's notification", func() bool {
		return metricValue(t, dpReg, "weir_dataplane_lease_pool_invalidations_total", map[string]string{"scope": "account"}) > before
	})
	for i := 1; i < len(workers); i++ {
		if r := post(i); r.status != http.StatusOK {
			t.Fatalf("worker %d after the cooldown: status %d: %s", i, r.status, r.body)
		}
	}

	l := e.startLoad(9, workers...)
	defer l.finish()
	start := time.Now()
	eventually(t, "load on every worker", func() bool { return l.count(start) >= 30 })
	for _, r := range l.finish() {
		if r.err != nil || r.status != http.StatusOK || !r.complete {
			t.Errorf("request %s: status %d complete %v err %v", r.id, r.status, r.complete, r.err)
		}
	}

	var limited []string
	for _, a := range e.sim.Attempts() {
		if a.Account == "busy" && a.Outcome == sim.FaultRateLimit {
			limited = append(limited, a.Time.Format(time.RFC3339Nano))
		}
	}
	t.Logf("busy answered %d 429s over %d requests after the fault", len(limited), 3+l.count(start))
	if len(limited) != 1 {
		t.Errorf("busy answered %d 429s (at %s), want the first only", len(limited), strings.Join(limited, ", "))
	}
	if cd := e.account("busy").GetCooldown(); cd == nil {
		t.Error("busy is not cooling")
	}
}
