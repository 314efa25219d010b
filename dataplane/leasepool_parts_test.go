package dataplane

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// The lease pool against the scripted control plane, in virtual time.

// reuseRig is a rig whose control plane offers leases for reuse.
func reuseRig(t *testing.T, accounts ...*fakeAccount) *rig {
	cp := newFakeCP(accounts...)
	cp.reuse = 10 * time.Second
	r := newRig(t, cp, func(c *Config) { c.LeaseIdle = 5 * time.Second })
	synctest.Wait() // the WatchPool stream ready: reuse on
	return r
}

func (r *rig) counts() (acquires, releases int, batched []*weirv1.ReleaseItem) {
	r.cp.mu.Lock()
	defer r.cp.mu.Unlock()
	for _, b := range r.cp.batches {
		batched = append(batched, b...)
	}
	return len(r.cp.acquires), len(r.cp.releases), batched
}

func TestPartsLeasePoolReusesAfterSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := reuseRig(t, &fakeAccount{id: "a"})
		for i := range 3 {
			if got := r.send(t.Context(), false); got.status != 200 {
				t.Fatalf("request %d: %d %s", i, got.status, got.body)
			}
		}
		time.Sleep(time.Second) // the settlements' batch
		acquires, releases, batched := r.counts()
		if acquires != 1 || releases != 0 {
			t.Errorf("%d Acquires and %d Releases for 3 sequential successes, want 1 and 0: the lease is reused", acquires, releases)
		}
		if len(batched) != 3 {
			t.Fatalf("ReleaseBatch items %v, want the 3 successes", batched)
		}
		for _, it := range batched {
			if !it.Keep || it.Outcome.GetClass() != weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS || it.LeaseId != batched[0].LeaseId {
				t.Errorf("item %v: want a kept success of the one lease", it)
			}
		}
	})
}

func TestPartsLeasePoolInvalidationDropsTheReusedLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := reuseRig(t, &fakeAccount{id: "a"}, &fakeAccount{id: "b"})
		if got := r.send(t.Context(), false); got.status != 200 {
			t.Fatalf("%d %s", got.status, got.body)
		}
		first := r.cp.leaseIDs()
		// An operator pauses a: the control plane announces it.
		r.cp.set(func(f *fakeCP) { f.accounts[0].disabled = true })
		r.cp.announce(&weirv1.WatchPoolResponse{AccountIds: []string{"a"}})
		synctest.Wait()
		if got := r.send(t.Context(), false); got.status != 200 {
			t.Fatalf("%d %s", got.status, got.body)
		}
		time.Sleep(time.Second)
		acquires, _, batched := r.counts()
		if acquires != 2 {
			t.Errorf("%d Acquires, want 2: the invalidated lease must not serve", acquires)
		}
		if atts := r.sim.Attempts(); len(atts) != 2 || atts[1].Account != "b" {
			t.Errorf("upstream attempts %v, want the second on b", atts)
		}
		returned := false
		for _, it := range batched {
			returned = returned || (it.LeaseId == first[0] && !it.Keep && it.Outcome == nil)
		}
		if !returned {
			t.Errorf("the dropped lease %s was not given back: %v", first[0], batched)
		}
	})
}

func TestPartsLeasePoolPrefetchBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := reuseRig(t, &fakeAccount{id: "a"})
		hold := make(chan struct{})
		r.cp.set(func(f *fakeCP) { f.hold = hold })
		cls := leaseClass{keyHash: hashKey(testClientKey), surface: weirv1.Surface_SURFACE_MESSAGES, model: partsModel}
		started := 0
		for range 5 {
			if r.s.pool.prefetch(cls, spares) {
				started++
			}
		}
		synctest.Wait()
		r.cp.mu.Lock()
		inFlight := len(r.cp.acquiredAt)
		r.cp.mu.Unlock()
		if started != spares || inFlight != spares {
			t.Errorf("%d prefetches started, %d Acquires in flight; want %d each", started, inFlight, spares)
		}
		close(hold)
		r.cp.set(func(f *fakeCP) { f.hold = nil })
		synctest.Wait()
		// The prefetched leases wait idle; requests take them without asking.
		for range spares {
			if got := r.send(t.Context(), false); got.status != 200 {
				t.Fatalf("%d %s", got.status, got.body)
			}
		}
		if acquires, _, _ := r.counts(); acquires != spares {
			t.Errorf("%d Acquires, want only the %d prefetches", acquires, spares)
		}
	})
}

func TestPartsLeasePoolSettlesInBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := reuseRig(t, &fakeAccount{id: "a"})
		const n = 20
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				if got := r.send(t.Context(), false); got.status != 200 {
					t.Errorf("%d %s", got.status, got.body)
				}
			})
		}
		wg.Wait()
		time.Sleep(time.Second)
		r.cp.mu.Lock()
		calls := len(r.cp.batches)
		r.cp.mu.Unlock()
		_, releases, batched := r.counts()
		if len(batched)+releases != n {
			t.Errorf("%d successes settled (%d batched, %d released), want %d", len(batched)+releases, len(batched), releases, n)
		}
		if calls >= len(batched) || calls > 3 {
			t.Errorf("%d ReleaseBatch calls for %d items: not batched", calls, len(batched))
		}
	})
}

func TestPartsLeasePoolRedeliversAfterOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := reuseRig(t, &fakeAccount{id: "a"})
		r.verifyKey()
		// The control plane goes away once the lease is granted: the
		// success's settlement finds it gone.
		r.cp.set(func(f *fakeCP) {
			f.afterLease = func(f *fakeCP, _ *weirv1.Lease) { f.down, f.afterLease = true, nil }
		})
		r.at(20*time.Second, func() { r.cp.setDown(false) })
		if got := r.send(t.Context(), false); got.status != 200 {
			t.Fatalf("%d %s", got.status, got.body)
		}
		first := r.cp.leaseIDs()[0]
		time.Sleep(5 * time.Second)
		// The unsettled lease is not reused: the request waits for the
		// control plane, and is served within the bound of its return.
		got := r.send(t.Context(), false)
		if got.status != 200 || got.at < 20*time.Second || got.at > 20*time.Second+wakeBound {
			t.Errorf("got %d at %v, want 200 within %v of 20s", got.status, got.at, wakeBound)
		}
		time.Sleep(5 * time.Second)
		acquires, _, batched := r.counts()
		if acquires != 2 {
			t.Errorf("%d Acquires, want 2: a lease whose settlement failed is not reused", acquires)
		}
		settled := false
		for _, it := range batched {
			settled = settled || (it.LeaseId == first && it.Outcome.GetClass() == weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS)
		}
		if !settled {
			t.Errorf("the success on %s never reached the control plane: %v", first, batched)
		}
	})
}

// TestPartsLeasePoolSweepsAfterQuiet: the sweep stops ticking while
// nothing is idle, and a lease that goes idle later still goes back
// after LeaseIdle.
func TestPartsLeasePoolSweepsAfterQuiet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := reuseRig(t, &fakeAccount{id: "a"})
		time.Sleep(time.Minute) // quiet: nothing cached, nothing at the gate
		synctest.Wait()
		if !r.s.pool.cache.empty() || !r.s.pool.gate.empty() {
			t.Fatal("an idle worker's pool holds something to sweep")
		}
		if got := r.send(t.Context(), false); got.status != 200 {
			t.Fatalf("%d %s", got.status, got.body)
		}
		time.Sleep(7 * time.Second) // LeaseIdle and a tick
		synctest.Wait()
		_, _, batched := r.counts()
		var given bool
		for _, it := range batched {
			given = given || !it.Keep && it.Outcome == nil
		}
		if !given || !r.s.pool.cache.empty() {
			t.Errorf("ReleaseBatch items %v: the idle lease was not given back after LeaseIdle", batched)
		}
	})
}
