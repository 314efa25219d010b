package dataplane

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

var testClass = leaseClass{keyHash: "k", surface: weirv1.Surface_SURFACE_MESSAGES, model: "m"}

// reusableLease is a lease granted with reuse for d from now.
func reusableLease(id, account string, d time.Duration) *weirv1.Lease {
	return &weirv1.Lease{Id: id, AccountId: account, ReuseUntil: timestamppb.New(time.Now().Add(d))}
}

// readyCache is a cache whose stream is ready, on the bubble's clock.
func readyCache() *reuseCache {
	c := newReuseCache(time.Now)
	c.setReady()
	return c
}

// warm grants lease to cls and puts it back idle, as a success would.
func warm(t *testing.T, c *reuseCache, cls leaseClass, session string, lease *weirv1.Lease) {
	t.Helper()
	c.granted(cls, session, lease, c.version())
	settled := false
	if _, ok := c.putBack(lease.Id, func() { settled = true }); !ok || !settled {
		t.Fatalf("lease %s not kept idle (kept %v, settled %v)", lease.Id, ok, settled)
	}
}

// TestReuseCacheTakesWhatWentIdle: a lease back from a success serves the
// class's next request, once, most recently used first; another class and
// a cache whose stream is not ready find nothing.
func TestReuseCacheTakesWhatWentIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := readyCache()
		warm(t, c, testClass, "", reusableLease("l1", "a", 2*time.Second))
		warm(t, c, testClass, "", reusableLease("l2", "b", 2*time.Second))
		other := testClass
		other.model = "other"
		if w, _ := c.take(other, ""); w != nil {
			t.Errorf("another model took %s", w.lease.Id)
		}
		var got []string
		for range 3 {
			if w, _ := c.take(testClass, ""); w != nil {
				got = append(got, w.lease.Id)
			}
		}
		if !slices.Equal(got, []string{"l2", "l1"}) {
			t.Errorf("took %v, want [l2 l1] (most recent first, each once)", got)
		}

		warm(t, c, testClass, "", reusableLease("l3", "a", 2*time.Second))
		if dropped := c.stop(); !slices.Equal(dropped, []string{"l3"}) {
			t.Errorf("stop dropped %v, want [l3]", dropped)
		}
		lease := reusableLease("l4", "a", 2*time.Second)
		c.granted(testClass, "", lease, c.version())
		if _, ok := c.putBack("l4", func() {}); ok || c.has(testClass, "") {
			t.Error("a cache whose stream is not ready kept a lease")
		}
	})
}

// TestReuseCacheVersionedInvalidation: a grant answered after its account
// (or everything) was dropped is not reused, and a drop returns the
// account's idle leases and only those.
func TestReuseCacheVersionedInvalidation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := readyCache()
		gen := c.version()
		if dropped := c.dropAccount("a"); len(dropped) != 0 {
			t.Errorf("dropped %v from an empty cache", dropped)
		}
		c.granted(testClass, "", reusableLease("stale", "a", 2*time.Second), gen)
		if _, ok := c.putBack("stale", func() {}); ok {
			t.Error("a lease asked for before its account's invalidation was kept")
		}
		c.granted(testClass, "", reusableLease("fine", "b", 2*time.Second), gen)
		if _, ok := c.putBack("fine", func() {}); !ok {
			t.Error("a lease of another account was not kept")
		}

		warm(t, c, testClass, "", reusableLease("a1", "a", 2*time.Second))
		if dropped := c.dropAccounts([]string{"a"}); !slices.Equal(dropped, []string{"a1"}) {
			t.Errorf("dropAccounts(a) = %v, want [a1]", dropped)
		}
		gen = c.version()
		if dropped := c.dropAll(); !slices.Equal(dropped, []string{"fine"}) {
			t.Errorf("dropAll = %v, want [fine]", dropped)
		}
		c.granted(testClass, "", reusableLease("late", "c", 2*time.Second), gen)
		if _, ok := c.putBack("late", func() {}); ok {
			t.Error("a lease asked for before a drop of everything was kept")
		}
	})
}

// TestReuseCacheSessions: a session's request takes only a lease on the
// account its session was bound to, and none once that account was
// dropped since; a session-less request never takes a session's lease.
func TestReuseCacheSessions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := readyCache()
		cls := testClass
		cls.sessioned = true
		warm(t, c, cls, "s1", reusableLease("on-a", "a", 2*time.Second))
		warm(t, c, cls, "s2", reusableLease("on-b", "b", 2*time.Second))
		if w, _ := c.take(testClass, ""); w != nil {
			t.Errorf("a session-less request took the session's lease %s", w.lease.Id)
		}
		if w, _ := c.take(cls, "unknown"); w != nil {
			t.Errorf("an unknown session took %s", w.lease.Id)
		}
		if w, _ := c.take(cls, "s1"); w == nil || w.lease.Id != "on-a" {
			t.Errorf("session s1 took %v, want on-a", w)
		}
		c.dropAccount("c") // another account: s2 stays known
		if !c.has(cls, "s2") {
			t.Error("a drop of another account made session s2 unknown")
		}
		c.dropAccount("b")
		if c.has(cls, "s2") {
			t.Error("session s2 still reuses after its account was dropped")
		}
	})
}

// TestReuseCacheSweep: an idle lease goes back after idleFor, a busy
// class's after busyIdle times that, and any at its reuse deadline.
func TestReuseCacheSweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const idleFor = 100 * time.Millisecond
		c := readyCache()
		warm(t, c, testClass, "", reusableLease("short", "a", 150*time.Millisecond))
		warm(t, c, testClass, "", reusableLease("long", "a", time.Minute))
		if got := c.sweep(idleFor); len(got) != 0 {
			t.Errorf("swept %v at once", got)
		}
		time.Sleep(idleFor)
		if got := c.sweep(idleFor); !slices.Equal(got, []string{"short", "long"}) {
			t.Errorf("swept %v after idleFor, want [short long]", got)
		}

		// A busy class: five idle leases, b5 used spareRate times in a
		// second, b4's reuse over in a second.
		busy := testClass
		busy.model = "busy"
		for _, id := range []string{"b1", "b2", "b3", "b4", "b5"} {
			d := time.Minute
			if id == "b4" {
				d = time.Second
			}
			warm(t, c, busy, "", reusableLease(id, "a", d))
		}
		for range spareRate {
			w, _ := c.take(busy, "")
			if w.lease.Id != "b5" {
				t.Fatalf("took %s, want the most recently used, b5", w.lease.Id)
			}
			if _, ok := c.putBack(w.lease.Id, func() {}); !ok {
				t.Fatal("the busy class's lease was not kept")
			}
		}
		time.Sleep(idleFor)
		if got := c.sweep(idleFor); len(got) != 0 {
			t.Errorf("swept %v of a busy class after idleFor", got)
		}
		// Still busy: past busyIdle×idleFor the leases beyond its busyKeep
		// most recently used go, and a kept one at its reuse deadline.
		time.Sleep(busyIdle * idleFor)
		if got := c.sweep(idleFor); !slices.Equal(got, []string{"b1", "b4"}) {
			t.Errorf("swept %v of a busy class after busyIdle×idleFor, want [b1 b4] (busyKeep %d kept)", got, busyKeep)
		}
		for _, id := range []string{"b1", "b4"} {
			if c.reusable[id] != nil {
				t.Errorf("swept lease %s is still reusable", id)
			}
		}
		// No longer busy (no reuse for two seconds): idleFor again.
		time.Sleep(time.Second)
		if got := c.sweep(idleFor); !slices.Equal(got, []string{"b2", "b3", "b5"}) {
			t.Errorf("swept %v once the class was quiet, want [b2 b3 b5]", got)
		}
		if c.has(busy, "") {
			t.Error("a swept lease is still reusable")
		}
	})
}

// TestReuseCacheRefill: a take asks for one replacement of a lease three
// quarters through its reuse, and a busy class for spares; never for a
// session's class.
func TestReuseCacheRefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := readyCache()
		warm(t, c, testClass, "", reusableLease("l", "a", 4*time.Second))
		w, want := c.take(testClass, "")
		if want != refillNone {
			t.Errorf("a fresh lease asked for %v", want)
		}
		c.putBack(w.lease.Id, func() {})
		time.Sleep(3 * time.Second)
		w, want = c.take(testClass, "")
		if want != refillRenew {
			t.Errorf("a lease 3/4 through its reuse asked for %v, want a renewal", want)
		}
		w.renewed = true
		c.putBack(w.lease.Id, func() {})
		if _, want = c.take(testClass, ""); want != refillNone {
			t.Errorf("a renewed lease asked for %v again", want)
		}

		sess := testClass
		sess.sessioned = true
		warm(t, c, sess, "s", reusableLease("s", "a", 4*time.Second))
		time.Sleep(3 * time.Second)
		if _, want = c.take(sess, "s"); want != refillNone {
			t.Errorf("a session's class asked for %v", want)
		}

		busy := testClass
		busy.model = "busy"
		warm(t, c, busy, "", reusableLease("b", "a", time.Minute))
		for i := range spareRate {
			w, want := c.take(busy, "")
			if i == spareRate-1 && want != refillSpare {
				t.Errorf("the %dth reuse in a second asked for %v, want a spare", spareRate, want)
			}
			c.putBack(w.lease.Id, func() {})
		}
		// Busy by its last second: the first reuse of the next still asks.
		time.Sleep(time.Second)
		w, want = c.take(busy, "")
		if want != refillSpare {
			t.Errorf("the first reuse of the second after a busy one asked for %v, want a spare", want)
		}
		c.putBack(w.lease.Id, func() {})
		// After a quiet second it is not busy.
		time.Sleep(2 * time.Second)
		if _, want = c.take(busy, ""); want != refillNone {
			t.Errorf("the first reuse after a quiet second asked for %v, want none", want)
		}
	})
}

// TestReuseCacheForget: a lease the control plane may no longer hold is
// not reused, idle or in use.
func TestReuseCacheForget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := readyCache()
		warm(t, c, testClass, "", reusableLease("idle", "a", time.Minute))
		c.granted(testClass, "", reusableLease("busy", "a", time.Minute), c.version())
		c.forget("idle")
		c.forget("busy")
		if c.has(testClass, "") {
			t.Error("a forgotten idle lease is still reusable")
		}
		if _, ok := c.putBack("busy", func() {}); ok {
			t.Error("a forgotten lease in use went idle")
		}
	})
}
