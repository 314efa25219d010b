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
// a report interval, as pending events (pending.go), and the refusal
// counts of the intervals that are over (refusals.go), each stored once
// too (a count is the worker's whole count for its interval).
type reporter struct {
	out *outbox[reportItem]
}

// reportItem is a route event or a refusal count.
type reportItem struct {
	ev      *weirv1.RouteEvent
	refusal *weirv1.RefusalCount
}

// maxReportBatch is how many items one ReportRoutes call carries at most
// (the control plane takes up to 500 events and 500 refusal counts);
// maxQueuedEvents bounds the outbox.
const (
	maxReportBatch  = 256
	maxQueuedEvents = 4096
)

func newReporter(client weirv1connect.LeaseServiceClient, pending *pendingRequests, log *slog.Logger, pace time.Duration, dropped func(n int), redelivered func(), taken func(requestIDs []string)) *reporter {
	send := func(ctx context.Context, batch []reportItem) error {
		req := &weirv1.ReportRoutesRequest{}
		for _, it := range batch {
			if it.ev != nil {
				req.Events = append(req.Events, it.ev)
			} else {
				req.Refusals = append(req.Refusals, it.refusal)
			}
		}
		if _, err := client.ReportRoutes(ctx, connect.NewRequest(req)); err != nil {
			return err
		}
		// The control plane stored them: their spend is counted there now.
		ids := make([]string, 0, len(req.Events))
		for _, ev := range req.Events {
			if !ev.GetPending() {
				ids = append(ids, ev.GetRequestId())
			}
		}
		taken(ids)
		return nil
	}
	due := func(n int) []reportItem {
		evs := pending.due(n)
		items := make([]reportItem, len(evs))
		for i, ev := range evs {
			items[i].ev = ev
		}
		return items
	}
	out := &outbox[reportItem]{what: "route events", log: log, send: send, due: due, nudge: pending.nudge,
		dropped: dropped, redelivered: redelivered, batch: maxReportBatch, limit: maxQueuedEvents, pace: pace}
	return &reporter{out: out.start()}
}

func (r *reporter) report(ev *weirv1.RouteEvent) {
	r.out.put(reportItem{ev: ev})
}

// reportNow sends ev without waiting for the report pace: a budgeted
// key's spend counts in every worker's next Acquire once it is stored.
func (r *reporter) reportNow(ev *weirv1.RouteEvent) {
	r.out.putNow(reportItem{ev: ev})
}

// reportRefusals queues refusal counts.
func (r *reporter) reportRefusals(counts ...*weirv1.RefusalCount) {
	items := make([]reportItem, len(counts))
	for i, c := range counts {
		items[i].refusal = c
	}
	r.out.put(items...)
}

// close sends what is queued, waiting until ctx ends.
func (r *reporter) close(ctx context.Context) {
	r.out.close(ctx)
}
