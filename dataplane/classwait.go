package dataplane

import (
	"context"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// A capacity storm parks thousands of requests on a few refused classes.
// Each asking the control plane, or even leaving its hold to read the
// class's shared answer, costs an RPC or a hold record and allocations per
// request per interval: with 2,000 held requests, most of a core. Instead
// the held requests of a refused class park on it (classWait). One of
// them, the leader, waits for the shared answer to run out (or an
// invalidation to poke it) and asks the control plane for everyone; the
// others only look again when the answer runs out. They leave when the
// class is served again, when the leader leaves (one of them leads next),
// or at their deadline. A lease the leader gets is its own; a breaker's
// probe goes to it alone and the rest keep waiting for the probe's report.

// classWait is one refused class's parked requests.
type classWait struct {
	waiters map[*waiter]struct{}
	leader  *waiter
	// poke ends the leader's wait: an invalidation arrived, ask now.
	poke context.CancelFunc
}

// waiter is one parked request.
type waiter struct {
	deadline time.Time
	wake     chan waitResult // buffered 1; written once per wait
	// stop ends the request's current sleep (Config.Sleep, so that tests'
	// virtual clocks see it waiting).
	stop context.CancelFunc
}

// waitResult ends a wait: the class may be served (again: ask as usual),
// or the waiter now leads.
type waitResult struct {
	again, lead bool
}

// send wakes w with r. Under p.mu.
func (w *waiter) send(r waitResult) {
	select {
	case w.wake <- r:
	default: // already woken; the first reason stands
	}
	w.stop()
}

// park holds a held request of a refused class until the class is served
// again or deadline, asking the control plane for every parked request
// while it leads. It returns a lease (the request's own), the class's
// shared answer at the deadline, or neither: ask as usual. The caller
// holds p.mu; park returns with it released.
func (p *leasePool) park(ctx context.Context, cls leaseClass, req *weirv1.AcquireRequest, deadline time.Time) (*weirv1.Lease, *weirv1.NoAccount, error) {
	w := &waiter{deadline: deadline, wake: make(chan waitResult, 1), stop: func() {}}
	cw := p.waits[cls]
	if cw == nil {
		cw = &classWait{waiters: map[*waiter]struct{}{}, poke: func() {}}
		p.waits[cls] = cw
	}
	cw.waiters[w] = struct{}{}
	if cw.leader == nil {
		cw.leader = w
	}
	defer func() {
		// Leaving (p.mu held again): hand the lead on.
		delete(cw.waiters, w)
		if cw.leader == w {
			cw.leader = nil
			for next := range cw.waiters {
				cw.leader = next
				next.send(waitResult{lead: true})
				break
			}
		}
		if len(cw.waiters) == 0 && p.waits[cls] == cw {
			delete(p.waits, cls)
		}
		p.mu.Unlock()
	}()
	for {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		n, refused := p.nones[cls]
		if !refused || p.closed {
			p.releaseWaitersLocked(cw)
			return nil, nil, nil
		}
		now := p.now()
		if !now.Before(deadline) {
			return nil, n.none, nil
		}
		// A follower sleeps noneMax at a time, or to its deadline: the
		// leader wakes it when the class is served or the lead passes, so
		// it only looks again (no RPC, no hold record) to stay visible to
		// a test's virtual clock as a request that waits. The leader
		// sleeps until the shared answer runs out, then asks.
		sleepUntil := minTime(now.Add(noneMax), deadline)
		if cw.leader == w {
			if n.gen != p.noneGen || !now.Before(n.until) {
				lease, err := p.askLocked(ctx, cls, cw, req)
				if lease != nil || err != nil {
					return lease, nil, err
				}
				continue
			}
			sleepUntil = minTime(n.until, deadline)
		}
		wctx, stop := context.WithCancel(ctx)
		w.stop = stop
		if cw.leader == w {
			cw.poke = stop
		}
		select {
		case <-w.wake: // a stale wake-up from an earlier wait
		default:
		}
		p.mu.Unlock()
		// Followers: no timer fires before the deadline; the class's
		// state or the leader's leaving ends the sleep.
		p.sleep(wctx, sleepUntil.Sub(now))
		stop()
		p.mu.Lock()
	}
}

// askLocked makes the class's one Acquire for the leader and applies the
// answer; it returns the leader's lease if it got one. p.mu is held on
// entry and on return, released during the call.
func (p *leasePool) askLocked(ctx context.Context, cls leaseClass, cw *classWait, req *weirv1.AcquireRequest) (*weirv1.Lease, error) {
	gen, noneGen := p.gen, p.noneGen
	prev := p.nones[cls]
	p.mu.Unlock()
	p.metrics.leasePool.WithLabelValues("class_probe").Inc()
	resp, err := p.client.Acquire(ctx, connect.NewRequest(req))
	p.mu.Lock()
	switch {
	case err != nil:
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// Let every parked request meet the error itself (a control plane
		// that is down is held like any transient condition).
		delete(p.nones, cls)
		p.releaseWaitersLocked(cw)
		return nil, nil
	case resp.Msg.GetNoAccount() != nil:
		if none := resp.Msg.GetNoAccount(); none.QuotaBlock == nil {
			p.shareLocked(cls, none, noneGen)
			return nil, nil
		}
		// A quota block is answered per request (the mode in force).
		delete(p.nones, cls)
		p.releaseWaitersLocked(cw)
		return nil, nil
	}
	lease := resp.Msg.GetLease()
	if lease.Probe {
		// The probe is the leader's; the rest wait on its report.
		p.shareLocked(cls, prev.none, noneGen)
		return lease, nil
	}
	delete(p.nones, cls)
	p.grantedLocked(cls, req.SessionKey, lease, gen)
	p.releaseWaitersLocked(cw)
	return lease, nil
}

// releaseWaitersLocked wakes every parked request of the class to ask as
// usual.
func (p *leasePool) releaseWaitersLocked(cw *classWait) {
	for w := range cw.waiters {
		w.send(waitResult{again: true})
	}
}

// pokeAllLocked has every class's leader ask now.
func (p *leasePool) pokeAllLocked() {
	for _, cw := range p.waits {
		cw.poke()
	}
}

// wakeServedLocked wakes the parked requests of a class that is served
// again (a request of it got a lease).
func (p *leasePool) wakeServedLocked(cls leaseClass) {
	if cw := p.waits[cls]; cw != nil {
		p.releaseWaitersLocked(cw)
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
