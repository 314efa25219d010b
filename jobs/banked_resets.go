package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"
)

// BankedResetter applies banked resets: for each account that enabled
// them, it replays a pending claim or claims a grant when the account is
// at its weekly limit or a grant is about to expire. The control plane
// implements it; jobs cannot import the control plane.
type BankedResetter interface {
	// ApplyBankedResets looks at every enabled account once and says how
	// many claims it sent.
	ApplyBankedResets(ctx context.Context) (int, error)
}

// BankedResetInterval is the applier's tick.
const BankedResetInterval = 60 * time.Second

// BankedResetArgs is the periodic job that applies banked resets.
type BankedResetArgs struct{}

// Kind names the job in River's tables and UI.
func (BankedResetArgs) Kind() string { return "banked_resets" }

// InsertOpts keeps one applier run queued at a time.
func (BankedResetArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: BankedResetInterval}}
}

// BankedResetWorker runs BankedResetArgs.
type BankedResetWorker struct {
	river.WorkerDefaults[BankedResetArgs]
	deps Deps
}

// Work runs one tick of the applier.
func (w *BankedResetWorker) Work(ctx context.Context, _ *river.Job[BankedResetArgs]) error {
	n, err := w.deps.Banked.ApplyBankedResets(ctx)
	if n > 0 {
		w.deps.Logger.InfoContext(ctx, "reset grants claimed", "claims", n)
	}
	if err != nil {
		return fmt.Errorf("apply banked resets: %w", err)
	}
	return nil
}
