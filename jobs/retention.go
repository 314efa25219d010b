package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/notify"
)

// RetentionInterval is how often the time-partitioned tables (route
// events, account history, the usage rollup) have their partitions made
// ahead and dropped past retention (partitions.go), and refusal counts
// older than the route_events_retention setting and notification events
// older than notify.Retention are deleted.
const RetentionInterval = 10 * time.Minute

// retentionBatch bounds one delete statement, and retentionBatches one
// run: a run deletes at most a million rows of each table in statements
// that each hold their locks for a moment, and a backlog larger than
// that (a retention just shortened) goes over the next runs. Only the
// tables that stay unpartitioned are deleted from row by row.
const (
	retentionBatch   = 5000
	retentionBatches = 200
)

// RetentionArgs is the periodic job that keeps the partitions and deletes
// old refusal counts and notification events.
type RetentionArgs struct{}

// Kind names the job in River's tables and UI.
func (RetentionArgs) Kind() string { return "route_retention" }

// InsertOpts keeps one run queued at a time.
func (RetentionArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: RetentionInterval}}
}

// RetentionWorker runs RetentionArgs.
type RetentionWorker struct {
	river.WorkerDefaults[RetentionArgs]
	deps Deps
}

// Work maintains the partitions and deletes what is older than the
// retention.
func (w *RetentionWorker) Work(ctx context.Context, _ *river.Job[RetentionArgs]) error {
	if _, err := MaintainPartitions(ctx, w.deps); err != nil {
		return err
	}
	if _, err := EnforceRetention(ctx, w.deps); err != nil {
		return err
	}
	if err := EnforceUsageRetention(ctx, w.deps); err != nil {
		return err
	}
	_, err := EnforceNotifyRetention(ctx, w.deps)
	return err
}

// EnforceUsageRetention deletes the budgets' spend rows not touched since
// now less the usage_retention setting (the usage rollup itself goes by
// whole partitions, MaintainPartitions).
func EnforceUsageRetention(ctx context.Context, d Deps) error {
	if d.UsageRetention == nil {
		return nil
	}
	keep, err := d.UsageRetention(ctx)
	if err != nil {
		return fmt.Errorf("usage retention: read the setting: %w", err)
	}
	if _, err := d.Queries.DeleteBudgetSpendBefore(ctx, d.Now().Add(-keep)); err != nil {
		return fmt.Errorf("usage retention: budget spend: %w", err)
	}
	return nil
}

// EnforceNotifyRetention deletes notification events raised before now
// less notify.Retention, with their deliveries, in batches as
// EnforceRetention does; an event with a delivery still being tried
// (pending, and attempted within the retention) stays until it ends. It
// returns how many events went.
func EnforceNotifyRetention(ctx context.Context, d Deps) (int64, error) {
	return enforceNotifyRetention(ctx, d, retentionBatch, retentionBatches)
}

func enforceNotifyRetention(ctx context.Context, d Deps, batch int32, batches int) (int64, error) {
	before := d.Now().Add(-notify.Retention)
	n, err := inBatches(batch, batches, func() (int64, error) {
		return d.Queries.DeleteNotifyEventsBefore(ctx, db.DeleteNotifyEventsBeforeParams{Before: before, Batch: batch})
	})
	if err != nil {
		return n, fmt.Errorf("retention: notification events: %w", err)
	}
	if n > 0 {
		d.Logger.InfoContext(ctx, "notification events past their retention deleted", "events", n, "retention", notify.Retention)
	}
	return n, nil
}

// EnforceRetention deletes refusal counts of intervals begun before now
// less the route_events_retention setting, in batches of retentionBatch
// rows, at most retentionBatches a run; it returns how many went. Route
// events and account history, partitioned, go by whole partitions
// (MaintainPartitions).
func EnforceRetention(ctx context.Context, d Deps) (refusals int64, err error) {
	return enforceRetention(ctx, d, retentionBatch, retentionBatches)
}

// inBatches runs del (one batch of deletes) until a batch comes back short
// or batches ran, and returns how many rows it deleted.
func inBatches(batch int32, batches int, del func() (int64, error)) (int64, error) {
	var total int64
	for range batches {
		n, err := del()
		if err != nil {
			return total, err
		}
		if total += n; n < int64(batch) {
			break
		}
	}
	return total, nil
}

func enforceRetention(ctx context.Context, d Deps, batch int32, batches int) (refusals int64, err error) {
	keep, err := d.Retention(ctx)
	if err != nil {
		return 0, fmt.Errorf("retention: read the setting: %w", err)
	}
	before := d.Now().Add(-keep)
	refusals, err = inBatches(batch, batches, func() (int64, error) {
		return d.Queries.DeleteRefusalCountsBefore(ctx, db.DeleteRefusalCountsBeforeParams{Before: before, Batch: batch})
	})
	if err != nil {
		return refusals, fmt.Errorf("retention: refusal counts: %w", err)
	}
	if refusals > 0 {
		d.Logger.InfoContext(ctx, "refusal counts past their retention deleted", "refusal_counts", refusals, "retention", keep)
	}
	return refusals, nil
}
