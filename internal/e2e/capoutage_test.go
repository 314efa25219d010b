package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/weirhq/weir/internal/clock"
	"github.com/weirhq/weir/internal/rpcclient"
)

// TestCapAcrossOutage: an account capped at 2 serves two long streams
// while every control plane, or Postgres, is down for less than the
// lease TTL or for many TTLs. Its leases keep their places
// (controlplane/leaseclock.go): after the outage no request gets a third
// place, the upstream never runs more than two requests on the account,
// the workers renew the streams' leases, and the places come back when
// the streams end.
func TestCapAcrossOutage(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	for _, tc := range []struct {
		name   string
		pg     bool
		outage time.Duration
	}{
		{"control plane shorter than the TTL", false, 2 * time.Second},
		{"control plane 15 TTLs", false, 45 * time.Second},
		{"postgres shorter than the TTL", true, 2 * time.Second},
		{"postgres 15 TTLs", true, 45 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := clock.NewManual(time.Now().Truncate(time.Second))
			opts := options{
				accounts:    []account{{label: "capped", maxConc: 2}},
				leaseTTL:    ttl,
				now:         clk.Now,
				deltaDelay:  time.Hour, // a stream hangs after its first delta
				keyCacheTTL: time.Hour,
			}
			var down, up func()
			if tc.pg {
				dir := t.TempDir()
				cluster := privateCluster(t, dir, 0)
				port := cluster.Port()
				opts.db = migratedPool(t, cluster, 0)
				down = func() {
					if err := cluster.Stop(t.Context()); err != nil {
						t.Fatalf("stop postgres: %v", err)
					}
				}
				up = func() { privateCluster(t, dir, port) }
			}
			e := setup(t, opts)
			if !tc.pg {
				var addr string
				down = func() { addr = e.stopControlPlane() }
				up = func() { e.startControlPlane(addr) }
			}
			streams := []func(){e.openStream(e.client, e.dpSrv.URL), e.openStream(e.client, e.dpSrv.URL)}
			cred := e.creds["capped"]

			down()
			clk.Advance(tc.outage)
			up()

			// Whether it comes before or after the worker's renewals, no
			// request gets a third place: each is refused at the cap (or,
			// while Postgres is not yet reachable again, unavailable).
			refused := 0
			eventually(t, "requests after the outage to be refused at the cap", func() bool {
				r := e.post(false)
				if r.status == http.StatusOK {
					t.Fatalf("a third request was served on the cap-2 account after the outage")
				}
				if r.status == 529 {
					refused++
				}
				return refused >= 3
			})
			e.advanceAlive(clk, 2*ttl) // the worker renews the streams' leases meanwhile
			weirError(t, e.post(false), 529, "overloaded_error")
			if got := e.account("capped").InFlight; got != 2 {
				t.Errorf("in flight = %d after the outage, want 2", got)
			}
			if got := e.upstream.peakConcurrency(cred); got != 2 {
				t.Errorf("the upstream ran %d requests at once on the cap-2 account, want 2", got)
			}

			for _, cancel := range streams {
				cancel()
			}
			e.leasesReleased()
			if r := e.post(false); r.status != http.StatusOK {
				t.Fatalf("after the streams ended: status %d: %s", r.status, r.body)
			}
		})
	}
}

// TestLeaseLostWhenCutOffAlone: a worker cut off alone from the control
// plane (which goes on) loses its lease at its TTL, and the place goes to
// another worker's request. When the first worker can call again, its
// renewal is refused and it ends its stream (dataplane/keeper.go): the
// client gets the surface's error event, the upstream request is closed,
// and the account is back to its cap. The cap was exceeded only while the
// worker was cut off, which no control plane can see.
func TestLeaseLostWhenCutOffAlone(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	clk := clock.NewManual(time.Now().Truncate(time.Second))
	e := setup(t, options{
		accounts:    []account{{label: "solo", maxConc: 1}},
		leaseTTL:    ttl,
		now:         clk.Now,
		deltaDelay:  time.Hour,
		keyCacheTTL: time.Hour,
		noDataplane: true,
	})
	cut := &killable{base: rpcclient.HTTPClient().Transport}
	_, w1 := e.newDataplane(&http.Client{Transport: cut})
	_, w2 := e.newDataplane(nil)

	first := e.startStream(w1.Client(), w1.URL)

	cut.cutOff()
	e.advanceAlive(clk, ttl+time.Second)
	end := e.openStream(w2.Client(), w2.URL) // the lapsed lease's place
	defer end()
	if got := e.upstream.running(); got != 2 {
		t.Fatalf("upstream runs %d requests while worker 1 is cut off, want 2", got)
	}

	cut.heal()
	var rest strings.Builder
	for first.sc.Scan() {
		rest.WriteString(first.sc.Text() + "\n")
	}
	if !strings.Contains(rest.String(), "event: error") {
		t.Errorf("worker 1's stream ended without an error event:\n%s", rest.String())
	}
	eventually(t, "worker 1's upstream request to close", func() bool { return e.upstream.running() == 1 })
	if got := e.account("solo").InFlight; got != 1 {
		t.Errorf("in flight = %d, want 1 (worker 2's stream)", got)
	}
	ev := e.routeEvent(first.res.Header.Get("Weir-Request-Id"))
	if recs := ev.GetAttemptRecords(); len(recs) != 1 || recs[0].GetErrorType() != "lease_lost" {
		t.Errorf("worker 1's route event: %v, want one attempt ended as lease_lost", recs)
	}
}
