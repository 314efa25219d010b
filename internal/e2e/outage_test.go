package e2e

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weirhq/weir/controlplane"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/clock"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/rpcclient"
)

// TestControlPlaneDown: with the control plane gone, a worker answers a
// retryable 503 in the Anthropic shape, both for a key it still trusts from
// its cache (Acquire fails) and for one it must verify (VerifyKey fails).
func TestControlPlaneDown(t *testing.T) {
	t.Parallel()
	dpReg := prometheus.NewRegistry()
	e := setup(t, options{accounts: []account{{label: "api-1"}}, keyCacheTTL: time.Hour, dpRegistry: dpReg})
	poolReady(t, dpReg)
	if r := e.post(false); r.status != http.StatusOK {
		t.Fatalf("before the outage: status %d", r.status)
	}
	closeServer(e.cpSrv)
	// The worker's pool watch ends with the control plane: the lease it
	// kept is not reused without the invalidations that stream carried.
	eventually(t, "the worker to see its pool watch end", func() bool {
		return metricValue(t, dpReg, "weir_dataplane_lease_pool_ready", nil) == 0
	})

	for name, edit := range map[string]func(*http.Request){
		"cached key":   nil,
		"uncached key": func(r *http.Request) { r.Header.Set("X-Api-Key", "weir_sk_"+randid.Hex(32)) },
	} {
		for _, stream := range []bool{false, true} {
			r := e.do(http.MethodPost, "/v1/messages", messagesBody(stream), edit)
			weirError(t, r, http.StatusServiceUnavailable, "api_error")
			if got := r.header.Get("Retry-After"); got != "2" {
				t.Errorf("%s: Retry-After = %q, want 2", name, got)
			}
			if got := r.header.Get("X-Should-Retry"); got != "true" {
				t.Errorf("%s: X-Should-Retry = %q, want true", name, got)
			}
		}
	}
	if n := len(e.sim.Attempts()); n != 1 {
		t.Errorf("simulator saw %d attempts, want 1", n)
	}
	// The worker is still serving.
	if r := e.do(http.MethodGet, "/healthz", "", nil); r.status != http.StatusOK {
		t.Errorf("healthz = %d after the outage", r.status)
	}
}

// TestDeadWorkerLeaseExpires: a worker that dies mid-stream never releases
// its lease; the lease still counts against the account's cap until its TTL
// passes, and then the account serves again.
func TestDeadWorkerLeaseExpires(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(time.Now().Truncate(time.Second))
	e := setup(t, options{
		accounts:    []account{{label: "solo", maxConc: 1}},
		leaseTTL:    2 * time.Second,
		now:         clk.Now,
		deltaDelay:  time.Hour, // the stream hangs after its first delta
		noDataplane: true,
	})
	cut := &killable{base: rpcclient.HTTPClient().Transport}
	_, dp1 := e.newDataplane(&http.Client{Transport: cut})
	_, dp2 := e.newDataplane(nil)

	// Worker 1 streams until the first delta is out.
	stream := e.startStream(dp1.Client(), dp1.URL)
	if got := e.account("solo").InFlight; got != 1 {
		t.Fatalf("in flight = %d during the stream, want 1", got)
	}

	// Kill worker 1: its calls to the control plane stop for good (no
	// renewal, no Release), and its client goes away.
	cut.kill()
	stream.end()
	dp1.CloseClientConnections()

	// The dead worker's lease still holds the only slot.
	r := e.doWith(dp2.Client(), dp2.URL, http.MethodPost, "/v1/messages", messagesBody(false), nil)
	weirError(t, r, 529, "overloaded_error")
	if r.header.Get("Retry-After") == "" || r.header.Get("X-Should-Retry") != "true" {
		t.Errorf("Retry-After %q X-Should-Retry %q", r.header.Get("Retry-After"), r.header.Get("X-Should-Retry"))
	}
	acq, err := e.leases.Acquire(t.Context(), connect.NewRequest(&weirv1.AcquireRequest{KeyHash: controlplane.HashKey(e.key), Model: model, RequestId: "probe"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := acq.Msg.GetNoAccount().GetReason(); got != weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY {
		t.Fatalf("Acquire = %v, want AT_CAPACITY", acq.Msg)
	}
	if got := e.account("solo").InFlight; got != 1 {
		t.Errorf("in flight = %d after the worker died, want 1 (the dead lease)", got)
	}

	// Past the TTL the lease no longer counts.
	e.advanceAlive(clk, 2*time.Second+time.Millisecond)
	if got := e.account("solo").InFlight; got != 0 {
		t.Errorf("in flight = %d after the TTL, want 0", got)
	}
	r = e.doWith(dp2.Client(), dp2.URL, http.MethodPost, "/v1/messages", messagesBody(false), nil)
	if r.status != http.StatusOK {
		t.Fatalf("after the TTL: status %d: %s", r.status, r.body)
	}
	if got := e.attempts(); len(got) != 2 || got[1] != "solo:ok:200" {
		t.Errorf("simulator attempts = %v", got)
	}
	eventually(t, "worker 2's lease to be released", func() bool { return e.account("solo").InFlight == 0 })
}

// TestClientCancelReleasesLease: an agent that hangs up mid-stream frees
// its account at once, not after the lease's TTL.
func TestClientCancelReleasesLease(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "solo", maxConc: 1}}, deltaDelay: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.dpSrv.URL+"/v1/messages", strings.NewReader(messagesBody(true)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.key)
	res, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() && sc.Text() != "event: content_block_delta" {
	}
	if sc.Text() != "event: content_block_delta" {
		t.Fatalf("no delta before the stream hung: %v", sc.Err())
	}
	cancel()

	// The default lease TTL is 30s: only a Release frees the slot this soon.
	e.leasesReleased()
	if r := e.post(false); r.status != http.StatusOK {
		t.Fatalf("after the cancel: status %d: %s", r.status, r.body)
	}
	if cd := e.account("solo").GetCooldown(); cd != nil {
		t.Errorf("a client hanging up cooled the account: %v", cd)
	}
	e.leasesReleased()
}

// TestUnverifiedRefusalRecorded: a request whose key the worker cannot
// check (the control plane is down and the key not in its cache) gets a
// retryable 503, and is counted all the same, without a key, once the
// control plane is back: an outage's refusals are not missing.
func TestUnverifiedRefusalRecorded(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "api-1"}}})
	addr := e.stopControlPlane()
	r := e.do(http.MethodPost, "/v1/messages", messagesBody(false), func(r *http.Request) { r.Header.Set("X-Api-Key", "weir_sk_"+randid.Hex(32)) })
	weirError(t, r, http.StatusServiceUnavailable, "api_error")
	e.startControlPlane(addr)
	// Refused before routing, but not for anything the client did: the
	// key may well be valid. Unlike a refusal of the client's own doing,
	// it is recorded one by one (with no key), once the control plane is
	// back: an outage's refusals must not go missing.
	ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
	if ev.Status != http.StatusServiceUnavailable || ev.KeyId != "" || ev.ErrorType != "api_error" ||
		ev.FailureStage != weirv1.FailureStage_FAILURE_STAGE_BEFORE_OUTPUT || ev.Attempts != 0 {
		t.Errorf("recorded as %v, want a 503 before output, no key, no attempt", ev)
	}
}
