package dataplane

import (
	"sync"

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
// nothing for one that does not.
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
}

func newPendingRequests() *pendingRequests {
	return &pendingRequests{m: map[string]*pendingRequest{}, nudge: make(chan struct{}, 1)}
}

// begin registers the request rec describes; what rec holds now (key,
// surface, model, stream, start) is what its pending event says.
func (p *pendingRequests) begin(rec *weirv1.RouteEvent) {
	ev := &weirv1.RouteEvent{RequestId: rec.RequestId, KeyId: rec.KeyId, Surface: rec.Surface, Model: rec.Model,
		Stream: rec.Stream, StartedAt: rec.StartedAt, Pending: true}
	r := &pendingRequest{ev: ev}
	p.mu.Lock()
	p.m[rec.RequestId] = r
	p.fresh = append(p.fresh, r)
	p.mu.Unlock()
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
