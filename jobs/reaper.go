package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"
)

// LeaseReaperArgs is the periodic job that deletes long-expired leases and
// idle session bindings.
type LeaseReaperArgs struct{}

// Kind names the job in River's tables and UI.
func (LeaseReaperArgs) Kind() string { return "lease_reaper" }

// InsertOpts keeps one reaper queued at a time.
func (LeaseReaperArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: ReapInterval}}
}

// LeaseReaper runs LeaseReaperArgs.
type LeaseReaper struct {
	river.WorkerDefaults[LeaseReaperArgs]
	deps Deps
}

// staleWaiter is how long after a held request last asked its place in
// the queue of waiters is deleted.
const staleWaiter = time.Minute

// Work deletes what no longer matters and records what was lost.
// Expired leases already stopped counting at their expiry; one reaped
// here was never released. The requests of a worker that died are closed
// here as "worker_lost": each left a pending route event its worker no
// longer renews (0021_lease_clock.sql).
func (w *LeaseReaper) Work(ctx context.Context, _ *river.Job[LeaseReaperArgs]) error {
	now := w.deps.Now()
	// After an outage, leases and pending events still in use are renewed
	// first (the lease clock): none is reaped or closed for the outage
	// alone.
	if _, err := MoveLeaseClock(ctx, w.deps.Queries, now, w.deps.LeaseTTL); err != nil {
		return fmt.Errorf("reap leases: lease clock: %w", err)
	}
	lost, err := w.deps.Queries.CloseLostRequests(ctx, now)
	if err != nil {
		return fmt.Errorf("close lost requests: %w", err)
	}
	leases, err := w.deps.Queries.DeleteLeasesExpiredBefore(ctx, now.Add(-w.deps.LeaseGrace))
	if err != nil {
		return fmt.Errorf("reap leases: %w", err)
	}
	sessions, err := w.deps.Queries.DeleteSessionsIdleSince(ctx, now.Add(-w.deps.SessionTTL))
	if err != nil {
		return fmt.Errorf("reap sessions: %w", err)
	}
	// Routing already ignores a waiter that stopped asking; its row goes
	// once it is well past that.
	waiters, err := w.deps.Queries.DeleteStaleWaiters(ctx, now.Add(-staleWaiter))
	if err != nil {
		return fmt.Errorf("reap waiters: %w", err)
	}
	if leases > 0 || sessions > 0 || lost > 0 || waiters > 0 {
		w.deps.Logger.InfoContext(ctx, "reaped", "leases", leases, "sessions", sessions, "lost_requests", lost, "waiters", waiters)
	}
	return nil
}
