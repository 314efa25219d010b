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
	// start is what the pending event says until the request is held:
	// the few fields it needs, not an event of its own, so that a request
	// in progress costs a few words here (an event is some 350 bytes); a
	// batch builds the event when it takes it.
	start pendingStart
	// ev is the held request's snapshot (held); nil before any hold.
	ev       *weirv1.RouteEvent
	reported bool
	// queued: in fresh, not yet taken by a batch; queuedAt is when it was
	// queued last.
	queued   bool
	queuedAt time.Time
}

// pendingStart is what a request's pending event says before any hold:
// what its record held when it reached routing. The strings share the
// record's; startedAt is the record's own, never written again.
type pendingStart struct {
	requestID, keyID, surface, model, session string
	stream                                    bool
	startedAt                                 *timestamppb.Timestamp
}

// event is the request's pending event as a batch sends it.
func (r *pendingRequest) event() *weirv1.RouteEvent {
	if r.ev != nil {
		return r.ev
	}
	st := r.start
	return &weirv1.RouteEvent{RequestId: st.requestID, KeyId: st.keyID, Surface: st.surface, Model: st.model,
		Stream: st.stream, SessionKey: st.session, StartedAt: st.startedAt, Pending: true}
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
	r := &pendingRequest{start: pendingStart{requestID: rec.RequestId, keyID: rec.KeyId, surface: rec.Surface,
		model: rec.Model, session: rec.SessionKey, stream: rec.Stream, startedAt: rec.StartedAt}, queued: true}
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
	wasHeld, wasWhy := r.ev.GetHeldSince() != nil, r.ev.GetHoldReason()
	if since.IsZero() && !wasHeld {
		return
	}
	ev := proto.CloneOf(rec)
	ev.Pending, ev.Status, ev.Duration, ev.Verdict = true, 0, nil, ""
	if !since.IsZero() {
		ev.HeldSince, ev.NextTryAt, ev.HoldReason = timestamppb.New(since), timestamppb.New(next), why
	}
	r.ev = ev
	changed := wasHeld != (ev.HeldSince != nil) || wasWhy != ev.HoldReason
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
		if p.m[r.start.requestID] == r { // still in progress
			r.reported = true
			out = append(out, r.event())
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
