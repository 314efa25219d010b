package controlplane

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/upstream"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/jobs"
)

// A new account (or a new credential) is checked at once, not at its
// first request: a River job enqueued in the transaction that stores it
// (enqueueCheck) makes one cheap authenticated read, off the RPC's path.
// An OAuth subscription's read is its usage read (readUsage, within its
// budget); an API key's is the models list, claimed from the same budget.

// errCredentialUnreadable: this replica's keys do not open the sealed
// credential (credcheck.go marks such accounts).
var errCredentialUnreadable = errors.New("credential unreadable under this secret key")

// checkVerdict is what one check's read says of the credential.
type checkVerdict int

const (
	checkUndecided checkVerdict = iota
	checkGood
	checkRejected
)

// judgeCheck decides a check from its read's error: none is good; a 401
// is the credential refused, as on a request; anything else (the provider
// unreachable or failing, a 403 a token's scope may explain) decides
// nothing.
func judgeCheck(readErr error) checkVerdict {
	var se *upstream.StatusError
	switch {
	case readErr == nil:
		return checkGood
	case errors.As(readErr, &se) && se.Rejected():
		return checkRejected
	}
	return checkUndecided
}

// accountCheck is r's check as operators see it.
func accountCheck(r db.Account) (weirv1.AccountCheck, string) {
	switch {
	case r.BrokenAt != nil:
		return weirv1.AccountCheck_ACCOUNT_CHECK_BROKEN, deref(r.BrokenReason)
	case r.CheckState == enumName(weirv1.AccountCheck_ACCOUNT_CHECK_GOOD):
		return weirv1.AccountCheck_ACCOUNT_CHECK_GOOD, ""
	}
	return weirv1.AccountCheck_ACCOUNT_CHECK_UNVERIFIED, deref(r.CheckNote)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// enqueueCheck enqueues the check of account id's credential at revision
// in tx: it runs once the account is committed, on whichever replica works
// jobs.
func (j *AccountJobs) enqueueCheck(ctx context.Context, tx pgx.Tx, id uuid.UUID, revision int64) error {
	if _, err := j.jobsOut.InsertTx(ctx, tx, jobs.AccountCheckArgs{AccountID: id, Revision: revision}, nil); err != nil {
		return fmt.Errorf("enqueue account check: %w", err)
	}
	return nil
}

// CheckAccount is jobs.AccountChecker: it checks the account's credential
// at revision once, and records the verdict. A rejected credential breaks
// the account at once (RecordAuthFailure at a threshold of one: nothing
// depends on a new credential yet, and re-entering it clears the mark).
func (j *AccountJobs) CheckAccount(ctx context.Context, id uuid.UUID, revision int64) (time.Time, error) {
	acct, err := j.q.GetAccount(ctx, id)
	if errors.Is(storeErr(err), ErrNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, err
	}
	if acct.CredentialRevision != revision || acct.BrokenAt != nil || acct.CheckState == enumName(weirv1.AccountCheck_ACCOUNT_CHECK_GOOD) {
		return time.Time{}, nil // another credential's check, or nothing left to learn
	}
	readErr, next, err := j.checkRead(ctx, acct)
	if err != nil {
		return time.Time{}, err
	}
	if !next.IsZero() {
		return next, j.noteCheck(ctx, acct, "waiting for the usage read budget")
	}
	switch judgeCheck(readErr) {
	case checkGood:
		_, err := j.q.RecordCheckGood(ctx, db.RecordCheckGoodParams{ID: id, CredentialRevision: revision, Now: j.now()})
		return time.Time{}, err
	case checkRejected:
		r, err := j.q.RecordAuthFailure(ctx, db.RecordAuthFailureParams{
			ID: id, CredentialRevision: revision, Threshold: 1, Now: j.now(),
			Reason: "credential rejected by the upstream (checked when added: " + readErr.Error() + ")",
		})
		if errors.Is(storeErr(err), ErrNotFound) {
			return time.Time{}, nil // replaced meanwhile
		}
		if err == nil && r.Broken {
			j.log.WarnContext(ctx, "account broken", "account_id", id, "by", "check", "err", readErr)
		}
		return time.Time{}, err
	}
	if err := j.noteCheck(ctx, acct, readErr.Error()); err != nil {
		return time.Time{}, err
	}
	if errors.Is(readErr, errCredentialUnreadable) {
		return time.Time{}, nil // credcheck.go's to mark; asking again opens nothing
	}
	return time.Time{}, fmt.Errorf("check account %s: %w", id, readErr)
}

func (j *AccountJobs) noteCheck(ctx context.Context, acct db.Account, note string) error {
	_, err := j.q.RecordCheckNote(ctx, db.RecordCheckNoteParams{ID: acct.ID, CredentialRevision: acct.CredentialRevision, Note: note})
	return err
}

// checkRead makes the check's read, within the usage read budget: the
// read's error (no secret in it), or when the budget allows it when it
// does not now; err is the database's.
func (j *AccountJobs) checkRead(ctx context.Context, acct db.Account) (readErr error, next time.Time, err error) {
	if acct.AuthKind == enumName(weirv1.AuthKind_AUTH_KIND_OAUTH) {
		res, err := j.readUsage(ctx, acct.ID)
		if err != nil {
			return nil, time.Time{}, err
		}
		if !res.read {
			return nil, res.nextAllowed, nil
		}
		return res.failure, time.Time{}, nil
	}
	now := j.now()
	_, err = j.q.ClaimUsageRead(ctx, db.ClaimUsageReadParams{AccountID: acct.ID, CredentialRevision: acct.CredentialRevision, Now: now})
	if errors.Is(err, pgx.ErrNoRows) {
		at, err := j.q.UsageReadAllowedAt(ctx, db.UsageReadAllowedAtParams{AccountID: acct.ID, Now: now})
		return nil, at, storeErr(err)
	}
	if err != nil {
		return nil, time.Time{}, err
	}
	key, err := j.seal.Open(acct.ID, acct.CredentialRevision, acct.CredentialSealed)
	if err != nil {
		return errCredentialUnreadable, time.Time{}, nil
	}
	client, release, err := j.clientFor(ctx, j.egress.usage, j.cfg.UsageClient, acct)
	if err != nil {
		return err, time.Time{}, nil
	}
	defer release()
	base := accountBaseURL(acct.Provider, acct.BaseUrl)
	return upstream.ReadModels(ctx, client, base, key, acct.Provider == providerAnthropic), time.Time{}, nil
}
