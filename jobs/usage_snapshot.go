package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"
)

const (
	// UsageSnapshotInterval is how often the usage view is copied into its
	// history.
	UsageSnapshotInterval = 2 * time.Minute
	// UsageSnapshotRetention is how long the history is kept.
	UsageSnapshotRetention = 14 * 24 * time.Hour
)

// UsageSnapshotArgs is the periodic job that records the usage view's
// history and trims it.
type UsageSnapshotArgs struct{}

// Kind names the job in River's tables and UI.
func (UsageSnapshotArgs) Kind() string { return "usage_snapshot" }

// InsertOpts keeps one snapshot queued at a time.
func (UsageSnapshotArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: UsageSnapshotInterval}}
}

// UsageSnapshotter runs UsageSnapshotArgs.
type UsageSnapshotter struct {
	river.WorkerDefaults[UsageSnapshotArgs]
	deps Deps
}

// Work copies every current usage window into usage_snapshots and deletes
// snapshots older than the retention, so the history stays bounded.
func (w *UsageSnapshotter) Work(ctx context.Context, _ *river.Job[UsageSnapshotArgs]) error {
	now := w.deps.Now()
	taken, err := w.deps.Queries.SnapshotUsage(ctx, now)
	if err != nil {
		return fmt.Errorf("snapshot usage: %w", err)
	}
	trimmed, err := w.deps.Queries.DeleteUsageSnapshotsBefore(ctx, now.Add(-UsageSnapshotRetention))
	if err != nil {
		return fmt.Errorf("trim usage snapshots: %w", err)
	}
	if trimmed > 0 {
		w.deps.Logger.InfoContext(ctx, "usage snapshots trimmed", "rows", trimmed, "taken", taken)
	}
	return nil
}
