package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"
)

// UsageReader reads the usage endpoints of the accounts that are due a
// read, within the control plane's read budget. The control plane
// implements it; jobs cannot import the control plane.
type UsageReader interface {
	// ReadDue reads every account whose next read has come, and says how
	// many it read.
	ReadDue(ctx context.Context) (int, error)
}

// UsagePollInterval is how often the poller looks for accounts due a read.
// Each account's own cadence (about 90 s busy, 10 min idle, never two reads
// within 150 s) lives in the control plane and the database.
const UsagePollInterval = 15 * time.Second

// UsagePollArgs is the periodic job that reads due accounts' usage.
type UsagePollArgs struct{}

// Kind names the job in River's tables and UI.
func (UsagePollArgs) Kind() string { return "usage_poll" }

// InsertOpts keeps one poll queued at a time.
func (UsagePollArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: UsagePollInterval}}
}

// UsagePoller runs UsagePollArgs.
type UsagePoller struct {
	river.WorkerDefaults[UsagePollArgs]
	deps Deps
}

// Work reads the due accounts. A failed read is the reader's to record and
// back off; an error here means the poll itself failed.
func (w *UsagePoller) Work(ctx context.Context, _ *river.Job[UsagePollArgs]) error {
	n, err := w.deps.Usage.ReadDue(ctx)
	if err != nil {
		return fmt.Errorf("poll usage: %w", err)
	}
	if n > 0 {
		w.deps.Logger.DebugContext(ctx, "usage read", "accounts", n)
	}
	return nil
}
