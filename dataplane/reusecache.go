package dataplane

import (
	"sync"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// reuseCache holds the leases a worker may reuse without asking. A lease
// the control plane granted with reuse_until serves further requests of
// its class after a success, until that deadline; a session's request
// reuses only a lease on the account the session is bound to. While a
// lease serves a request it is in use; between requests it is idle.
//
// Invalidation is versioned: every drop bumps a generation, and a grant
// is recorded only if nothing it depends on was dropped since the Acquire
// was sent (version, then granted with it), so that an answer overtaken
// by an invalidation is not reused. While the pool's stream is not ready
// nothing is reused. The cache knows nothing of the control plane: what
// it drops it returns, for its owner to release.
type reuseCache struct {
	// now is the control plane's clock (Config.Now), which reuse_until
	// is on; idleness and reuse rates are on the monotonic clock, so that
	// a test's frozen clock does not pin slots.
	now func() time.Time

	mu    sync.Mutex
	ready bool   // the WatchPool stream is up
	gen   uint64 // bumped by every drop
	// accountGen is the gen of each account's last drop; allGen of the
	// last drop of everything.
	accountGen map[string]uint64
	allGen     uint64
	idle       map[leaseClass][]*warmLease
	reusable   map[string]*warmLease // lease id → lease, idle or in use
	sessions   map[string]sessionEntry
	// rates counts each class's reuses per second.
	rates map[leaseClass]reuseRate
	// idled, if set, is told when a lease goes idle: the sweep, which
	// stops while nothing is idle, has work again.
	idled func()
}

// leaseClass is what a reused lease may serve: one key, surface and model,
// and requests with a session (then only those bound to the lease's
// account) or without one. A session-less request never takes a session's
// lease: it is routed least-recently-used, not to the sessions' accounts.
type leaseClass struct {
	keyHash   string
	surface   weirv1.Surface
	model     string
	sessioned bool
}

type warmLease struct {
	lease      *weirv1.Lease
	class      leaseClass
	granted    time.Time // on the control plane's clock (now)
	reuseUntil time.Time // on the control plane's clock (now)
	idleSince  time.Time // on the monotonic clock
	// renewed says a replacement was asked for as the lease aged. Only
	// the request the lease serves writes it, while it is in use.
	renewed bool
}

// sessionEntry is the account a session was bound to when the worker last
// learned it, and the gen then: a drop of the account after that makes it
// unknown again.
type sessionEntry struct {
	account string
	gen     uint64
}

type reuseRate struct {
	since time.Time
	n     int
	last  int // the count of the second before since
}

// maxSessions bounds the session map: past it, it starts over (the next
// request of each session asks the control plane once).
const maxSessions = 100000

// spares is how many idle leases a busy class keeps ready: when it takes
// one and fewer are left, another is asked for. Streams hold their leases
// for seconds, so new ones keep arriving while none has come back; one
// spare is used up by the first of them.
const spares = 2

// spareRate is the reuse rate (per second) from which a class is busy: it
// keeps spares (a burst finds them rather than waiting on an Acquire) and
// holds idle leases busyIdle times longer. Below it a spare would mostly
// sit idle and go back.
const spareRate = 20

// busyIdle is how many times idleFor a busy class (spareRate) keeps its
// idle leases.
const busyIdle = 10

// busyKeep is how many idle leases a busy class keeps while it is busy,
// however long they sat: the one its next take finds and the spares that
// take wants left. Swept after busyIdle×idleFor, a busy class's spares
// went back about once a second, and the next take asked for them again:
// at 200 requests a second on one key, two Acquires and two claims a
// second for nothing. A held request's wait on an account still makes
// the worker give these back (the pool watch names the account).
const busyKeep = spares + 1

// refill is what a take asks its owner to fetch ahead of the class's next
// requests.
type refill int

const (
	refillNone refill = iota
	// refillRenew: the lease is three quarters through its reuse; leases
	// granted together age together, so each gets one replacement.
	refillRenew
	// refillSpare: a busy class is down to fewer than spares idle leases.
	refillSpare
)

func newReuseCache(now func() time.Time) *reuseCache {
	return &reuseCache{now: now, accountGen: map[string]uint64{}, idle: map[leaseClass][]*warmLease{},
		reusable: map[string]*warmLease{}, sessions: map[string]sessionEntry{}, rates: map[leaseClass]reuseRate{}}
}

// version is the generation to pass to granted for an Acquire sent now.
func (c *reuseCache) version() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// isReady says whether leases are reused (the stream is ready).
func (c *reuseCache) isReady() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ready
}

// setReady starts reuse; see stop for the end of it.
func (c *reuseCache) setReady() {
	c.mu.Lock()
	c.ready = true
	c.mu.Unlock()
}

// stop ends reuse until setReady: what changed in between is unknown, so
// nothing held may be trusted. It returns the idle leases it dropped.
func (c *reuseCache) stop() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ready = false
	return c.dropAllLocked()
}

// granted takes note of a fresh lease of cls: the session's account, and
// the lease itself (in use) when it may be reused and nothing about its
// account was dropped since gen.
func (c *reuseCache) granted(cls leaseClass, session string, lease *weirv1.Lease, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.grantedLocked(cls, session, lease, gen)
}

func (c *reuseCache) grantedLocked(cls leaseClass, session string, lease *weirv1.Lease, gen uint64) *warmLease {
	if session != "" {
		if len(c.sessions) >= maxSessions {
			clear(c.sessions)
		}
		c.sessions[session] = sessionEntry{account: lease.AccountId, gen: c.gen}
	}
	if lease.ReuseUntil == nil || !c.ready || c.allGen > gen || c.accountGen[lease.AccountId] > gen {
		return nil
	}
	w := &warmLease{lease: lease, class: cls, granted: c.now(), reuseUntil: lease.ReuseUntil.AsTime()}
	c.reusable[lease.Id] = w
	return w
}

// grantIdle is granted for a lease no request asked for (a prefetch): it
// goes idle at once. False: it may not be reused, and is to be released.
func (c *reuseCache) grantIdle(cls leaseClass, lease *weirv1.Lease, gen uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.grantedLocked(cls, "", lease, gen)
	if w == nil {
		return false
	}
	c.putIdleLocked(w)
	return true
}

// putBack makes a lease whose request succeeded idle again, if it is
// reusable and within its reuse deadline; before, if it is, runs first,
// under the cache's lock (the owner queues the success there, so that it
// is settled before any release of the lease). It reports the lease's
// class and whether it went idle; a lease that did not is forgotten.
func (c *reuseCache) putBack(id string, before func()) (leaseClass, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.reusable[id]
	if w == nil {
		return leaseClass{}, false
	}
	if c.ready && c.now().Before(w.reuseUntil) {
		before()
		c.putIdleLocked(w)
		return w.class, true
	}
	delete(c.reusable, id)
	return leaseClass{}, false
}

func (c *reuseCache) putIdleLocked(w *warmLease) {
	w.idleSince = time.Now()
	c.idle[w.class] = append(c.idle[w.class], w)
	if c.idled != nil {
		c.idled()
	}
}

// take returns an idle lease that may serve cls (and session), most
// recently used first, or nil; and what to fetch ahead for the class.
func (c *reuseCache) take(cls leaseClass, session string) (*warmLease, refill) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, stack := c.findLocked(cls, session, c.now())
	if i < 0 {
		return nil, refillNone
	}
	w := stack[i]
	now := c.now()
	c.idle[cls] = append(stack[:i:i], stack[i+1:]...)
	mono := time.Now()
	c.countReuseLocked(cls, mono)
	busy := c.busyLocked(cls, mono)
	switch {
	case cls.sessioned:
		// A session's lease must be on the session's account, which only
		// its request names: it is not fetched ahead.
	case !w.renewed && now.Sub(w.granted) >= w.reuseUntil.Sub(w.granted)*3/4:
		return w, refillRenew
	case len(c.idle[cls]) < spares && busy:
		return w, refillSpare
	}
	return w, refillNone
}

// has says whether take would find a lease for cls (and session) now.
func (c *reuseCache) has(cls leaseClass, session string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, _ := c.findLocked(cls, session, c.now())
	return i >= 0
}

func (c *reuseCache) findLocked(cls leaseClass, session string, now time.Time) (int, []*warmLease) {
	if !c.ready {
		return -1, nil
	}
	stack := c.idle[cls]
	if len(stack) == 0 {
		return -1, nil
	}
	var account string
	if session != "" {
		e, ok := c.sessions[session]
		if !ok || e.gen < c.allGen || e.gen < c.accountGen[e.account] {
			return -1, nil // unknown here: the control plane binds it
		}
		account = e.account
	}
	for i := len(stack) - 1; i >= 0; i-- {
		w := stack[i]
		if !now.Before(w.reuseUntil) {
			continue // the sweep returns it
		}
		if account != "" && w.lease.AccountId != account {
			continue
		}
		return i, stack
	}
	return -1, nil
}

// countReuseLocked counts a reuse of cls at now (monotonic).
func (c *reuseCache) countReuseLocked(cls leaseClass, now time.Time) {
	r := c.rates[cls]
	if age := now.Sub(r.since); age >= time.Second {
		last := r.n
		if age >= 2*time.Second {
			last = 0 // a quiet second between
		}
		r = reuseRate{since: now, last: last}
	}
	r.n++
	if len(c.rates) > 10000 {
		clear(c.rates) // bounded: one entry per key and model in use
	}
	c.rates[cls] = r
}

// busyLocked says whether cls reused spareRate leases or more in its
// current second or the one before. Both the take's spares and the
// sweep's keeping read it: each second's count starts from zero, and a
// class busy by its last second's alone must still refill its spares in
// the first of the next, or its burst there finds none.
func (c *reuseCache) busyLocked(cls leaseClass, mono time.Time) bool {
	r := c.rates[cls]
	age := mono.Sub(r.since)
	return r.n >= spareRate && age < 2*time.Second || r.last >= spareRate && age < time.Second
}

// dropAccount stops reusing the account's leases (the account may be
// cooling) and returns the idle ones, to release.
func (c *reuseCache) dropAccount(account string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropAccountLocked(account)
}

func (c *reuseCache) dropAccountLocked(account string) []string {
	c.gen++
	c.accountGen[account] = c.gen
	for id, w := range c.reusable {
		if w.lease.AccountId == account {
			delete(c.reusable, id)
		}
	}
	var out []string
	for cls, stack := range c.idle {
		kept := stack[:0]
		for _, w := range stack {
			if w.lease.AccountId == account {
				out = append(out, w.lease.Id)
				continue
			}
			kept = append(kept, w)
		}
		c.setIdleLocked(cls, kept)
	}
	return out
}

// dropAccounts is dropAccount for each of accounts.
func (c *reuseCache) dropAccounts(accounts []string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, a := range accounts {
		out = append(out, c.dropAccountLocked(a)...)
	}
	return out
}

// dropAll stops reusing every lease and returns the idle ones, to
// release.
func (c *reuseCache) dropAll() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropAllLocked()
}

func (c *reuseCache) dropAllLocked() []string {
	c.gen++
	c.allGen = c.gen
	clear(c.reusable)
	var out []string
	for cls, stack := range c.idle {
		for _, w := range stack {
			out = append(out, w.lease.Id)
		}
		delete(c.idle, cls)
	}
	if len(c.accountGen) > 10000 {
		// allGen covers every entry now.
		clear(c.accountGen)
	}
	return out
}

// forget stops reusing a lease the control plane may no longer hold.
func (c *reuseCache) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.reusable[id]
	if w == nil {
		return
	}
	delete(c.reusable, id)
	stack := c.idle[w.class]
	for i, x := range stack {
		if x == w {
			c.setIdleLocked(w.class, append(stack[:i:i], stack[i+1:]...))
			break
		}
	}
}

func (c *reuseCache) setIdleLocked(cls leaseClass, stack []*warmLease) {
	if len(stack) == 0 {
		delete(c.idle, cls)
		return
	}
	c.idle[cls] = stack
}

// sweep returns the leases idle for idleFor (on the monotonic clock; a
// busy class's for busyIdle times that) or past their reuse deadline. A
// busy class keeps its busyKeep most recently used idle leases however
// long they sat, until the deadline.
func (c *reuseCache) sweep(idleFor time.Duration) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	now, mono := c.now(), time.Now()
	var out []string
	for cls, stack := range c.idle {
		limit, keep := idleFor, 0
		if c.busyLocked(cls, mono) {
			// A busy class's hiccup (a GC, a slow client) needs more leases
			// at once than its average: kept a while, they absorb it instead
			// of a burst of Acquires at the slowest moment.
			limit, keep = limit*busyIdle, busyKeep
		}
		// The stack is oldest first, its top what a take finds: from
		// keepFrom on are the ones kept however long they sat.
		keepFrom := len(stack)
		for keep > 0 && keepFrom > 0 {
			keepFrom--
			if now.Before(stack[keepFrom].reuseUntil) {
				keep--
			}
		}
		kept := stack[:0]
		for i, w := range stack {
			if !now.Before(w.reuseUntil) || i < keepFrom && mono.Sub(w.idleSince) >= limit {
				delete(c.reusable, w.lease.Id)
				out = append(out, w.lease.Id)
				continue
			}
			kept = append(kept, w)
		}
		c.setIdleLocked(cls, kept)
	}
	return out
}

// empty says whether no lease is idle: the sweep has nothing to do.
func (c *reuseCache) empty() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.idle) == 0
}
