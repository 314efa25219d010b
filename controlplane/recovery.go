package controlplane

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// The usage view as quota evidence (policy/recovery.go decides): the
// spent windows the ladder reads, and the lifting of a quota cooldown a
// reading shows recovered.

// spentWindows are the account's account-wide windows that the usage view
// shows spent at now, as claims with their resets (rounded up to the
// second, so a cooldown never ends before its window).
func spentWindows(ctx context.Context, q *db.Queries, id uuid.UUID, now time.Time) ([]policy.Claim, error) {
	rows, err := q.AccountWideUsage(ctx, db.AccountWideUsageParams{AccountID: id, Now: now})
	if err != nil {
		return nil, err
	}
	var out []policy.Claim
	for _, r := range rows {
		if c, ok := policy.SpentClaim(r.WindowName, r.Utilization, r.ResetsAt); ok {
			out = append(out, c)
		}
	}
	return out, nil
}

// recoverQuota runs in the transaction that stored a poll's readings,
// taken at observedAt. When the account's live cooldown is quota-derived
// and the readings show its windows recovered, it lifts the cooldown by
// compare-and-set (the very cooldown read, written before the reading)
// and marks the account for one recovery probe. A refusal is logged with
// its reason.
func (j *AccountJobs) recoverQuota(ctx context.Context, q *db.Queries, id uuid.UUID, readings []usageReading, observedAt time.Time) error {
	cd, err := q.GetLiveCooldown(ctx, db.GetLiveCooldownParams{AccountID: id, Now: observedAt})
	if errors.Is(storeErr(err), ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	// A banked reset that landed after the cooldown empties the very
	// weekly window it rejected: the reading shows it below SpentAt under
	// the same reset.
	banked, err := q.ResetLandedBetween(ctx, db.ResetLandedBetweenParams{AccountID: id, Since: cd.WrittenAt, Until: observedAt})
	if err != nil {
		return err
	}
	if !policy.Recovered(policyCooldown(cd), policyReadings(readings), observedAt, banked) {
		return nil
	}
	if cd.Reason != enumName(weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED) {
		j.log.InfoContext(ctx, "recovery refused: the cooldown is not quota-derived", "account_id", id, "reason", cd.Reason)
		return nil
	}
	n, err := q.ClearRecoveredQuotaCooldown(ctx, db.ClearRecoveredQuotaCooldownParams{AccountID: id, WrittenAt: cd.WrittenAt, ObservedAt: observedAt})
	if err != nil {
		return err
	}
	if n == 0 {
		j.log.InfoContext(ctx, "recovery refused: the cooldown is newer than the reading", "account_id", id,
			"written_at", cd.WrittenAt, "observed_at", observedAt)
		return nil
	}
	j.log.InfoContext(ctx, "quota cooldown lifted by a reading; one recovery probe admitted", "account_id", id, "until_was", cd.Until)
	return nil
}
