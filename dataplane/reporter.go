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
	queue   chan *weirv1.RouteEvent
	done    chan struct{}
}

func newReporter(client weirv1connect.LeaseServiceClient, log *slog.Logger, dropped func()) *reporter {
	r := &reporter{client: client, log: log, dropped: dropped, queue: make(chan *weirv1.RouteEvent, 4096), done: make(chan struct{})}
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

func (r *reporter) run() {
	defer close(r.done)
	for ev := range r.queue {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := r.client.ReportRoute(ctx, connect.NewRequest(&weirv1.ReportRouteRequest{Event: ev}))
		cancel()
		if err != nil {
			r.log.Warn("report route failed", "request_id", ev.RequestId, "err", err)
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
