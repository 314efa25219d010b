package dataplane

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/backoff"
)

// leasePool is the worker's lease fast path. Three things keep the control
// plane off a request's critical path without giving up its guarantees:
//
//   - Reuse. A lease the control plane granted with reuse_until serves
//     further requests of the same key, surface and model after a success,
//     until that deadline; a session's request reuses only a lease on the
//     account the session is bound to. The lease row stays in Postgres the
//     whole time, so every account's concurrency cap still holds across
//     workers: a reused lease is one slot, used by one request at a time.
//   - Invalidation. The control plane's WatchPool stream, fed by Postgres
//     notifications, names every account whose routing state changes (a
//     cooldown, a gate, a pause, a usage threshold crossed) and the
//     pool-wide changes (a breaker, a key, an alias). The pool drops what
//     it names at once; while the stream is not ready nothing is reused.
//   - Batching. Successes are settled through ReleaseBatch off the request
//     path; failures still go through Release, synchronously, because the
//     control plane's decision (fail over, retry, answer) is needed now.
//
// Held requests share their waits as well: while an Acquire for a class
// is in flight, the class's other requests wait for its answer, and a "no
// account" answer is shared until its retry time (see shareLocked) or
// the next invalidation. A capacity storm of thousands of held requests
// costs one Acquire per class per probe, not one per request.
type leasePool struct {
	client  weirv1connect.LeaseServiceClient
	log     *slog.Logger
	now     func() time.Time
	metrics *metrics
	// idleFor is how long a reusable lease may sit unused before it is
	// returned: an idle worker must not keep slots other workers could use.
	idleFor time.Duration
	// pace is the least time between two ReleaseBatch sends.
	pace time.Duration
	// forgetKeys is called when a client key changed.
	forgetKeys func()

	mu    sync.Mutex
	ready bool   // the WatchPool stream is up
	gen   uint64 // bumped by every invalidation
	// noneGen is bumped by what may make a refused class servable: the
	// control plane's events, not this worker's own failures (they only
	// make things worse).
	noneGen uint64
	// accountGen is the gen of each account's last invalidation; allGen of
	// the last pool-wide one.
	accountGen map[string]uint64
	allGen     uint64
	idle       map[leaseClass][]*warmLease
	reusable   map[string]*warmLease // lease id → lease, idle or in use
	sessions   map[string]sessionEntry
	flights    map[leaseClass]*flight
	nones      map[leaseClass]sharedNone
	waits      map[leaseClass]*classWait // parked held requests (classwait.go)
	// prefetching counts each class's prefetches in flight; rates counts
	// their reuses per second.
	prefetching map[leaseClass]int
	rates       map[leaseClass]reuseRate
	// asking counts each class's Acquires in flight; queued is the
	// class's requests waiting for a lease to come back or for an
	// Acquire slot (see gateLocked).
	asking map[leaseClass]int
	queued map[leaseClass][]chan struct{}
	closed bool

	// pending is the ReleaseBatch queue; kick wakes the sender.
	pending []*weirv1.ReleaseItem
	kick    chan struct{}
	// redeliver holds the Releases the control plane did not answer (it
	// was unreachable); the sender sends them again, oldest first, until
	// they are answered. A Release is applied once: the first to arrive
	// ends the lease, a repeat finds none (NotFound).
	redeliver []redelivery

	// changed is the change signal that wakes held requests (wake.go);
	// down says calls to the control plane go undelivered.
	changed       atomic.Pointer[context.Context]
	changedCancel context.CancelFunc // under mu
	down          atomic.Bool        // written under mu

	// sleep waits d or until ctx ends (Config.Sleep: tests move a virtual
	// clock with it).
	sleep func(ctx context.Context, d time.Duration) bool
	// life ends when the pool closes.
	life context.Context
	stop context.CancelFunc
	done sync.WaitGroup
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
	idleSince  time.Time // on the monotonic clock: a test's frozen clock must not pin slots
	// renewed says a replacement was asked for as the lease aged.
	renewed bool
}

// sessionEntry is the account a session was bound to when the worker last
// learned it, and the gen then: an invalidation of the account after that
// makes it unknown again.
type sessionEntry struct {
	account string
	gen     uint64
}

// flight is one Acquire in progress for a class; its NoAccount answer is
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

// maxSessions bounds the session map: past it, it starts over (the next
// request of each session asks the control plane once).
const maxSessions = 100000

// maxReleaseItems matches the control plane's limit per ReleaseBatch call.
const maxReleaseItems = 10000

// A redelivery is a Release to send again, and when its attempt ended (on
// the monotonic clock), so that the control plane can date its evidence.
type redelivery struct {
	req   *weirv1.ReleaseRequest
	ended time.Time
}

// The outbox's bounds: past them the oldest reports are dropped (and
// counted). A worker cut off from its control plane for long keeps a few
// MiB, not everything.
const (
	maxRedeliveries = 10000
	maxPendingItems = 5 * maxReleaseItems
)

// undelivered says whether a failed call may not have reached the control
// plane, or found it unable to store it (its database down), so that
// sending it again can succeed. A refusal (invalid, not found) is final.
func undelivered(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeDeadlineExceeded, connect.CodeUnknown,
		connect.CodeInternal, connect.CodeAborted, connect.CodeCanceled, connect.CodeResourceExhausted:
		return true
	}
	return false
}

func newLeasePool(client weirv1connect.LeaseServiceClient, log *slog.Logger, now func() time.Time,
	sleep func(context.Context, time.Duration) bool, m *metrics, idleFor, pace time.Duration, forgetKeys func()) *leasePool {
	ctx, cancel := context.WithCancel(context.Background())
	p := &leasePool{
		client: client, log: log, now: now, sleep: sleep, metrics: m, idleFor: idleFor, pace: pace,
		forgetKeys: forgetKeys, waits: map[leaseClass]*classWait{}, prefetching: map[leaseClass]int{}, rates: map[leaseClass]reuseRate{},
		asking: map[leaseClass]int{}, queued: map[leaseClass][]chan struct{}{},
		accountGen: map[string]uint64{}, idle: map[leaseClass][]*warmLease{}, reusable: map[string]*warmLease{},
		sessions: map[string]sessionEntry{}, flights: map[leaseClass]*flight{}, nones: map[leaseClass]sharedNone{},
		kick: make(chan struct{}, 1), life: ctx, stop: cancel,
	}
	p.client = observedClient{LeaseServiceClient: client, p: p}
	changed, changedCancel := context.WithCancel(context.Background())
	p.changed.Store(&changed)
	p.changedCancel = changedCancel
	p.done.Add(2)
	go p.send(ctx)
	go p.sweepLoop(ctx)
	if idleFor > 0 {
		p.done.Add(1)
		go p.watch(ctx)
	}
	return p
}

// acquire leases an account for req, from the pool when it can. held says
// the request already waited in a hold: only such a request takes a shared
// "no account" answer given before it asked, so that no request is turned
// away without an answer given after it arrived (a slot freed since would
// go unseen for up to noneMin). A held request of a refused class parks
// on the class until it is served again or holdEnd (see classwait.go).
func (p *leasePool) acquire(ctx context.Context, req *weirv1.AcquireRequest, held bool, holdEnd time.Time) (_ *weirv1.AcquireResponse, parked time.Duration, err error) {
	cls := leaseClass{keyHash: req.KeyHash, surface: req.Surface, model: req.Model, sessioned: req.SessionKey != ""}
	if len(req.ExcludeAccountIds) > 0 || req.PreferAccountId != "" {
		// A retry: the control plane decides with what was tried. A
		// standing refusal of the whole class answers it as well (fewer
		// accounts or another order cannot do better), and an open
		// breaker refuses the class whatever was tried.
		p.mu.Lock()
		if n, ok := p.nones[cls]; ok && n.gen == p.noneGen && p.now().Before(n.until) {
			p.mu.Unlock()
			p.metrics.leasePool.WithLabelValues("shared_none").Inc()
			return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_NoAccount{NoAccount: n.none}}, parked, nil
		}
		noneGen := p.noneGen
		p.mu.Unlock()
		p.metrics.leasePool.WithLabelValues("retry").Inc()
		resp, err := p.client.Acquire(ctx, connect.NewRequest(req))
		if err != nil {
			return nil, parked, err
		}
		if none := resp.Msg.GetNoAccount(); none.GetReason() == weirv1.NoAccountReason_NO_ACCOUNT_REASON_BREAKER_OPEN {
			p.mu.Lock()
			p.shareLocked(cls, none, noneGen)
			p.mu.Unlock()
		}
		return resp.Msg, parked, nil
	}
	for {
		p.mu.Lock()
		now := p.now()
		if w := p.takeIdleLocked(cls, req.SessionKey, now); w != nil {
			p.mu.Unlock()
			p.metrics.leasePool.WithLabelValues("reused").Inc()
			return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_Lease{Lease: w.lease}}, parked, nil
		}
		n, refused := p.nones[cls]
		if refused && held && now.Before(holdEnd) && !p.closed {
			lease, none, err := p.park(ctx, cls, req, holdEnd) // unlocks p.mu
			parked += p.now().Sub(now)
			switch {
			case err != nil:
				return nil, parked, err
			case lease != nil:
				return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_Lease{Lease: lease}}, parked, nil
			case none != nil:
				p.metrics.leasePool.WithLabelValues("shared_none").Inc()
				return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_NoAccount{NoAccount: none}}, parked, nil
			}
			continue // the class may be served again
		}
		if refused && held && n.gen == p.noneGen && now.Before(n.until) {
			p.mu.Unlock()
			p.metrics.leasePool.WithLabelValues("shared_none").Inc()
			return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_NoAccount{NoAccount: n.none}}, parked, nil
		}
		if !refused {
			if waited, err := p.gateLocked(ctx, cls); waited || err != nil { // unlocks p.mu when true or err
				if err != nil {
					return nil, parked, err
				}
				continue // a lease came back, or a slot to ask is free
			}
		}
		var f *flight
		if refused {
			// The class was refused last time: one request asks for all.
			// Otherwise requests ask in parallel, as they would without a
			// pool.
			if f = p.flights[cls]; f != nil {
				p.mu.Unlock()
				select {
				case <-f.done:
				case <-ctx.Done():
					return nil, parked, ctx.Err()
				}
				if f.none != nil {
					p.metrics.leasePool.WithLabelValues("shared_none").Inc()
					return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_NoAccount{NoAccount: f.none}}, parked, nil
				}
				// It got a lease, for its own request: the class is served
				// again, so ask (or reuse) like any other request.
				continue
			}
			f = &flight{done: make(chan struct{})}
			p.flights[cls] = f
		}
		gen, noneGen := p.gen, p.noneGen
		p.asking[cls]++
		p.mu.Unlock()

		p.metrics.leasePool.WithLabelValues("acquired").Inc()
		resp, err := p.client.Acquire(ctx, connect.NewRequest(req))

		p.mu.Lock()
		if p.asking[cls]--; p.asking[cls] <= 0 {
			delete(p.asking, cls)
		}
		p.wakeQueuedLocked(cls)
		if f != nil {
			delete(p.flights, cls)
		}
		if err == nil {
			if none := resp.Msg.GetNoAccount(); none != nil && none.QuotaBlock == nil {
				// A quota block is not shared: it carries the response mode
				// in force when it was asked, and a switch applies to the
				// next request. It is a final answer or a long wait anyway.
				shared := p.shareLocked(cls, none, noneGen)
				if f != nil {
					f.none = shared
				}
			} else if lease := resp.Msg.GetLease(); lease != nil {
				if lease.Probe && refused {
					// The one probe went to this request; for the others
					// nothing changed until it reports: they keep waiting.
					if f != nil {
						f.none = p.shareLocked(cls, n.none, noneGen)
					}
				} else {
					delete(p.nones, cls)
					p.wakeServedLocked(cls)
				}
				p.grantedLocked(cls, req.SessionKey, lease, gen)
			}
		}
		p.mu.Unlock()
		if f != nil {
			close(f.done)
		}
		if err != nil {
			return nil, parked, err
		}
		return resp.Msg, parked, nil
	}
}

// maxAsking is how many Acquires one class may have in flight before its
// next request waits for a lease to come back instead (gateLocked).
const maxAsking = 4

// gateLocked keeps a class that reuses leases from stampeding the control
// plane. A cold start, or an invalidation that dropped the class's leases,
// would otherwise send every request that finds no idle lease to Acquire
// at once; under load the Acquires slow down, requests pile up and each
// asks in turn. With maxAsking Acquires of the class in flight, a request
// waits for whichever comes first: a lease of its class going idle (a
// request served in a millisecond frees it long before an Acquire would
// answer) or an Acquire ending, which frees a slot to ask. The wait is
// FIFO, one waiter woken per event. It reports false, with p.mu still
// held, when the request may ask at once.
func (p *leasePool) gateLocked(ctx context.Context, cls leaseClass) (bool, error) {
	if !p.ready || p.closed || p.asking[cls] < maxAsking {
		return false, nil
	}
	ch := make(chan struct{}, 1)
	p.queued[cls] = append(p.queued[cls], ch)
	p.mu.Unlock()
	p.metrics.leasePool.WithLabelValues("queued").Inc()
	select {
	case <-ch:
		return true, nil
	case <-ctx.Done():
		p.mu.Lock()
		q := p.queued[cls]
		if i := slices.Index(q, ch); i >= 0 {
			p.setQueuedLocked(cls, slices.Delete(q, i, i+1))
		} else {
			// Woken as it left: the wake-up is passed on, or a lease
			// or a slot would sit unused by the waiters behind it.
			p.wakeQueuedLocked(cls)
		}
		p.mu.Unlock()
		return true, ctx.Err()
	}
}

// wakeQueuedLocked wakes the class's longest-waiting request, if any.
func (p *leasePool) wakeQueuedLocked(cls leaseClass) {
	q := p.queued[cls]
	if len(q) == 0 {
		return
	}
	q[0] <- struct{}{} // buffered, and each waiter is woken once
	p.setQueuedLocked(cls, q[1:])
}

func (p *leasePool) setQueuedLocked(cls leaseClass, q []chan struct{}) {
	if len(q) == 0 {
		delete(p.queued, cls)
		return
	}
	p.queued[cls] = q
}

// putIdleLocked makes w available to its class's next request.
func (p *leasePool) putIdleLocked(w *warmLease) {
	w.idleSince = time.Now()
	p.idle[w.class] = append(p.idle[w.class], w)
	p.wakeQueuedLocked(w.class)
}

// Bounds of how long a shared "no account" answer stands before one held
// request asks again: at least noneMin (a retry time already passed would
// have every held request ask at once), at most noneMax.
const (
	noneMin = 250 * time.Millisecond
	noneMax = 5 * time.Second
)

// shareLocked records none as the class's shared answer until its retry
// time, clamped to [noneMin, noneMax] from now, and returns the answer the
// class's held requests get: none with that time as its retry time, so
// they wake together when one of them should ask again, not before. It is
// shared only if nothing changed since it was asked (gen); either way the
// class counts as refused, so its next request asks for all.
func (p *leasePool) shareLocked(cls leaseClass, none *weirv1.NoAccount, gen uint64) *weirv1.NoAccount {
	now := p.now()
	until := now.Add(noneMax)
	if ra := none.GetRetryAt(); ra != nil && ra.AsTime().Before(until) {
		until = ra.AsTime()
	}
	until = maxTime(until, now.Add(noneMin))
	shared := proto.CloneOf(none)
	shared.RetryAt = timestamppb.New(until)
	p.nones[cls] = sharedNone{none: shared, until: until, gen: gen}
	return shared
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// grantedLocked takes note of a fresh lease: the session's account, and
// the lease itself when it may be reused and nothing about its account
// changed since the Acquire was sent (gen).
func (p *leasePool) grantedLocked(cls leaseClass, session string, lease *weirv1.Lease, gen uint64) {
	if session != "" {
		if len(p.sessions) >= maxSessions {
			clear(p.sessions)
		}
		p.sessions[session] = sessionEntry{account: lease.AccountId, gen: p.gen}
	}
	if lease.ReuseUntil == nil || !p.ready || p.allGen > gen || p.accountGen[lease.AccountId] > gen {
		return
	}
	p.reusable[lease.Id] = &warmLease{lease: lease, class: cls, granted: p.now(), reuseUntil: lease.ReuseUntil.AsTime()}
}

// takeIdleLocked returns an idle lease that may serve cls (and session),
// most recently used first, or nil.
func (p *leasePool) takeIdleLocked(cls leaseClass, session string, now time.Time) *warmLease {
	if !p.ready {
		return nil
	}
	stack := p.idle[cls]
	if len(stack) == 0 {
		return nil
	}
	var account string
	if session != "" {
		e, ok := p.sessions[session]
		if !ok || e.gen < p.allGen || e.gen < p.accountGen[e.account] {
			return nil // unknown here: the control plane binds it
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
		p.idle[cls] = append(stack[:i:i], stack[i+1:]...)
		busy := p.countReuseLocked(cls)
		switch {
		case cls.sessioned:
		case !w.renewed && now.Sub(w.granted) >= w.reuseUntil.Sub(w.granted)*3/4:
			// One replacement per aging lease: leases granted together
			// age together, and one prefetch at a time would leave the
			// class short when they lapse.
			w.renewed = p.prefetchLocked(cls, maxAsking)
		case len(p.idle[cls]) < spares && busy:
			p.prefetchLocked(cls, spares)
		}
		return w
	}
	return nil
}

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

// countReuseLocked counts a reuse of cls and says whether the class has
// reused spareRate leases or more this second.
func (p *leasePool) countReuseLocked(cls leaseClass) bool {
	now := time.Now()
	r := p.rates[cls]
	if age := now.Sub(r.since); age >= time.Second {
		last := r.n
		if age >= 2*time.Second {
			last = 0 // a quiet second between
		}
		r = reuseRate{since: now, last: last}
	}
	r.n++
	if len(p.rates) > 10000 {
		clear(p.rates) // bounded: one entry per key and model in use
	}
	p.rates[cls] = r
	return r.n >= spareRate
}

// busyLocked says whether cls reused spareRate leases or more in its
// current second or the one before.
func (p *leasePool) busyLocked(cls leaseClass) bool {
	r := p.rates[cls]
	age := time.Since(r.since)
	return r.n >= spareRate && age < 2*time.Second || r.last >= spareRate && age < time.Second
}

type reuseRate struct {
	since time.Time
	n     int
	last  int // the count of the second before since
}

// prefetchLocked asks, off any request's path, for a fresh lease of a
// class whose busy lease is near its reuse deadline (when it lapses the
// class's next request finds the fresh one instead of asking and waiting)
// or whose last idle lease was just taken while it is busy (a spare).
// At most limit at a time per class; a session's class is not prefetched
// (its lease must be on the session's account, which the request names).
func (p *leasePool) prefetchLocked(cls leaseClass, limit int) bool {
	if p.prefetching[cls] >= limit || p.closed || !p.ready {
		return false
	}
	p.prefetching[cls]++
	req := &weirv1.AcquireRequest{KeyHash: cls.keyHash, Model: cls.model, Surface: cls.surface, RequestId: newRequestID()}
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		p.metrics.leasePool.WithLabelValues("prefetch").Inc()
		p.mu.Lock()
		gen := p.gen
		p.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := p.client.Acquire(ctx, connect.NewRequest(req))
		cancel()
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.prefetching[cls]--; p.prefetching[cls] <= 0 {
			delete(p.prefetching, cls)
		}
		if err != nil || resp.Msg.GetLease() == nil {
			return // no account now: the class's requests will ask themselves
		}
		lease := resp.Msg.GetLease()
		p.grantedLocked(cls, "", lease, gen)
		w := p.reusable[lease.Id]
		if w == nil || p.closed {
			p.enqueueLocked(&weirv1.ReleaseItem{LeaseId: lease.Id})
			return
		}
		p.putIdleLocked(w)
	}()
	return true
}

// release settles an attempt's outcome. A success whose lease is kept for
// reuse is answered at once and settled in the next ReleaseBatch; any
// other outcome goes to the control plane now: a failure for its decision,
// a success so that its slot is free before the client's next request (a
// sequential client on an account with a cap of one must not find its own
// last lease still counted).
func (p *leasePool) release(ctx context.Context, lease *weirv1.Lease, o *weirv1.Outcome, admitted time.Time, session string) (*weirv1.Decision, error) {
	if o.Class == weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS {
		p.mu.Lock()
		if w := p.reusable[lease.Id]; w != nil {
			if now := p.now(); p.ready && now.Before(w.reuseUntil) {
				p.putIdleLocked(w)
				p.enqueueLocked(&weirv1.ReleaseItem{LeaseId: lease.Id, Outcome: o, AdmittedAt: timestamppb.New(admitted),
					SessionKey: session, Keep: true})
				p.mu.Unlock()
				return &weirv1.Decision{Action: weirv1.Action_ACTION_RESPOND}, nil
			}
			delete(p.reusable, lease.Id)
		}
		p.mu.Unlock()
		return p.releaseNow(ctx, &weirv1.ReleaseRequest{LeaseId: lease.Id, Outcome: o})
	}
	p.mu.Lock()
	delete(p.reusable, lease.Id)
	if o.Class != weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR {
		// The account may be cooling from now on: stop reusing it here
		// without waiting for the notification.
		p.dropAccountLocked(lease.AccountId)
	}
	p.mu.Unlock()
	return p.releaseNow(ctx, &weirv1.ReleaseRequest{LeaseId: lease.Id, Outcome: o})
}

// releaseNow sends a Release. One the control plane may not have stored
// goes to the outbox, to be sent again once it answers: the caller decides
// alone meanwhile, and the evidence still arrives.
func (p *leasePool) releaseNow(ctx context.Context, req *weirv1.ReleaseRequest) (*weirv1.Decision, error) {
	ended := time.Now()
	resp, err := p.client.Release(ctx, connect.NewRequest(req))
	if err == nil {
		return resp.Msg.Decision, nil
	}
	if undelivered(err) {
		p.mu.Lock()
		p.redeliver = append(p.redeliver, redelivery{req: req, ended: ended})
		if n := len(p.redeliver) - maxRedeliveries; n > 0 {
			p.redeliver = slices.Delete(p.redeliver, 0, n)
			p.metrics.reportsDropped.WithLabelValues("release").Add(float64(n))
		}
		p.mu.Unlock()
		p.wakeSender()
	}
	return nil, err
}

// invalidate applies one WatchPool event.
func (p *leasePool) invalidate(ev *weirv1.WatchPoolResponse) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.noneGen++
	p.pokeAllLocked()
	p.changedLocked()
	if ev.Ready {
		p.ready = true
		p.metrics.poolReady.Set(1)
	}
	if ev.All || ev.Keys {
		p.dropAllLocked()
		p.metrics.poolEvents.WithLabelValues("all").Inc()
	}
	for _, id := range ev.AccountIds {
		p.dropAccountLocked(id)
	}
	p.metrics.poolEvents.WithLabelValues("account").Add(float64(len(ev.AccountIds)))
	if ev.Keys && p.forgetKeys != nil {
		p.forgetKeys()
	}
}

// notReady stops reuse until the stream is ready again: what changed in
// between is unknown, so nothing held may be trusted.
func (p *leasePool) notReady() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ready = false
	p.metrics.poolReady.Set(0)
	p.noneGen++
	p.pokeAllLocked()
	p.dropAllLocked()
}

func (p *leasePool) dropAccountLocked(account string) {
	p.gen++
	p.accountGen[account] = p.gen
	for id, w := range p.reusable {
		if w.lease.AccountId == account {
			delete(p.reusable, id)
		}
	}
	for cls, stack := range p.idle {
		kept := stack[:0]
		for _, w := range stack {
			if w.lease.AccountId == account {
				p.enqueueLocked(&weirv1.ReleaseItem{LeaseId: w.lease.Id})
				continue
			}
			kept = append(kept, w)
		}
		p.setIdleLocked(cls, kept)
	}
}

func (p *leasePool) dropAllLocked() {
	p.gen++
	p.allGen = p.gen
	clear(p.reusable)
	for cls, stack := range p.idle {
		for _, w := range stack {
			p.enqueueLocked(&weirv1.ReleaseItem{LeaseId: w.lease.Id})
		}
		delete(p.idle, cls)
	}
	if len(p.accountGen) > 10000 {
		// allGen covers every entry now.
		clear(p.accountGen)
	}
}

func (p *leasePool) setIdleLocked(cls leaseClass, stack []*warmLease) {
	if len(stack) == 0 {
		delete(p.idle, cls)
		return
	}
	p.idle[cls] = stack
}

// sweep returns the leases idle for idleFor (by mono) or past their reuse
// deadline (by now).
func (p *leasePool) sweep(now, mono time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for cls, stack := range p.idle {
		kept := stack[:0]
		idleFor := p.idleFor
		if p.busyLocked(cls) {
			// A busy class's hiccup (a GC, a slow client) needs more leases
			// at once than its average: kept a while, they absorb it instead
			// of a burst of Acquires at the slowest moment.
			idleFor *= busyIdle
		}
		for _, w := range stack {
			if mono.Sub(w.idleSince) >= idleFor || !now.Before(w.reuseUntil) {
				delete(p.reusable, w.lease.Id)
				p.enqueueLocked(&weirv1.ReleaseItem{LeaseId: w.lease.Id})
				continue
			}
			kept = append(kept, w)
		}
		p.setIdleLocked(cls, kept)
	}
	for cls, n := range p.nones {
		if now.Sub(n.until) > time.Minute && p.waits[cls] == nil {
			delete(p.nones, cls) // no request of the class since
		}
	}
}

func (p *leasePool) sweepLoop(ctx context.Context) {
	defer p.done.Done()
	period := 100 * time.Millisecond
	if p.idleFor > 0 {
		period = max(min(p.idleFor/2, time.Second), 10*time.Millisecond)
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.sweep(p.now(), time.Now())
		}
	}
}

func (p *leasePool) enqueueLocked(item *weirv1.ReleaseItem) {
	p.pending = append(p.pending, item)
	p.wakeSender()
}

// send settles queued items in batches: whatever is queued when a call
// can go, in one call, at most once per pace (unless the last call was
// full). Under load a batch fills meanwhile; after a quiet spell an item
// goes alone and at once.
func (p *leasePool) send(ctx context.Context) {
	defer p.done.Done()
	wait := time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			// Closing: one last try for what is queued. What the control
			// plane does not take now is lost, and logged.
			for {
				more, err := p.sendOnce(context.Background())
				if err != nil {
					p.mu.Lock()
					n, m := len(p.pending), len(p.redeliver)
					p.mu.Unlock()
					p.log.Warn("closing with outcomes the control plane did not take", "successes", n, "releases", m, "err", err)
					break
				}
				if !more {
					break
				}
			}
			return
		case <-p.kick:
		}
		start := time.Now()
		more, err := p.sendOnce(ctx)
		if err != nil {
			// The control plane is unreachable: try again after a pause
			// that grows while it stays so (what is queued meanwhile
			// waits; the outbox is bounded).
			wait = backoff.Next(wait, 100*time.Millisecond, 5*time.Second)
			p.log.Warn("outcomes not delivered; sending them again", "in", wait, "err", err)
			if sleepCtx(ctx, wait) {
				p.wakeSender()
			}
			continue
		}
		wait = 0
		if more {
			p.wakeSender() // more is queued: the next call goes now
			continue
		}
		sleepCtx(ctx, time.Until(start.Add(p.pace)))
	}
}

// wakeSender wakes the sender.
func (p *leasePool) wakeSender() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// sendOnce sends the Releases to redeliver, then what is queued for
// ReleaseBatch, up to maxReleaseItems, in one call. It reports whether
// that call was full and more is queued, or the error that stopped it
// when the control plane did not take what was sent: that stays queued.
func (p *leasePool) sendOnce(ctx context.Context) (more bool, err error) {
	if err := p.redeliverOnce(ctx); err != nil {
		return false, err
	}
	p.mu.Lock()
	items := p.pending
	more = len(items) > maxReleaseItems
	if more {
		items, p.pending = items[:maxReleaseItems:maxReleaseItems], items[maxReleaseItems:]
	} else {
		p.pending = nil
	}
	p.mu.Unlock()
	if len(items) == 0 {
		return false, nil
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	resp, err := p.client.ReleaseBatch(rctx, connect.NewRequest(&weirv1.ReleaseBatchRequest{Items: items}))
	cancel()
	if err != nil {
		p.mu.Lock()
		for _, it := range items {
			if it.Keep {
				// Not settled in time: the control plane may let the lease
				// expire meanwhile, so it is not reused here.
				p.forgetLeaseLocked(it.LeaseId)
			}
		}
		if undelivered(err) {
			// Sent again (success records are idempotent: each sets the
			// account's last success and clears its failure counts).
			p.pending = append(items, p.pending...)
			if n := len(p.pending) - maxPendingItems; n > 0 {
				p.pending = slices.Delete(p.pending, 0, n)
				p.metrics.reportsDropped.WithLabelValues("success").Add(float64(n))
			}
			p.mu.Unlock()
			return false, err
		}
		p.mu.Unlock()
		p.log.Warn("release batch refused", "items", len(items), "err", err)
		return more, nil
	}
	if missing := resp.Msg.MissingLeaseIds; len(missing) > 0 {
		p.mu.Lock()
		for _, id := range missing {
			p.forgetLeaseLocked(id)
		}
		p.mu.Unlock()
	}
	return more, nil
}

// redeliverOnce sends the Releases the control plane has not answered,
// oldest first, each dated by how long ago its attempt ended. It stops at
// the first the control plane still does not take.
func (p *leasePool) redeliverOnce(ctx context.Context) error {
	for {
		p.mu.Lock()
		if len(p.redeliver) == 0 {
			p.mu.Unlock()
			return nil
		}
		r := p.redeliver[0]
		p.mu.Unlock()
		req := proto.CloneOf(r.req)
		req.Outcome.Delay = durationpb.New(time.Since(r.ended))
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, err := p.client.Release(rctx, connect.NewRequest(req))
		cancel()
		if err != nil && undelivered(err) {
			return err
		}
		if err != nil && connect.CodeOf(err) != connect.CodeNotFound {
			// NotFound: an earlier try was applied, or the lease was reaped.
			p.log.Warn("redelivered release refused", "lease_id", req.LeaseId, "err", err)
		}
		p.mu.Lock()
		if len(p.redeliver) > 0 && p.redeliver[0].req == r.req {
			p.redeliver = p.redeliver[1:]
		}
		p.metrics.redelivered.WithLabelValues("release").Inc()
		p.mu.Unlock()
	}
}

// forgetLeaseLocked stops reusing a lease the control plane may no longer
// hold.
func (p *leasePool) forgetLeaseLocked(id string) {
	w := p.reusable[id]
	if w == nil {
		return
	}
	delete(p.reusable, id)
	stack := p.idle[w.class]
	for i, x := range stack {
		if x == w {
			p.setIdleLocked(w.class, append(stack[:i:i], stack[i+1:]...))
			break
		}
	}
}

// watch keeps the WatchPool stream open, reconnecting with backoff.
func (p *leasePool) watch(ctx context.Context) {
	defer p.done.Done()
	wait := 50 * time.Millisecond
	for ctx.Err() == nil {
		ok := p.watchOnce(ctx)
		p.notReady()
		if ok {
			wait = 50 * time.Millisecond
		}
		if !sleepCtx(ctx, wait) {
			return
		}
		wait = backoff.Next(wait, 0, 5*time.Second)
	}
}

// watchOnce reads one stream until it ends; true if it was ever ready.
func (p *leasePool) watchOnce(ctx context.Context) bool {
	stream, err := p.client.WatchPool(ctx, connect.NewRequest(&weirv1.WatchPoolRequest{}))
	if err != nil {
		return false
	}
	defer stream.Close() //nolint:errcheck // the stream is over either way
	ready := false
	for stream.Receive() {
		ev := stream.Msg()
		ready = ready || ev.Ready
		p.invalidate(ev)
	}
	if err := stream.Err(); err != nil && ctx.Err() == nil {
		p.log.Warn("pool watch ended; reusing no lease until it is back", "err", err)
	}
	return ready
}

// close returns every idle lease and sends what is queued.
func (p *leasePool) close() {
	p.mu.Lock()
	p.closed = true
	p.pokeAllLocked()
	for cls, q := range p.queued {
		for _, ch := range q {
			ch <- struct{}{}
		}
		delete(p.queued, cls)
	}
	p.ready = false
	p.dropAllLocked()
	p.mu.Unlock()
	p.stop()
	p.done.Wait()
}
