package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"
)

// TokenRefresher refreshes the OAuth credentials about to expire. The
// control plane implements it (single-flight across replicas, a
// compare-and-set on the credential revision); jobs cannot import the
// control plane.
type TokenRefresher interface {
	// RefreshDue refreshes every credential that is due, and says how many
	// it refreshed.
	RefreshDue(ctx context.Context) (int, error)
}

// TokenRefreshInterval is how often the refresher looks for credentials
// about to expire. Which are due (expiring within 10 minutes) and the
// backoff after a failure live in the control plane and the database.
const TokenRefreshInterval = 60 * time.Second

// TokenRefreshArgs is the periodic job that refreshes expiring OAuth
// credentials.
type TokenRefreshArgs struct{}

// Kind names the job in River's tables and UI.
func (TokenRefreshArgs) Kind() string { return "token_refresh" }

// InsertOpts keeps one refresh run queued at a time.
func (TokenRefreshArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByArgs: true, ByPeriod: TokenRefreshInterval}}
}

// TokenRefreshWorker runs TokenRefreshArgs.
type TokenRefreshWorker struct {
	river.WorkerDefaults[TokenRefreshArgs]
	deps Deps
}

// Work refreshes the due credentials. A refresh the token endpoint failed
// or rejected is the refresher's to record; an error here means the run
// itself failed.
func (w *TokenRefreshWorker) Work(ctx context.Context, _ *river.Job[TokenRefreshArgs]) error {
	n, err := w.deps.Tokens.RefreshDue(ctx)
	if err != nil {
		return fmt.Errorf("refresh tokens: %w", err)
	}
	if n > 0 {
		w.deps.Logger.DebugContext(ctx, "tokens refreshed", "accounts", n)
	}
	return nil
}
