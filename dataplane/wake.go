package dataplane

import (
	"context"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// A held request must not sleep out its backoff when the answer that held
// it has changed. The lease pool keeps one change signal: a context
// cancelled (and replaced) by whatever may make a refused request
// servable:
//
//   - every WatchPool event (a breaker closing, a cooldown lifted, an
//     account resumed or added, a key or alias changed) and the stream
//     becoming ready again;
//   - the control plane answering again after calls to it went
//     undelivered (it was down, hung, or its Postgres was): while it does
//     not answer, one loop per worker asks it every recoverEvery, so that
//     the worker notices its return within that, not at the end of every
//     held request's backoff.
//
// A hold waits on it as well as on its timer (Server.sleep).

// recoverEvery is how often a worker asks a control plane that does not
// answer whether it is back (one cheap call, WorkerSettings, which reads
// Postgres too); recoverTimeout bounds one such call, so that a hung
// control plane is asked again.
const (
	recoverEvery   = 250 * time.Millisecond
	recoverTimeout = time.Second
)

// changes returns the current change signal: its Done closes at the next
// change.
// It is read without p.mu: every request reads it once.
func (p *leasePool) changes() context.Context {
	return *p.changed.Load()
}

// changedLocked signals a change to every waiting hold.
func (p *leasePool) changedLocked() {
	p.changedCancel()
	ctx, cancel := context.WithCancel(context.Background())
	p.changed.Store(&ctx)
	p.changedCancel = cancel
}

// observe takes note of a call's error: an undelivered one marks the
// control plane unreachable (and starts the loop that notices its
// return); an answer, even a refusal, marks it back.
func (p *leasePool) observe(ctx context.Context, err error) {
	if err != nil && ctx.Err() != nil {
		return // the caller left; that says nothing of the control plane
	}
	down := err != nil && undelivered(err)
	if !down && !p.down.Load() {
		return // the common case, without p.mu
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case down && !p.down.Load() && !p.closed:
		p.down.Store(true)
		p.done.Add(1)
		go p.recoverLoop()
	case !down && p.down.Load():
		p.down.Store(false)
		p.changedLocked()
	}
}

// recoverLoop asks the control plane every recoverEvery until it answers.
func (p *leasePool) recoverLoop() {
	defer p.done.Done()
	for {
		p.mu.Lock()
		down, closed, ctx := p.down.Load(), p.closed, p.life
		p.mu.Unlock()
		if !down || closed || !sleepCtx(ctx, recoverEvery) {
			return
		}
		// The observed client marks the control plane back when it answers.
		cctx, cancel := context.WithTimeout(ctx, recoverTimeout)
		p.client.WorkerSettings(cctx, connect.NewRequest(&weirv1.WorkerSettingsRequest{})) //nolint:errcheck // observed
		cancel()
	}
}

// observedClient is the lease service as the pool calls it: each call's
// result tells the pool whether the control plane answers.
type observedClient struct {
	weirv1connect.LeaseServiceClient
	p *leasePool
}

func (c observedClient) Acquire(ctx context.Context, req *connect.Request[weirv1.AcquireRequest]) (*connect.Response[weirv1.AcquireResponse], error) {
	resp, err := c.LeaseServiceClient.Acquire(ctx, req)
	c.p.observe(ctx, err)
	return resp, err
}

func (c observedClient) Release(ctx context.Context, req *connect.Request[weirv1.ReleaseRequest]) (*connect.Response[weirv1.ReleaseResponse], error) {
	resp, err := c.LeaseServiceClient.Release(ctx, req)
	c.p.observe(ctx, err)
	return resp, err
}

func (c observedClient) ReleaseBatch(ctx context.Context, req *connect.Request[weirv1.ReleaseBatchRequest]) (*connect.Response[weirv1.ReleaseBatchResponse], error) {
	resp, err := c.LeaseServiceClient.ReleaseBatch(ctx, req)
	c.p.observe(ctx, err)
	return resp, err
}

func (c observedClient) WorkerSettings(ctx context.Context, req *connect.Request[weirv1.WorkerSettingsRequest]) (*connect.Response[weirv1.WorkerSettingsResponse], error) {
	resp, err := c.LeaseServiceClient.WorkerSettings(ctx, req)
	c.p.observe(ctx, err)
	return resp, err
}

// probeServed settles a breaker probe whose answer started: a success
// kept on the lease (the stream goes on), sent with the next batch. The
// control plane closes the family's breaker on it, and the notification
// wakes every held request.
func (p *leasePool) probeServed(lease *weirv1.Lease) {
	p.settle.put(&weirv1.ReleaseItem{LeaseId: lease.Id, Keep: true,
		Outcome: &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200}})
}
