package jobs

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/riverqueue/river"
)

// AccountChecker checks a new credential with one cheap authenticated read
// (controlplane/accountcheck.go); the control plane implements it.
type AccountChecker interface {
	// CheckAccount checks the account's credential at revision. It
	// returns a zero time when the check is done (decided, or moot: the
	// account gone or its credential replaced), else when the read budget
	// allows it next; an error is a check to try again.
	CheckAccount(ctx context.Context, id uuid.UUID, revision int64) (time.Time, error)
}

// AccountCheckArgs checks one account's credential, enqueued in the
// transaction that created the account or replaced its credential.
type AccountCheckArgs struct {
	AccountID uuid.UUID `json:"account_id"`
	Revision  int64     `json:"revision"`
}

// Kind names the job in River's tables and UI.
func (AccountCheckArgs) Kind() string { return "account_check" }

// InsertOpts: a provider that does not answer is asked again a few times
// (River's backoff: seconds, then minutes), no longer; the account stays
// unverified and its first request decides.
func (AccountCheckArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: 6}
}

// AccountCheckWorker runs AccountCheckArgs.
type AccountCheckWorker struct {
	river.WorkerDefaults[AccountCheckArgs]
	deps Deps
}

// Work checks once; a read the budget does not allow yet waits for it.
func (w *AccountCheckWorker) Work(ctx context.Context, job *river.Job[AccountCheckArgs]) error {
	next, err := w.deps.Checks.CheckAccount(ctx, job.Args.AccountID, job.Args.Revision)
	if err != nil {
		return err
	}
	if !next.IsZero() {
		return river.JobSnooze(max(time.Second, next.Sub(w.deps.Now())))
	}
	return nil
}
