package dataplane

import (
	"context"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// classGate is how a class's requests get to the control plane's Acquire
// when they cannot reuse a lease. Held requests share their waits: a
// capacity storm of thousands of held requests costs one Acquire per
// class per probe, not one per request.
//
//   - The limit. A class that reuses leases has at most maxAsking
//     Acquires in flight; its next request waits for whichever comes
//     first, a lease of its class going idle (a request served in a
//     millisecond frees it long before an Acquire would answer) or an
//     Acquire ending, which frees a slot. A cold start, or an
//     invalidation that dropped the class's leases, would otherwise send
//     every request at once; under load the Acquires slow down, requests
//     pile up and each asks in turn. The wait is FIFO, one waiter woken
//     per event.
//   - Shared refusals. A "no account" answer is shared with the class's
//     held requests until its retry time (see share) or the next
//     invalidation; while it stands one request asks for all, and the
//     requests that waited for its answer get it too.
//   - Parking. Each held request asking, or even leaving its hold to read
//     the shared answer, costs an RPC or a hold record and allocations
//     per request per interval: with 2,000 held requests, most of a core.
//     Instead the held requests of a refused class park on it. One of
//     them, the leader, waits for the shared answer to run out (or an
//     invalidation to poke it) and asks the control plane for everyone;
//     the others only look again when the answer runs out. They leave
//     when the class is served again, when the leader leaves (one of them
//     leads next), or at their deadline. A lease the leader gets is its
//     own; a breaker's probe goes to it alone and the rest keep waiting
//     for the probe's report.
//
// The gate calls the control plane only through the func it is given,
// never with its lock held. Its methods named ...Locked are called with
// g.mu held and return with it held, whatever they return; they release
// it only while they wait or call.
type classGate struct {
	now func() time.Time
	// sleep waits d or until ctx ends (Config.Sleep, so that a test's
	// virtual clock sees a parked request waiting).
	sleep func(ctx context.Context, d time.Duration) bool
	// count counts what happened to a request (the lease pool metric's
	// label: "shared_none", "queued").
	count func(what string)
	// made, if set, is told when a class's state is made: the sweep,
	// which stops while the gate is empty, has work again.
	made func()

	mu sync.Mutex
	// gen is bumped by what may make a refused class servable: the
	// control plane's events, not this worker's own failures (they only
	// make things worse). A refusal shared before the latest is stale.
	gen     uint64
	closed  bool
	classes map[leaseClass]*gateClass
}

// askFunc makes one Acquire for the request; why is the lease pool
// metric's label for it (askFirst, askForAll, askRetry). since, when set,
// is when the class's longest-parked request began to wait: a parked
// class's leader asks in that request's turn.
type askFunc func(ctx context.Context, why string, since time.Time) (*weirv1.AcquireResponse, error)

const (
	askFirst  = "acquired"    // a request's own Acquire
	askForAll = "class_probe" // a parked class's leader's, for all
	askRetry  = "retry"       // a retry's, with the accounts tried
)

// gateClass is one class's state at the gate; it is dropped when empty.
type gateClass struct {
	// asking counts the class's Acquires in flight (not the leader's);
	// queued are the requests waiting for a slot or a lease to come back.
	asking int
	queued []chan struct{}
	// flight is the one Acquire of a refused class that its requests not
	// parked wait for.
	flight *flight
	// none is the class's shared refusal; nil: not refused.
	none *sharedNone
	// waiters are the parked requests; leader asks for them, and poke
	// ends its wait (an invalidation arrived: ask now).
	waiters map[*waiter]struct{}
	leader  *waiter
	poke    context.CancelFunc
}

// flight is one Acquire in progress for a refused class; its refusal is
// shared with the class's requests that waited for it.
type flight struct {
	done chan struct{}
	none *weirv1.NoAccount
}

type sharedNone struct {
	none  *weirv1.NoAccount
	until time.Time
	gen   uint64
}

// waiter is one parked request.
type waiter struct {
	// since is when the request began to wait (gateRequest.since).
	since time.Time
	wake  chan waitResult // buffered 1; written once per wait
	// stop ends the request's current sleep.
	stop context.CancelFunc
}

// waitResult ends a wait: the class may be served (again: ask as usual),
// or the waiter now leads.
type waitResult struct {
	again, lead bool
}

// send wakes w with r.
func (w *waiter) send(r waitResult) {
	select {
	case w.wake <- r:
	default: // already woken; the first reason stands
	}
	w.stop()
}

// maxAsking is how many Acquires one class may have in flight before its
// next request waits for a lease to come back instead.
const maxAsking = 4

// Bounds of how long a shared "no account" answer stands before one held
// request asks again: at least noneMin (a retry time already passed would
// have every held request ask at once), at most noneMax.
const (
	noneMin = 250 * time.Millisecond
	noneMax = 5 * time.Second
)

func newClassGate(now func() time.Time, sleep func(context.Context, time.Duration) bool, count func(string)) *classGate {
	return &classGate{now: now, sleep: sleep, count: count, classes: map[leaseClass]*gateClass{}}
}

// gateRequest is one request at the gate.
type gateRequest struct {
	class leaseClass
	// held says the request already waited in a hold: only such a request
	// takes a shared refusal given before it asked, so that no request is
	// turned away without an answer given after it arrived (a slot freed
	// since would go unseen for up to noneMin). A held request of a
	// refused class parks on it until it is served again or holdEnd.
	held    bool
	holdEnd time.Time
	// since is when the request began to wait for capacity; zero when it
	// has not.
	since time.Time
	// limit says the class's limit applies (its leases are reused);
	// cameBack says whether a lease of the class came back since the
	// request looked (then it looks again rather than wait for one). The
	// gate calls it with its lock held, so that a lease that comes back
	// (leaseBack) as the request starts to wait is not missed.
	limit    bool
	cameBack func() bool
}

// ask lets r's request ask through call, or answers it without: with the
// class's shared refusal, or nil, nil (look again: a lease may have come
// back, or the class is served again). parked is how long it was parked.
func (g *classGate) ask(ctx context.Context, r gateRequest, call askFunc) (resp *weirv1.AcquireResponse, parked time.Duration, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.classLocked(r.class)
	defer g.tidyLocked(r.class, c)
	now := g.now()
	prev := c.none
	refused := prev != nil
	if refused && r.held && now.Before(r.holdEnd) && !g.closed {
		resp, err := g.parkLocked(ctx, c, r.holdEnd, r.since, call)
		return resp, g.now().Sub(now), err
	}
	if refused && r.held && prev.gen == g.gen && now.Before(prev.until) {
		return g.sharedLocked(prev.none), 0, nil
	}
	if !refused && r.limit && !g.closed && c.asking >= maxAsking {
		return nil, 0, g.queueLocked(ctx, c, r.cameBack)
	}
	var f *flight
	if refused {
		// The class was refused last time: one request asks for all.
		// Otherwise requests ask in parallel, as they would without a pool.
		if f = c.flight; f != nil {
			g.mu.Unlock()
			select {
			case <-f.done:
			case <-ctx.Done():
			}
			g.mu.Lock()
			switch {
			case ctx.Err() != nil:
				return nil, 0, ctx.Err()
			case f.none != nil:
				return g.sharedLocked(f.none), 0, nil
			}
			// It got a lease, for its own request: the class is served
			// again, so ask (or reuse) like any other request.
			return nil, 0, nil
		}
		f = &flight{done: make(chan struct{})}
		c.flight = f
	}
	gen := g.gen
	c.asking++
	g.mu.Unlock()
	resp, err = call(ctx, askFirst, time.Time{})
	g.mu.Lock()
	c.asking--
	g.wakeQueuedLocked(c)
	if f != nil {
		c.flight = nil
		defer close(f.done)
	}
	if err != nil {
		return nil, 0, err
	}
	if none := resp.GetNoAccount(); none != nil && none.QuotaBlock == nil {
		// A quota block is not shared: it carries the response mode in
		// force when it was asked, and a switch applies to the next
		// request. It is a final answer or a long wait anyway.
		shared := g.shareLocked(c, none, gen)
		if f != nil {
			f.none = shared
		}
	} else if lease := resp.GetLease(); lease != nil {
		if lease.Probe && refused {
			// The one probe went to this request; for the others nothing
			// changed until it reports: they keep waiting.
			f.none = g.shareLocked(c, prev.none, gen)
		} else {
			c.none = nil
			g.releaseWaitersLocked(c)
		}
	}
	return resp, 0, nil
}

// retry is ask for a retry (a request with accounts tried or one to
// prefer): the control plane decides with what was tried. A standing
// refusal of the whole class answers it as well (fewer accounts or
// another order cannot do better), and an open breaker refuses the class
// whatever was tried.
func (g *classGate) retry(ctx context.Context, cls leaseClass, call askFunc) (*weirv1.AcquireResponse, error) {
	g.mu.Lock()
	c := g.classLocked(cls)
	if n := c.none; n != nil && n.gen == g.gen && g.now().Before(n.until) {
		defer g.mu.Unlock()
		return g.sharedLocked(n.none), nil
	}
	gen := g.gen
	g.tidyLocked(cls, c)
	g.mu.Unlock()
	resp, err := call(ctx, askRetry, time.Time{})
	if err != nil {
		return nil, err
	}
	if none := resp.GetNoAccount(); none.GetReason() == weirv1.NoAccountReason_NO_ACCOUNT_REASON_BREAKER_OPEN {
		g.mu.Lock()
		c := g.classLocked(cls)
		g.shareLocked(c, none, gen)
		g.mu.Unlock()
	}
	return resp, nil
}

// queueLocked waits for a slot to ask or a lease of the class to come
// back (cameBack), and ctx's error if it ended first.
func (g *classGate) queueLocked(ctx context.Context, c *gateClass, cameBack func() bool) error {
	if cameBack != nil && cameBack() {
		return nil
	}
	ch := make(chan struct{}, 1)
	c.queued = append(c.queued, ch)
	g.mu.Unlock()
	g.count("queued")
	select {
	case <-ch:
		g.mu.Lock()
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	if i := slices.Index(c.queued, ch); i >= 0 {
		c.queued = append(c.queued[:i:i], c.queued[i+1:]...)
	} else {
		// Woken as it left: the wake-up is passed on, or a lease or a slot
		// would sit unused by the waiters behind it.
		g.wakeQueuedLocked(c)
	}
	return ctx.Err()
}

// leaseBack wakes the longest-waiting request of cls, if any: a lease of
// the class went idle.
func (g *classGate) leaseBack(cls leaseClass) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c := g.classes[cls]; c != nil {
		g.wakeQueuedLocked(c)
	}
}

func (g *classGate) wakeQueuedLocked(c *gateClass) {
	if len(c.queued) == 0 {
		return
	}
	c.queued[0] <- struct{}{} // buffered, and each waiter is woken once
	c.queued = c.queued[1:]
}

// parkLocked holds a held request of a refused class until the class is
// served again or deadline, asking the control plane for every parked
// request while it leads. It returns a lease (the request's own), the
// class's shared answer at the deadline, or neither: ask as usual.
func (g *classGate) parkLocked(ctx context.Context, c *gateClass, deadline, since time.Time, call askFunc) (*weirv1.AcquireResponse, error) {
	w := &waiter{wake: make(chan waitResult, 1), stop: func() {}, since: since}
	if c.waiters == nil {
		c.waiters, c.poke = map[*waiter]struct{}{}, func() {}
	}
	c.waiters[w] = struct{}{}
	if c.leader == nil {
		c.leader = w
	}
	defer func() {
		// Leaving: hand the lead on.
		delete(c.waiters, w)
		if c.leader == w {
			c.leader = nil
			for next := range c.waiters {
				c.leader = next
				next.send(waitResult{lead: true})
				break
			}
		}
	}()
	for {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		n := c.none
		if n == nil || g.closed {
			g.releaseWaitersLocked(c)
			return nil, nil
		}
		now := g.now()
		if !now.Before(deadline) {
			return g.sharedLocked(n.none), nil
		}
		// A follower sleeps noneMax at a time, or to its deadline: the
		// leader wakes it when the class is served or the lead passes, so
		// it only looks again (no RPC, no hold record), and a virtual
		// clock moved by the sleeps of everything that waits sees it as
		// a request that waits. The leader sleeps until the shared answer
		// runs out, then asks.
		sleepUntil := minTime(now.Add(noneMax), deadline)
		if c.leader == w {
			if n.gen != g.gen || !now.Before(n.until) {
				resp, err := g.leadLocked(ctx, c, call)
				if resp != nil || err != nil {
					return resp, err
				}
				continue
			}
			sleepUntil = minTime(n.until, deadline)
		}
		wctx, stop := context.WithCancel(ctx)
		w.stop = stop
		if c.leader == w {
			c.poke = stop
		}
		select {
		case <-w.wake: // a stale wake-up from an earlier wait
		default:
		}
		g.mu.Unlock()
		g.sleep(wctx, sleepUntil.Sub(now))
		stop()
		g.mu.Lock()
	}
}

// leadLocked makes the class's one Acquire for the leader and applies the
// answer; it returns the leader's lease if it got one.
func (g *classGate) leadLocked(ctx context.Context, c *gateClass, call askFunc) (*weirv1.AcquireResponse, error) {
	gen, prev := g.gen, c.none
	var since time.Time
	for w := range c.waiters {
		if !w.since.IsZero() && (since.IsZero() || w.since.Before(since)) {
			since = w.since
		}
	}
	g.mu.Unlock()
	resp, err := call(ctx, askForAll, since)
	g.mu.Lock()
	switch {
	case err != nil:
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// Let every parked request meet the error itself (a control plane
		// that is down is held like any transient condition).
		c.none = nil
		g.releaseWaitersLocked(c)
		return nil, nil
	case resp.GetNoAccount() != nil:
		if none := resp.GetNoAccount(); none.QuotaBlock == nil {
			g.shareLocked(c, none, gen)
			return nil, nil
		}
		// A quota block is answered per request (the mode in force).
		c.none = nil
		g.releaseWaitersLocked(c)
		return nil, nil
	}
	if resp.GetLease().Probe {
		// The probe is the leader's; the rest wait on its report.
		g.shareLocked(c, prev.none, gen)
		return resp, nil
	}
	c.none = nil
	g.releaseWaitersLocked(c)
	return resp, nil
}

// releaseWaitersLocked wakes every parked request of the class to ask as
// usual.
func (g *classGate) releaseWaitersLocked(c *gateClass) {
	for w := range c.waiters {
		w.send(waitResult{again: true})
	}
}

// shareLocked records none as the class's shared answer until its retry
// time, clamped to [noneMin, noneMax] from now, and returns the answer the
// class's held requests get: none with that time as its retry time, so
// they wake together when one of them should ask again, not before. It is
// shared only if nothing changed since it was asked (gen); either way the
// class counts as refused, so its next request asks for all.
func (g *classGate) shareLocked(c *gateClass, none *weirv1.NoAccount, gen uint64) *weirv1.NoAccount {
	now := g.now()
	until := now.Add(noneMax)
	if ra := none.GetRetryAt(); ra != nil && ra.AsTime().Before(until) {
		until = ra.AsTime()
	}
	until = maxTime(until, now.Add(noneMin))
	shared := proto.CloneOf(none)
	shared.RetryAt = timestamppb.New(until)
	c.none = &sharedNone{none: shared, until: until, gen: gen}
	return shared
}

// sharedLocked answers a request with the class's shared refusal.
func (g *classGate) sharedLocked(none *weirv1.NoAccount) *weirv1.AcquireResponse {
	g.count("shared_none")
	return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_NoAccount{NoAccount: none}}
}

// invalidate ends every shared refusal (what changed may serve them) and
// has every parked class's leader ask now.
func (g *classGate) invalidate() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gen++
	g.pokeAllLocked()
}

func (g *classGate) pokeAllLocked() {
	for _, c := range g.classes {
		if c.poke != nil {
			c.poke()
		}
	}
}

// close lets every waiting request go: from now on no request waits at
// the gate, and parked ones ask as usual.
func (g *classGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	g.pokeAllLocked()
	for _, c := range g.classes {
		for _, ch := range c.queued {
			ch <- struct{}{}
		}
		c.queued = nil
	}
}

// sweep forgets the refusals of classes no request asked about in the
// minute past their retry time.
func (g *classGate) sweep() {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.now()
	for cls, c := range g.classes {
		if c.none != nil && now.Sub(c.none.until) > time.Minute && len(c.waiters) == 0 {
			c.none = nil
		}
		g.tidyLocked(cls, c)
	}
}

// classLocked returns cls's state, making it on first use.
func (g *classGate) classLocked(cls leaseClass) *gateClass {
	c := g.classes[cls]
	if c == nil {
		c = &gateClass{}
		g.classes[cls] = c
		if g.made != nil {
			g.made()
		}
	}
	return c
}

// empty says whether the gate holds no class's state: the sweep has
// nothing to do.
func (g *classGate) empty() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.classes) == 0
}

// tidyLocked drops cls's state once nothing is in it.
func (g *classGate) tidyLocked(cls leaseClass, c *gateClass) {
	if c.asking == 0 && len(c.queued) == 0 && c.flight == nil && c.none == nil && len(c.waiters) == 0 && g.classes[cls] == c {
		delete(g.classes, cls)
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
