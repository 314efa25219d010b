package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// The usage view as quota evidence: rung 4 of the ladder reads the spent
// windows, and a reading that shows a quota cooldown's window recovered
// lifts the cooldown and admits one recovery probe.

// windowClaims maps the account-wide window names to their header infix
// and length, as claims name them.
var windowClaims = map[string]claimEvidence{
	windowFiveHour: {Claim: "5h", Minutes: 300},
	windowSevenDay: {Claim: "7d", Minutes: 10080},
}

// spentWindows are the account's account-wide windows that the usage view
// shows spent at now, as claims with their resets (rounded up to the
// second, so a cooldown never ends before its window).
func spentWindows(ctx context.Context, q *db.Queries, id uuid.UUID, now time.Time) ([]claimEvidence, error) {
	rows, err := q.AccountWideUsage(ctx, db.AccountWideUsageParams{AccountID: id, Now: now})
	if err != nil {
		return nil, err
	}
	var out []claimEvidence
	for _, r := range rows {
		if r.Utilization < spentAt {
			continue
		}
		c := windowClaims[r.WindowName]
		c.Reset = r.ResetsAt.Add(time.Second - time.Nanosecond).Unix()
		out = append(out, c)
	}
	return out, nil
}

// recoverQuota runs in the transaction that stored a poll's readings,
// taken at observedAt. When the account's live cooldown is quota-derived
// and the readings show its windows recovered, it lifts the cooldown by
// compare-and-set (the very cooldown read, written before the reading)
// and marks the account for one recovery probe. A refusal is logged with
// its reason.
func (s *Server) recoverQuota(ctx context.Context, q *db.Queries, id uuid.UUID, readings []usageReading, observedAt time.Time) error {
	cd, err := q.GetLiveCooldown(ctx, db.GetLiveCooldownParams{AccountID: id, Now: observedAt})
	if errors.Is(storeErr(err), ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	// A banked reset that landed after the cooldown empties the very
	// weekly window it rejected: the reading shows it below spentAt under
	// the same reset.
	banked, err := q.ResetLandedBetween(ctx, db.ResetLandedBetweenParams{AccountID: id, Since: cd.WrittenAt, Until: observedAt})
	if err != nil {
		return err
	}
	if !recovered(cd, readings, observedAt, banked) {
		return nil
	}
	if cd.Reason != enumName(weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED) {
		s.log.InfoContext(ctx, "recovery refused: the cooldown is not quota-derived", "account_id", id, "reason", cd.Reason)
		return nil
	}
	n, err := q.ClearRecoveredQuotaCooldown(ctx, db.ClearRecoveredQuotaCooldownParams{AccountID: id, WrittenAt: cd.WrittenAt, ObservedAt: observedAt})
	if err != nil {
		return err
	}
	if n == 0 {
		s.log.InfoContext(ctx, "recovery refused: the cooldown is newer than the reading", "account_id", id,
			"written_at", cd.WrittenAt, "observed_at", observedAt)
		return nil
	}
	s.log.InfoContext(ctx, "quota cooldown lifted by a reading; one recovery probe admitted", "account_id", id, "until_was", cd.Until)
	return nil
}

// recovered says whether readings taken at observedAt show the windows
// behind cooldown cd recovered: every account-wide claim of its evidence
// names a window that now reads below spentAt in a later window than the
// one rejected (its reset moved past the claim's, or, for the weekly
// window, a banked reset landed since the cooldown). A cooldown without
// account-wide claims (a backoff, a re-probe) recovers when every
// account-wide window read is below spentAt, and at least one was read.
func recovered(cd db.Cooldown, readings []usageReading, observedAt time.Time, bankedReset bool) bool {
	byClaim := map[string]usageReading{}
	for _, r := range readings {
		if c, ok := windowClaims[r.window]; ok {
			byClaim[c.Claim] = r
		}
	}
	ok := func(r usageReading) bool {
		return r.utilization != nil && *r.utilization < spentAt && r.resetsAt != nil && r.resetsAt.After(observedAt)
	}
	var e storedEvidence
	_ = json.Unmarshal(cd.Evidence, &e)
	checked := 0
	for _, c := range e.Claims {
		if c.Claim != "5h" && c.Claim != "7d" {
			continue
		}
		checked++
		r, found := byClaim[c.Claim]
		if !found || !ok(r) {
			return false
		}
		if c.Reset > 0 && !r.resetsAt.After(time.Unix(c.Reset, 0)) && (c.Claim != "7d" || !bankedReset) {
			return false
		}
	}
	if checked > 0 {
		return true
	}
	for _, r := range byClaim {
		if !ok(r) {
			return false
		}
	}
	return len(byClaim) > 0
}
