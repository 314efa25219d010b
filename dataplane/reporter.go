package dataplane

import (
	"context"
	"log/slog"
	"slices"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/backoff"
)

// reporter sends route events to the control plane off the request path.
// A full queue drops (and counts) events rather than slow a client.
type reporter struct {
	client weirv1connect.LeaseServiceClient
	// pending are the requests in progress: each goes in the next batch as
	// a pending event (pending.go).
	pending *pendingRequests
	log     *slog.Logger
	dropped func()
	// pace is the least time between two calls' starts.
	pace  time.Duration
	queue chan *weirv1.RouteEvent
	// redelivered counts a batch taken after failed tries.
	redelivered func()
	// closing ends a wait to send again: the worker is shutting down.
	closing chan struct{}
	done    chan struct{}
}

func newReporter(client weirv1connect.LeaseServiceClient, pending *pendingRequests, log *slog.Logger, pace time.Duration, dropped, redelivered func()) *reporter {
	r := &reporter{client: client, pending: pending, log: log, dropped: dropped, redelivered: redelivered, pace: pace,
		queue: make(chan *weirv1.RouteEvent, 4096), closing: make(chan struct{}), done: make(chan struct{})}
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
//
// A batch the control plane did not take (unreachable, or its database
// down) is sent again, with what queued meanwhile, after a pause that grows
// while the outage lasts; the control plane stores each request's event
// once however often it arrives (its request id is its identity). Events
// queue meanwhile up to the queue's bound, past which they are dropped and
// counted.
func (r *reporter) run() {
	defer close(r.done)
	var (
		last  time.Time
		full  bool
		batch []*weirv1.RouteEvent
		wait  time.Duration
		// drained: the queue is closed and empty; closing: the worker is
		// shutting down, so a failed call is not tried again.
		drained, closing bool
	)
	for !drained || len(batch) > 0 {
		if len(batch) == 0 {
			var first *weirv1.RouteEvent
			select {
			case ev, ok := <-r.queue:
				if !ok {
					return
				}
				first = ev
			case <-r.pending.nudge:
			}
			if !full {
				// Never cut short: what is queued meanwhile goes in this call.
				sleepCtx(context.Background(), time.Until(last.Add(r.pace)))
			}
			// A fresh slice per call: nothing the last call was given is
			// written to while its request may still be in flight.
			batch = make([]*weirv1.RouteEvent, 0, 16)
			if first != nil {
				batch = append(batch, first)
			}
		}
	drain:
		for len(batch) < maxReportBatch && !drained {
			select {
			case ev, ok := <-r.queue:
				if !ok {
					drained, closing = true, true
					break drain
				}
				batch = append(batch, ev)
			default:
				break drain
			}
		}
		if !drained {
			// The requests still in progress after a report interval.
			batch = append(batch, r.pending.due(maxReportBatch-len(batch))...)
		}
		if len(batch) == 0 {
			continue // they ended meanwhile: their final events are queued
		}
		full = len(batch) == maxReportBatch
		last = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := r.client.ReportRoutes(ctx, connect.NewRequest(&weirv1.ReportRoutesRequest{Events: batch}))
		cancel()
		switch {
		case err == nil:
			if wait > 0 {
				r.redelivered()
			}
			batch, wait = nil, 0
		case !undelivered(err) || closing:
			// Refused, or the worker is closing and the control plane is
			// still away: these events are lost, and logged.
			r.log.Warn("report routes failed", "events", len(batch), "first_request_id", batch[0].RequestId, "err", err)
			batch, wait = nil, 0
		default:
			wait = backoff.Next(wait, 100*time.Millisecond, 5*time.Second)
			r.log.Warn("report routes failed; sending them again", "events", len(batch), "in", wait, "err", err)
			select {
			case <-time.After(wait):
			case <-r.closing:
				closing = true
			}
			// A fresh slice: the failed call's request may still hold it.
			batch = slices.Clone(batch)
		}
	}
}

// close sends what is queued, waiting until ctx ends.
func (r *reporter) close(ctx context.Context) {
	close(r.closing)
	close(r.queue)
	select {
	case <-r.done:
	case <-ctx.Done():
	}
}
