package dataplane

import (
	"context"
	"log/slog"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// reporter sends route events to the control plane off the request path,
// in ReportRoutes batches (one call, one transaction), through an outbox:
// a full outbox drops (and counts) events rather than slow a client, and
// a batch the control plane did not take is sent again; it stores each
// request's event once however often it arrives (its request id is its
// identity). Each batch also carries the requests still in progress after
// a report interval, as pending events (pending.go).
type reporter struct {
	out *outbox[*weirv1.RouteEvent]
}

// maxReportBatch is how many events one ReportRoutes call carries at most
// (the control plane takes up to 500); maxQueuedEvents bounds the outbox.
const (
	maxReportBatch  = 256
	maxQueuedEvents = 4096
)

func newReporter(client weirv1connect.LeaseServiceClient, pending *pendingRequests, log *slog.Logger, pace time.Duration, dropped func(n int), redelivered func()) *reporter {
	send := func(ctx context.Context, batch []*weirv1.RouteEvent) error {
		_, err := client.ReportRoutes(ctx, connect.NewRequest(&weirv1.ReportRoutesRequest{Events: batch}))
		return err
	}
	out := &outbox[*weirv1.RouteEvent]{what: "route events", log: log, send: send, due: pending.due, nudge: pending.nudge,
		dropped: dropped, redelivered: redelivered, batch: maxReportBatch, limit: maxQueuedEvents, pace: pace}
	return &reporter{out: out.start()}
}

func (r *reporter) report(ev *weirv1.RouteEvent) {
	r.out.put(ev)
}

// close sends what is queued, waiting until ctx ends.
func (r *reporter) close(ctx context.Context) {
	r.out.close(ctx)
}
