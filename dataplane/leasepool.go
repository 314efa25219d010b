package dataplane

import (
	"context"
	"log/slog"
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
//   - Reuse (reuseCache). A lease the control plane granted with
//     reuse_until serves further requests of the same key, surface and
//     model after a success, until that deadline. The lease row stays in
//     Postgres the whole time, so every account's concurrency cap still
//     holds across workers: a reused lease is one slot, used by one
//     request at a time.
//   - Invalidation. The control plane's WatchPool stream, fed by Postgres
//     notifications, names every account whose routing state changes (a
//     cooldown, a gate, a pause, a usage threshold crossed) and the
//     pool-wide changes (a breaker, a key, an alias). The pool drops what
//     it names at once; while the stream is not ready nothing is reused.
//   - Batching (outbox). Successes are settled through ReleaseBatch off
//     the request path; failures still go through Release, synchronously,
//     because the control plane's decision (fail over, retry, answer) is
//     needed now.
//
// What cannot be reused goes through the class gate (classGate): a
// bounded number of Acquires per class, and held requests sharing one
// Acquire and its "no account" answer.
type leasePool struct {
	client  weirv1connect.LeaseServiceClient
	log     *slog.Logger
	now     func() time.Time
	metrics *metrics
	// idleFor is how long a reusable lease may sit unused before it is
	// returned: an idle worker must not keep slots other workers could use.
	idleFor time.Duration
	// sweepWake restarts sweepLoop's ticks (wakeSweep) once sweepPaused
	// says they stopped.
	sweepWake   chan struct{}
	sweepPaused atomic.Bool
	// forgetKeys is called when a client key changed.
	forgetKeys func()

	cache *reuseCache
	gate  *classGate
	// settle sends the ReleaseBatch items: successes, and the leases the
	// pool gives back. releases holds the Releases the control plane did
	// not answer (it was unreachable) and sends them again, oldest first,
	// until they are answered. A Release is applied once: the first to
	// arrive ends the lease, a repeat finds none (NotFound).
	settle   *outbox[*weirv1.ReleaseItem]
	releases *outbox[redelivery]

	// mu guards what the pool itself keeps: closed, prefetching and the
	// change signal's transitions (the parts have locks of their own).
	mu     sync.Mutex
	closed bool
	// prefetching counts each class's prefetches in flight.
	prefetching map[leaseClass]int

	// changed is the change signal that wakes held requests (wake.go);
	// down says calls to the control plane go undelivered.
	changed       atomic.Pointer[context.Context]
	changedCancel context.CancelFunc // under mu
	down          atomic.Bool        // written under mu

	// life ends when the pool closes.
	life context.Context
	stop context.CancelFunc
	done sync.WaitGroup
}

// maxReleaseItems matches the control plane's limit per ReleaseBatch call.
const maxReleaseItems = 10000

// A redelivery is a Release to send again, and when its attempt ended (on
// the monotonic clock), so that the control plane can date its evidence.
type redelivery struct {
	req   *weirv1.ReleaseRequest
	ended time.Time
}

// The outboxes' bounds: past them the oldest reports are dropped (and
// counted). A worker cut off from its control plane for long keeps a few
// MiB, not everything.
const (
	maxRedeliveries = 10000
	maxPendingItems = 5 * maxReleaseItems
)

// newLeasePool starts a pool; pace is the least time between two
// ReleaseBatch sends, sleep waits d or until ctx ends (Config.Sleep).
func newLeasePool(client weirv1connect.LeaseServiceClient, log *slog.Logger, now func() time.Time,
	sleep func(context.Context, time.Duration) bool, m *metrics, idleFor, pace time.Duration, forgetKeys func()) *leasePool {
	ctx, cancel := context.WithCancel(context.Background())
	p := &leasePool{
		client: client, log: log, now: now, metrics: m, idleFor: idleFor, forgetKeys: forgetKeys,
		cache: newReuseCache(now), prefetching: map[leaseClass]int{}, life: ctx, stop: cancel,
	}
	p.gate = newClassGate(now, sleep, func(what string) { m.leasePool.WithLabelValues(what).Inc() })
	p.sweepWake = make(chan struct{}, 1)
	p.cache.idled, p.gate.made = p.wakeSweep, p.wakeSweep
	p.client = observedClient{LeaseServiceClient: client, p: p}
	p.settle = (&outbox[*weirv1.ReleaseItem]{what: "successes", log: log, send: p.settleBatch,
		dropped: func(n int) { m.reportsDropped.WithLabelValues("success").Add(float64(n)) },
		batch:   maxReleaseItems, limit: maxPendingItems, pace: pace}).start()
	p.releases = (&outbox[redelivery]{what: "releases", log: log, send: p.redeliver,
		dropped: func(n int) { m.reportsDropped.WithLabelValues("release").Add(float64(n)) },
		batch:   1, limit: maxRedeliveries, pace: pace}).start()
	changed, changedCancel := context.WithCancel(context.Background())
	p.changed.Store(&changed)
	p.changedCancel = changedCancel
	p.done.Add(1)
	go p.sweepLoop(ctx)
	if idleFor > 0 {
		p.done.Add(1)
		go p.watch(ctx)
	}
	return p
}

// acquire leases an account for req, from the pool when it can; held and
// holdEnd are as in gateRequest. parked is how long the request waited
// with its class's other held requests.
func (p *leasePool) acquire(ctx context.Context, req *weirv1.AcquireRequest, held bool, holdEnd time.Time) (_ *weirv1.AcquireResponse, parked time.Duration, err error) {
	cls := leaseClass{keyHash: req.KeyHash, surface: req.Surface, model: req.Model, sessioned: req.SessionKey != ""}
	call := func(ctx context.Context, why string, since time.Time) (*weirv1.AcquireResponse, error) {
		p.metrics.leasePool.WithLabelValues(why).Inc()
		gen := p.cache.version()
		ask := req
		if !since.IsZero() && (req.WaitingSince == nil || since.Before(req.WaitingSince.AsTime())) {
			// A parked class's leader asks in its longest waiter's turn.
			ask = proto.CloneOf(req)
			ask.WaitingSince = timestamppb.New(since)
		}
		resp, err := p.client.Acquire(ctx, connect.NewRequest(ask))
		if err != nil {
			return nil, err
		}
		// A retry's lease is not reused, nor a breaker's probe that a
		// parked class's leader got for itself.
		if lease := resp.Msg.GetLease(); lease != nil && why != askRetry && (why != askForAll || !lease.Probe) {
			p.cache.granted(cls, req.SessionKey, lease, gen)
		}
		return resp.Msg, nil
	}
	if req.Unreported != nil {
		// A budgeted key's request asks on its own: its answer (a session
		// over its cap) is not its class's to share, and no lease of it
		// is reused.
		resp, err := call(ctx, askFirst, time.Time{})
		return resp, 0, err
	}
	if len(req.ExcludeAccountIds) > 0 || req.PreferAccountId != "" {
		resp, err := p.gate.retry(ctx, cls, call)
		return resp, 0, err
	}
	for {
		if w, want := p.cache.take(cls, req.SessionKey); w != nil {
			p.metrics.leasePool.WithLabelValues("reused").Inc()
			switch want {
			case refillRenew:
				w.renewed = p.prefetch(cls, maxAsking)
			case refillSpare:
				p.prefetch(cls, spares)
			}
			return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_Lease{Lease: w.lease}}, parked, nil
		}
		var since time.Time
		if req.WaitingSince != nil {
			since = req.WaitingSince.AsTime()
		}
		resp, waited, err := p.gate.ask(ctx, gateRequest{class: cls, held: held, holdEnd: holdEnd, since: since, limit: p.cache.isReady(),
			cameBack: func() bool { return p.cache.has(cls, req.SessionKey) }}, call)
		parked += waited
		if resp != nil || err != nil {
			return resp, parked, err
		}
		// A lease may have come back, or the class is served again.
	}
}

// prefetch asks, off any request's path, for a fresh lease of a class
// whose busy lease is near its reuse deadline (when it lapses the class's
// next request finds the fresh one instead of asking and waiting) or
// whose last idle lease was just taken while it is busy (a spare). At
// most limit at a time per class.
func (p *leasePool) prefetch(cls leaseClass, limit int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.prefetching[cls] >= limit || p.closed || !p.cache.isReady() {
		return false
	}
	p.prefetching[cls]++
	req := &weirv1.AcquireRequest{KeyHash: cls.keyHash, Model: cls.model, Surface: cls.surface, RequestId: newRequestID()}
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		p.metrics.leasePool.WithLabelValues("prefetch").Inc()
		gen := p.cache.version()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := p.client.Acquire(ctx, connect.NewRequest(req))
		cancel()
		p.mu.Lock()
		if p.prefetching[cls]--; p.prefetching[cls] <= 0 {
			delete(p.prefetching, cls)
		}
		closed := p.closed
		p.mu.Unlock()
		if err != nil || resp.Msg.GetLease() == nil {
			return // no account now: the class's requests will ask themselves
		}
		lease := resp.Msg.GetLease()
		if closed || !p.cache.grantIdle(cls, lease, gen) {
			p.settle.put(&weirv1.ReleaseItem{LeaseId: lease.Id})
			return
		}
		p.gate.leaseBack(cls)
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
		kept := &weirv1.ReleaseItem{LeaseId: lease.Id, Outcome: o, AdmittedAt: timestamppb.New(admitted), SessionKey: session, Keep: true}
		if cls, ok := p.cache.putBack(lease.Id, func() { p.settle.put(kept) }); ok {
			p.gate.leaseBack(cls)
			return &weirv1.Decision{Action: weirv1.Action_ACTION_RESPOND}, nil
		}
		return p.releaseNow(ctx, &weirv1.ReleaseRequest{LeaseId: lease.Id, Outcome: o})
	}
	p.cache.forget(lease.Id)
	if o.Class != weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR {
		// The account may be cooling from now on: stop reusing it here
		// without waiting for the notification.
		p.giveBack(p.cache.dropAccount(lease.AccountId))
	}
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
		p.releases.put(redelivery{req: req, ended: ended})
	}
	return nil, err
}

// giveBack releases idle leases the pool dropped, in a batch that does
// not wait for the pace: each holds a slot of its account's cap that
// another worker may be waiting for.
func (p *leasePool) giveBack(ids []string) {
	if len(ids) == 0 {
		return
	}
	items := make([]*weirv1.ReleaseItem, len(ids))
	for i, id := range ids {
		items[i] = &weirv1.ReleaseItem{LeaseId: id}
	}
	p.settle.putNow(items...)
}

// settleBatch sends one ReleaseBatch. A lease kept on a success that was
// not settled (in time, or at all) is not reused here: the control plane
// may let it expire meanwhile.
func (p *leasePool) settleBatch(ctx context.Context, items []*weirv1.ReleaseItem) error {
	resp, err := p.client.ReleaseBatch(ctx, connect.NewRequest(&weirv1.ReleaseBatchRequest{Items: items}))
	if err != nil {
		for _, it := range items {
			if it.Keep {
				p.cache.forget(it.LeaseId)
			}
		}
		return err
	}
	for _, id := range resp.Msg.MissingLeaseIds {
		p.cache.forget(id)
	}
	return nil
}

// redeliver sends again the Releases the control plane has not answered
// (batches of one), each dated by how long ago its attempt ended.
func (p *leasePool) redeliver(ctx context.Context, batch []redelivery) error {
	for _, r := range batch {
		req := proto.CloneOf(r.req)
		req.Outcome.Delay = durationpb.New(time.Since(r.ended))
		_, err := p.client.Release(ctx, connect.NewRequest(req))
		if err != nil && undelivered(err) {
			return err
		}
		if err != nil && connect.CodeOf(err) != connect.CodeNotFound {
			// NotFound: an earlier try was applied, or the lease was reaped.
			p.log.Warn("redelivered release refused", "lease_id", req.LeaseId, "err", err)
		}
		p.metrics.redelivered.WithLabelValues("release").Inc()
	}
	return nil
}

// invalidate applies one WatchPool event.
func (p *leasePool) invalidate(ev *weirv1.WatchPoolResponse) {
	if ev.Ready {
		p.cache.setReady()
		p.metrics.poolReady.Set(1)
	}
	if ev.All || ev.Keys {
		p.giveBack(p.cache.dropAll())
		p.metrics.poolEvents.WithLabelValues("all").Inc()
	}
	p.giveBack(p.cache.dropAccounts(ev.AccountIds))
	p.metrics.poolEvents.WithLabelValues("account").Add(float64(len(ev.AccountIds)))
	if ev.Keys && p.forgetKeys != nil {
		p.forgetKeys()
	}
	p.gate.invalidate()
	p.mu.Lock()
	p.changedLocked()
	p.mu.Unlock()
}

// notReady stops reuse until the stream is ready again: what changed in
// between is unknown, so nothing held may be trusted.
func (p *leasePool) notReady() {
	p.giveBack(p.cache.stop())
	p.metrics.poolReady.Set(0)
	p.gate.invalidate()
}

// sweepLoop sweeps the cache and the gate every period, and stops
// ticking while both are empty (an idle worker does not wake twenty
// times a second for nothing) until either has something again
// (wakeSweep).
func (p *leasePool) sweepLoop(ctx context.Context) {
	defer p.done.Done()
	period := 100 * time.Millisecond
	if p.idleFor > 0 {
		period = max(min(p.idleFor/2, time.Second), 10*time.Millisecond)
	}
	t := time.NewTicker(period)
	defer t.Stop()
	tick := t.C
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.sweepWake:
			if tick == nil {
				t.Reset(period)
				tick = t.C
			}
		case <-tick:
			p.giveBack(p.cache.sweep(p.idleFor))
			p.gate.sweep()
			// Paused before looking, so that what is put meanwhile
			// either is seen here or wakes the loop.
			p.sweepPaused.Store(true)
			if p.cache.empty() && p.gate.empty() {
				t.Stop()
				tick = nil
			} else {
				p.sweepPaused.Store(false)
			}
		}
	}
}

// wakeSweep tells a paused sweepLoop that the cache or the gate has
// something to sweep; a ticking one is left alone, so that a busy worker's
// requests do not wake it one by one. It never blocks (the caller may hold
// their lock).
func (p *leasePool) wakeSweep() {
	if !p.sweepPaused.CompareAndSwap(true, false) {
		return
	}
	select {
	case p.sweepWake <- struct{}{}:
	default:
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
	p.mu.Unlock()
	p.gate.close()
	p.giveBack(p.cache.stop())
	p.stop()
	p.done.Wait()
	// A lease that went idle as the pool closed (the last event read, a
	// request ending) goes back too.
	p.giveBack(p.cache.stop())
	p.releases.close(context.Background())
	p.settle.close(context.Background())
}
