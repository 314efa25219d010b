package dataplane

import (
	"context"
	"log/slog"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// reporter sends route events to the control plane off the request path.
// A full queue drops (and counts) events rather than slow a client.
type reporter struct {
	client  weirv1connect.LeaseServiceClient
	log     *slog.Logger
	dropped func()
	// pace is the least time between two calls' starts.
	pace  time.Duration
	queue chan *weirv1.RouteEvent
	done  chan struct{}
}

func newReporter(client weirv1connect.LeaseServiceClient, log *slog.Logger, pace time.Duration, dropped func()) *reporter {
	r := &reporter{client: client, log: log, dropped: dropped, pace: pace, queue: make(chan *weirv1.RouteEvent, 4096), done: make(chan struct{})}
	go r.run()
	return r
}

func (r *reporter) report(ev *weirv1.RouteEvent) {
	select {
	case r.queue <- ev:
	default:
		r.dropped()
	}
}

// maxReportBatch is how many events one ReportRoutes call carries at most
// (the control plane takes up to 500).
const maxReportBatch = 256

// run sends events in batches: whatever is queued when a call can go, up
// to maxReportBatch, in one call and one transaction. A call goes at most
// once per pace (unless the last one was full): under load a batch fills
// meanwhile; after a quiet spell an event goes alone and at once.
func (r *reporter) run() {
	defer close(r.done)
	var last time.Time
	full := false
	for ev := range r.queue {
		if !full {
			// Never cut short: what is queued meanwhile goes in this call.
			sleepCtx(context.Background(), time.Until(last.Add(r.pace)))
		}
		// A fresh slice per call: nothing the last call was given is
		// written to while its request may still be in flight.
		batch := append(make([]*weirv1.RouteEvent, 0, 16), ev)
	drain:
		for len(batch) < maxReportBatch {
			select {
			case ev, ok := <-r.queue:
				if !ok {
					break drain
				}
				batch = append(batch, ev)
			default:
				break drain
			}
		}
		full = len(batch) == maxReportBatch
		last = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := r.client.ReportRoutes(ctx, connect.NewRequest(&weirv1.ReportRoutesRequest{Events: batch}))
		cancel()
		if err != nil {
			r.log.Warn("report routes failed", "events", len(batch), "first_request_id", batch[0].RequestId, "err", err)
		}
	}
}

// close sends what is queued, waiting until ctx ends.
func (r *reporter) close(ctx context.Context) {
	close(r.queue)
	select {
	case <-r.done:
	case <-ctx.Done():
	}
}
