// Package jobs holds the control plane's River workers and their periodic
// schedule. The jobs run inside control-plane processes; River elects one
// leader to enqueue periodic jobs, so replicas do not multiply them.
package jobs

import (
	"context"
	"log/slog"
	"time"

	"github.com/riverqueue/river"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/notify"
)

// Deps is what the workers need from the control plane.
type Deps struct {
	Queries *db.Queries
	Logger  *slog.Logger
	// Now is the clock for every time written or compared.
	Now func() time.Time
	// LeaseGrace keeps expired lease rows this long so a late Release can
	// still report its outcome. Expired leases never count toward caps.
	LeaseGrace time.Duration
	// LeaseTTL is how long a lease lives without renewal; the reaper
	// moves the lease clock with it before it reaps.
	LeaseTTL time.Duration
	// SessionTTL is how long an idle session binding is kept.
	SessionTTL time.Duration
	// Usage reads the usage endpoints that are due; nil leaves usage
	// polling out.
	Usage UsageReader
	// Tokens refreshes expiring OAuth credentials; nil leaves token
	// refresh out.
	Tokens TokenRefresher
	// Banked applies banked resets; nil leaves the applier out.
	Banked BankedResetter
	// Creds checks that sealed credentials open with the current
	// key, for the integrity check; nil leaves that check out.
	Creds CredentialChecker
	// Retention reads how long route events and refusal counts are kept
	// (the route_events_retention setting); nil leaves the retention job
	// out.
	Retention func(ctx context.Context) (time.Duration, error)
	// UsageRetention reads how long the hourly usage rollup is kept (the
	// usage_retention setting); nil keeps it forever.
	UsageRetention func(ctx context.Context) (time.Duration, error)
	// Notify delivers notifications and runs their watch; nil leaves both
	// out.
	Notify Notifications
	// NotifyRetry is the wait after a failed delivery's attempt; nil is
	// notify.RetryDelay.
	NotifyRetry func(attempt int) time.Duration
	// Checks checks new credentials; nil leaves the check out.
	Checks AccountChecker
	// Findings counts the integrity check's findings (a metrics hook:
	// kind, repaired|reported, how many); nil counts nothing.
	Findings func(kind, action string, n int)
}

// ReapInterval is how often expired leases and idle sessions are deleted.
const ReapInterval = 30 * time.Second

// Register adds every worker to workers and returns the periodic jobs.
func Register(workers *river.Workers, d Deps) []*river.PeriodicJob {
	river.AddWorker(workers, &LeaseReaper{deps: d})
	river.AddWorker(workers, &UsageSnapshotter{deps: d})
	river.AddWorker(workers, &IntegrityChecker{deps: d})
	periodic := []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(ReapInterval),
			func() (river.JobArgs, *river.InsertOpts) { return LeaseReaperArgs{}, nil },
			&river.PeriodicJobOpts{RunOnStart: true}),
		river.NewPeriodicJob(river.PeriodicInterval(UsageSnapshotInterval),
			func() (river.JobArgs, *river.InsertOpts) { return UsageSnapshotArgs{}, nil }, nil),
		river.NewPeriodicJob(river.PeriodicInterval(IntegrityInterval),
			func() (river.JobArgs, *river.InsertOpts) { return IntegrityArgs{}, nil }, nil),
	}
	if d.Usage != nil {
		river.AddWorker(workers, &UsagePoller{deps: d})
		// On start too: a restart picks up the persisted schedule at once.
		periodic = append(periodic, river.NewPeriodicJob(river.PeriodicInterval(UsagePollInterval),
			func() (river.JobArgs, *river.InsertOpts) { return UsagePollArgs{}, nil },
			&river.PeriodicJobOpts{RunOnStart: true}))
	}
	if d.Checks != nil {
		river.AddWorker(workers, &AccountCheckWorker{deps: d})
	}
	if d.Banked != nil {
		river.AddWorker(workers, &BankedResetWorker{deps: d})
		periodic = append(periodic, river.NewPeriodicJob(river.PeriodicInterval(BankedResetInterval),
			func() (river.JobArgs, *river.InsertOpts) { return BankedResetArgs{}, nil }, nil))
	}
	if d.Retention != nil {
		river.AddWorker(workers, &RetentionWorker{deps: d})
		periodic = append(periodic, river.NewPeriodicJob(river.PeriodicInterval(RetentionInterval),
			func() (river.JobArgs, *river.InsertOpts) { return RetentionArgs{}, nil },
			&river.PeriodicJobOpts{RunOnStart: true}))
	}
	if d.Notify != nil {
		river.AddWorker(workers, &NotifyDeliveryWorker{deps: d})
		river.AddWorker(workers, &NotifyWatchWorker{deps: d})
		// On start too: a transition while no replica ran is told at once.
		periodic = append(periodic, river.NewPeriodicJob(river.PeriodicInterval(notify.WatchInterval),
			func() (river.JobArgs, *river.InsertOpts) { return NotifyWatchArgs{}, nil },
			&river.PeriodicJobOpts{RunOnStart: true}))
	}
	if d.Tokens != nil {
		river.AddWorker(workers, &TokenRefreshWorker{deps: d})
		// On start too: a token may have expired while no replica ran.
		periodic = append(periodic, river.NewPeriodicJob(river.PeriodicInterval(TokenRefreshInterval),
			func() (river.JobArgs, *river.InsertOpts) { return TokenRefreshArgs{}, nil },
			&river.PeriodicJobOpts{RunOnStart: true}))
	}
	return periodic
}

// Kinds names every job kind Register may add: the bounded label set of
// the control plane's job metrics.
func Kinds() []string {
	return []string{
		LeaseReaperArgs{}.Kind(), UsageSnapshotArgs{}.Kind(), IntegrityArgs{}.Kind(),
		UsagePollArgs{}.Kind(), BankedResetArgs{}.Kind(), TokenRefreshArgs{}.Kind(), RetentionArgs{}.Kind(),
		notify.DeliveryArgs{}.Kind(), NotifyWatchArgs{}.Kind(), AccountCheckArgs{}.Kind(),
	}
}
