package e2e

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weirhq/weir/internal/clock"
	"github.com/weirhq/weir/internal/sim"
)

// A hold's latency is part of its correctness: a turn that survives but
// waits long after something could serve it is a defect. These tests time
// turns on the shared virtual clock from "something can serve" to
// "served".

// TestHoldOneAccountOverloadedFailsOver: one account of three answers 529
// five times. Its request retries it once, then another account serves,
// within 2 s of the first 529; nothing is gated for the other requests.
func TestHoldOneAccountOverloadedFailsOver(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "first", priority: 1, faults: []sim.Fault{{Kind: sim.FaultOverloaded, Times: 5}}},
		{label: "second"}, {label: "third"},
	}})
	for i := range 3 {
		r := e.post(true)
		if r.status != http.StatusOK || !strings.Contains(string(r.body), "message_stop") {
			t.Fatalf("request %d: status %d, want a whole stream: %s", i+1, r.status, r.body)
		}
	}
	atts := e.sim.Attempts()
	first := slices.IndexFunc(atts, func(a sim.Attempt) bool { return a.Status == 529 })
	if first < 0 {
		t.Fatalf("no 529 in %v", e.attempts())
	}
	served := slices.IndexFunc(atts[first:], func(a sim.Attempt) bool { return a.Status == http.StatusOK })
	if served < 0 {
		t.Fatalf("nothing served after the 529: %v", e.attempts())
	}
	ok := atts[first+served]
	if ok.Account == "first" {
		t.Errorf("served by the overloaded account after %v, want another account", e.attempts())
	}
	if d := ok.Time.Sub(atts[first].Time); d > 2*time.Second {
		t.Errorf("served %v after the first 529, want within 2s (attempts %v)", d, e.attempts())
	}
	// One account's overloads open no breaker: the next requests are
	// served at once, by a healthy account or the retried one.
	start := v.Now()
	if r := e.post(true); r.status != http.StatusOK {
		t.Fatalf("a later request: %d %s", r.status, r.body)
	}
	if d := v.Now().Sub(start); d > 2*time.Second {
		t.Errorf("a later request took %v, want at most one same-account retry (1s)", d)
	}
}

// turns runs agents that never retry, each sending n streaming turns one
// after another, all agents at once on the scheduler's virtual time, and
// returns every turn's duration.
func turns(t *testing.T, e *env, v *clock.Manual, sched *scheduler, agents, n int) []time.Duration {
	t.Helper()
	var (
		mu   sync.Mutex
		took []time.Duration
		wg   sync.WaitGroup
	)
	for a := range agents {
		wg.Go(func() {
			session := fmt.Sprintf("agent-%d", a)
			for i := range n {
				sched.begin()
				start := v.Now()
				r := e.doWith(http.DefaultClient, e.dpSrv.URL, http.MethodPost, "/v1/messages", messagesBody(true), func(req *http.Request) {
					req.Header.Set("X-Claude-Code-Session-Id", session)
				})
				d := v.Now().Sub(start)
				sched.end()
				if r.status != http.StatusOK || !strings.Contains(string(r.body), "message_stop") {
					t.Errorf("agent %d turn %d: status %d after %v: %s", a, i+1, r.status, d, r.body)
				}
				mu.Lock()
				took = append(took, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(took)
	return took
}

// TestHoldBlipOnEveryAccount: every account of three answers 529 three
// times; 4 agents that never retry run 5 streaming turns each. All 20
// turns succeed, the slowest within 10 s and the median within 3 s: the
// breaker opens on evidence from several accounts, probes every 2 s round
// them, and closes at the first answer.
func TestHoldBlipOnEveryAccount(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	sched := &scheduler{clock: v}
	blip := []sim.Fault{{Kind: sim.FaultOverloaded, Times: 3}}
	e := setup(t, options{virtual: v, sleep: sched.Sleep, hold: 20 * time.Minute, accounts: []account{
		{label: "a", faults: blip}, {label: "b", faults: blip}, {label: "c", faults: blip},
	}})
	took := turns(t, e, v, sched, 4, 5)
	if len(took) != 20 {
		t.Fatalf("%d turns", len(took))
	}
	failed := 0
	for _, a := range e.sim.Attempts() {
		if a.Status == 529 {
			failed++
		}
	}
	t.Logf("turns %v; %d upstream 529s", took, failed)
	if slowest, median := took[len(took)-1], took[len(took)/2]; slowest > 10*time.Second || median > 3*time.Second {
		t.Errorf("slowest turn %v, median %v; want at most 10s and 3s", slowest, median)
	}
}
