package jobs

import (
	"context"
	"time"

	"github.com/riverqueue/river"

	"github.com/weirhq/weir/controlplane/notify"
)

// Notifications delivers notifications and runs their watch; the control
// plane implements it (controlplane/notify.go).
type Notifications interface {
	// DeliverNotification makes attempt (1-based) at one delivery, recording its
	// outcome; last says no attempt follows. It returns nil when the
	// delivery is done (delivered, or gone with its target), else the
	// attempt's failure, one line without the target's URL.
	DeliverNotification(ctx context.Context, delivery int64, attempt int, last bool) error
	// WatchNotifications compares the pool with the last notified state once and
	// raises an event per transition (notify.Evaluate).
	WatchNotifications(ctx context.Context) error
}

// NotifyDeliveryWorker works a delivery's job: one attempt per run, River
// retrying a failure after NextRetry, notify.MaxAttempts in all.
type NotifyDeliveryWorker struct {
	river.WorkerDefaults[notify.DeliveryArgs]
	deps Deps
}

// Work makes one attempt.
func (w *NotifyDeliveryWorker) Work(ctx context.Context, job *river.Job[notify.DeliveryArgs]) error {
	return w.deps.Notify.DeliverNotification(ctx, job.Args.DeliveryID, job.Attempt, job.Attempt >= job.MaxAttempts)
}

// NextRetry is notify.RetryDelay after the failed attempt (River's clock:
// the real one).
func (w *NotifyDeliveryWorker) NextRetry(job *river.Job[notify.DeliveryArgs]) time.Time {
	retry := w.deps.NotifyRetry
	if retry == nil {
		retry = notify.RetryDelay
	}
	return time.Now().Add(retry(job.Attempt))
}

// Timeout leaves the attempt its notify.Timeout and the writes around it.
func (w *NotifyDeliveryWorker) Timeout(*river.Job[notify.DeliveryArgs]) time.Duration {
	return notify.Timeout + 20*time.Second
}

// NotifyWatchArgs is the periodic job running the notification watch.
type NotifyWatchArgs struct{}

// Kind names the job in River's tables and UI.
func (NotifyWatchArgs) Kind() string { return "notify_watch" }

// InsertOpts keeps one run queued at a time.
func (NotifyWatchArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: notify.WatchInterval}}
}

// NotifyWatchWorker runs NotifyWatchArgs.
type NotifyWatchWorker struct {
	river.WorkerDefaults[NotifyWatchArgs]
	deps Deps
}

// Work runs the watch once.
func (w *NotifyWatchWorker) Work(ctx context.Context, _ *river.Job[NotifyWatchArgs]) error {
	return w.deps.Notify.WatchNotifications(ctx)
}
