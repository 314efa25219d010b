package jobs

import (
	"context"
	"fmt"

	"github.com/riverqueue/river"

	"github.com/weirhq/weir/controlplane/db"
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

// Work deletes what no longer matters. Expired leases already stopped
// counting at their expiry; one reaped here was never released, and leaves
// a "worker_lost" route event.
func (w *LeaseReaper) Work(ctx context.Context, _ *river.Job[LeaseReaperArgs]) error {
	now := w.deps.Now()
	// After an outage, leases still in use are renewed first (the lease
	// clock, 0021_lease_clock.sql): none is reaped for the outage alone.
	if ttl := w.deps.LeaseTTL; ttl > 0 {
		if _, err := w.deps.Queries.TickLeaseClock(ctx, db.TickLeaseClockParams{Now: now,
			GapSeconds: (ttl / 3).Seconds(), TtlSeconds: ttl.Seconds()}); err != nil {
			return fmt.Errorf("reap leases: lease clock: %w", err)
		}
	}
	leases, err := w.deps.Queries.DeleteLeasesExpiredBefore(ctx, db.DeleteLeasesExpiredBeforeParams{Before: now.Add(-w.deps.LeaseGrace), Now: now})
	if err != nil {
		return fmt.Errorf("reap leases: %w", err)
	}
	sessions, err := w.deps.Queries.DeleteSessionsIdleSince(ctx, now.Add(-w.deps.SessionTTL))
	if err != nil {
		return fmt.Errorf("reap sessions: %w", err)
	}
	if leases > 0 || sessions > 0 {
		w.deps.Logger.InfoContext(ctx, "reaped", "leases", leases, "sessions", sessions)
	}
	return nil
}
