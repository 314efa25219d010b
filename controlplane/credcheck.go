package controlplane

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/seal"
	"github.com/weirhq/weir/jobs"
)

// Every replica checks the stored credentials with its own keys, at
// start-up and every credentialCheckInterval: the integrity job runs on
// one replica only, so a replica holding the wrong key is never examined
// by it. The rule:
//
//   - Not one stored credential opens: this replica's WEIR_SECRET_KEY is
//     not the key they were sealed with. It refuses to start (a
//     *WrongKeyError); a running replica (the pool re-sealed under a key
//     it lacks) marks nothing and logs the error.
//   - Some open and others do not: this replica's keys are right, so the
//     others were sealed under a key it lacks (retired too early, or
//     another deployment's), or are corrupted. Each is marked broken with
//     unreadableReason, at the revision read, and no replica routes it
//     until its credential is re-entered (a new revision clears the mark)
//     or some replica opens it.
//   - A credential so marked that this replica opens: the replica that
//     marked it lacked a key this one has (a rolling key change). The mark
//     is cleared, at the revision opened.
//
// A replica with a wrong key therefore never marks anything: it does not
// run. Acquire follows the same rule (leaseService.acquireModel).

// credentialCheckInterval is how often a running replica checks again.
const credentialCheckInterval = 5 * time.Minute

// unreadableReason is the broken reason of an account whose credential
// opens with none of a replica's keys. It starts with the integrity
// finding's kind, which MendCredentialsReadable and the integrity report
// look for.
const unreadableReason = jobs.FindingUnreadableCredential + ": the sealed credential opens with none of a control plane's secret keys" +
	" (sealed under a key it lacks, or corrupted); re-enter it, or add the key that sealed it to WEIR_SECRET_KEY_PREVIOUS and run 'weir secrets rotate'"

// WrongKeyError is a replica whose keys open not one of the stored
// credentials. It names the current key by its id only.
type WrongKeyError struct {
	// Accounts is how many accounts hold a sealed credential.
	Accounts int
	// KeyID is the current key's id (KeyID).
	KeyID string
}

func (e *WrongKeyError) Error() string {
	return fmt.Sprintf("WEIR_SECRET_KEY (key id %s) is not the key these credentials were sealed with: "+
		"none of the %d stored account credential(s) opens with it or with WEIR_SECRET_KEY_PREVIOUS; "+
		"set the key that sealed them as WEIR_SECRET_KEY, or add it to WEIR_SECRET_KEY_PREVIOUS and run 'weir secrets rotate'",
		e.KeyID, e.Accounts)
}

// settleCredentials applies the rule once: it marks what this replica
// cannot open and mends what it can, or returns a *WrongKeyError when it
// opens nothing. It logs labels only.
func (j *AccountJobs) settleCredentials(ctx context.Context) error {
	c, err := j.openSealed(ctx)
	if err != nil {
		return err
	}
	if len(c.opened) == 0 && len(c.unreadable) > 0 {
		return &WrongKeyError{Accounts: len(c.unreadable), KeyID: seal.KeyID(j.cfg.SecretKey)}
	}
	if len(c.unreadable) > 0 {
		j.log.WarnContext(ctx, "credentials this control plane cannot open", "kind", jobs.FindingUnreadableCredential,
			"count", len(c.unreadable), "accounts", labels(c.unreadable))
		if err := j.markUnreadable(ctx, c.unreadable); err != nil {
			return err
		}
	}
	if len(c.opened) == 0 {
		return nil
	}
	ids, revisions := refColumns(c.opened)
	mended, err := j.q.MendCredentialsReadable(ctx, db.MendCredentialsReadableParams{
		Kind: jobs.FindingUnreadableCredential, Ids: ids, Revisions: revisions,
	})
	if err != nil {
		return fmt.Errorf("mend readable credentials: %w", err)
	}
	if len(mended) > 0 {
		j.log.InfoContext(ctx, "accounts mended: this control plane opens their credential", "accounts", mended)
	}
	return nil
}

// markUnreadable marks refs broken with unreadableReason, each at its
// revision, unless it is broken already.
func (j *AccountJobs) markUnreadable(ctx context.Context, refs []sealedRef) error {
	ids, revisions := refColumns(refs)
	marked, err := j.q.MarkCredentialsUnreadable(ctx, db.MarkCredentialsUnreadableParams{
		Now: j.now(), Reason: unreadableReason, Ids: ids, Revisions: revisions,
	})
	if err != nil {
		return fmt.Errorf("mark unreadable credentials: %w", err)
	}
	if len(marked) > 0 {
		j.log.WarnContext(ctx, "accounts marked broken", "reason", jobs.FindingUnreadableCredential, "accounts", marked)
	}
	return nil
}

// opens says whether this replica's keys open r's credential.
func (j *AccountJobs) opens(r db.Account) bool {
	_, err := j.seal.Open(r.ID, r.CredentialRevision, r.CredentialSealed)
	return err == nil
}

func refColumns(refs []sealedRef) (ids []uuid.UUID, revisions []int64) {
	for _, r := range refs {
		ids = append(ids, r.id)
		revisions = append(revisions, r.revision)
	}
	return ids, revisions
}

func labels(refs []sealedRef) []string {
	out := make([]string, len(refs))
	for i, r := range refs {
		out[i] = r.label
	}
	return out
}

// startCredentialWatch checks again every credentialCheckInterval until
// ctx ends or Stop.
func (j *AccountJobs) startCredentialWatch(ctx context.Context) {
	j.creds.start(ctx, credentialCheckInterval, func(ctx context.Context) {
		var wrong *WrongKeyError
		switch err := j.settleCredentials(ctx); {
		case errors.As(err, &wrong):
			j.log.ErrorContext(ctx, "no stored credential opens with this control plane's secret keys: nothing marked", "err", err)
		case err != nil && ctx.Err() == nil:
			j.log.WarnContext(ctx, "credential check failed", "err", err)
		}
	})
}
