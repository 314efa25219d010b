package dataplane

import (
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Every request is recorded once, under the id its client got, even when
// this worker dies while serving it. A request that reaches routing is
// registered here; one still in progress at the reporter's next batch
// goes in it as a pending event (RouteEvent.pending), which the keeper
// then keeps open with its lease renewals. The request's final event
// replaces it. If this worker dies, nobody renews it, and the control
// plane's reaper closes it as "worker_lost" (0021_lease_clock.sql). A
// request over before the next batch has only its final event: the cost
// is one more row write for a request that outlives a report interval,
// nothing for one that does not. On a quiet worker too: the nudge that
// a request registered sends the next batch within a report interval,
// not at once (outbox.awaitDue).
type pendingRequests struct {
	mu sync.Mutex
	m  map[string]*pendingRequest
	// fresh are the registered requests not yet reported, oldest first
	// (some may have ended since): a batch takes from it without scanning
	// every request in progress.
	fresh []*pendingRequest
	// nudge wakes the reporter when a request registers, so that it is
	// recorded within a report interval even when nothing else is sent.
	nudge chan struct{}
}

type pendingRequest struct {
	ev       *weirv1.RouteEvent
	reported bool
	// queued: in fresh, not yet taken by a batch; queuedAt is when it was
	// queued last.
	queued   bool
	queuedAt time.Time
}

// heldReportEvery is how often at most a held request's pending event is
// reported again while its hold goes on and its reason stays the same: a
// long hold is seen as it goes on without a write per backoff step.
const heldReportEvery = 2 * time.Second

func newPendingRequests() *pendingRequests {
	return &pendingRequests{m: map[string]*pendingRequest{}, nudge: make(chan struct{}, 1)}
}

// begin registers the request rec describes; what rec holds now (key,
// surface, model, stream, session, start) is what its pending event says.
func (p *pendingRequests) begin(rec *weirv1.RouteEvent) {
	ev := &weirv1.RouteEvent{RequestId: rec.RequestId, KeyId: rec.KeyId, Surface: rec.Surface, Model: rec.Model,
		Stream: rec.Stream, SessionKey: rec.SessionKey, StartedAt: rec.StartedAt, Pending: true}
	r := &pendingRequest{ev: ev, queued: true}
	p.mu.Lock()
	p.m[rec.RequestId] = r
	p.fresh = append(p.fresh, r)
	p.mu.Unlock()
	select {
	case p.nudge <- struct{}{}:
	default:
	}
}

// held records that the request rec describes is held now: its pending
// event becomes a snapshot of rec (the attempts so far) with since, why
// and next, the hold's state, and goes out again with the next batch: at
// once when the reason changed or the hold state is new, else at most
// every heldReportEvery. With since zero the request is no longer held:
// the state is cleared, and reported at once if it had been.
func (p *pendingRequests) held(rec *weirv1.RouteEvent, since, next time.Time, why string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.m[rec.RequestId]
	if r == nil {
		return
	}
	was := r.ev
	if since.IsZero() && was.HeldSince == nil {
		return
	}
	ev := proto.CloneOf(rec)
	ev.Pending, ev.Status, ev.Duration, ev.Verdict = true, 0, nil, ""
	if !since.IsZero() {
		ev.HeldSince, ev.NextTryAt, ev.HoldReason = timestamppb.New(since), timestamppb.New(next), why
	}
	r.ev = ev
	changed := (was.HeldSince == nil) != (ev.HeldSince == nil) || was.HoldReason != ev.HoldReason
	if r.queued || (!changed && now.Sub(r.queuedAt) < heldReportEvery) {
		return
	}
	r.queued, r.queuedAt = true, now
	p.fresh = append(p.fresh, r)
	select {
	case p.nudge <- struct{}{}:
	default:
	}
}

// end forgets the request: its final event is about to be reported.
func (p *pendingRequests) end(id string) {
	p.mu.Lock()
	delete(p.m, id)
	p.mu.Unlock()
}

// due returns up to n pending events of requests not yet reported, and
// marks them reported.
func (p *pendingRequests) due(n int) []*weirv1.RouteEvent {
	if n <= 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*weirv1.RouteEvent
	taken := 0
	for _, r := range p.fresh {
		if len(out) == n {
			break
		}
		taken++
		r.queued = false
		if p.m[r.ev.RequestId] == r { // still in progress
			r.reported = true
			out = append(out, r.ev)
		}
	}
	p.fresh = append(p.fresh[:0], p.fresh[taken:]...)
	return out
}

// reported returns the ids of the requests whose pending events were
// sent: the keeper keeps them open.
func (p *pendingRequests) reported() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.m))
	for id, r := range p.m {
		if r.reported {
			out = append(out, id)
		}
	}
	return out
}
