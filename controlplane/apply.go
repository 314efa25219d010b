package controlplane

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// released is one attempt whose lease was released: the lease's row, what
// the worker reported, and what policy decided of it.
type released struct {
	row     db.ReleaseLeaseRow
	outcome *weirv1.Outcome
	effects policy.Effects
	// admittedAt is when the attempt started: a success clears an
	// out-of-credits cooldown written before it.
	admittedAt time.Time
}

// releasedSuccess is a success as Release and ReleaseBatch settle it: a
// success needs no fact beyond its lease's model family.
func releasedSuccess(row db.ReleaseLeaseRow, o *weirv1.Outcome, admittedAt time.Time, now time.Time) released {
	return released{row: row, outcome: o, admittedAt: admittedAt,
		effects: policy.Decide(o, policy.Facts{Family: policy.ModelFamily(row.Model)}, now)}
}

// applyEffects writes what policy decided for each attempt and returns the
// answers to the workers, in order. A failure's writes come first, in the
// order their locks are taken: the family's breaker, then the cooldown
// (continuing a transport run, re-arming the usage read of a quota
// cooldown), then the ladder's state. Then the successes' records, one
// per account and model family in one pipelined round trip, and last the
// usage readings the outcomes' headers carry, folded to one per account
// and window, in one statement. Release applies a failure
// inside its transaction (q is the transaction's); successes are applied
// outside one, on the pool, since a success record that lost a deadlock
// is run again whole.
func (l leaseService) applyEffects(ctx context.Context, q *db.Queries, rs []released, now time.Time) ([]*weirv1.Decision, error) {
	answers := make([]*weirv1.Decision, len(rs))
	for i, r := range rs {
		if r.effects.Success {
			continue
		}
		if err := l.applyBreaker(ctx, q, r, now); err != nil {
			return nil, err
		}
		inForce, err := l.applyCooldown(ctx, q, r, now)
		if err != nil {
			return nil, err
		}
		if err := l.applyLadderState(ctx, q, r.row, r.effects, now); err != nil {
			return nil, err
		}
		answers[i] = answer(r.effects, inForce)
	}
	if err := l.writeSuccessRecords(ctx, q, successGroups(rs, now)); err != nil {
		return nil, err
	}
	usage := make([]answeredUsage, 0, len(rs))
	for i, r := range rs {
		if r.effects.Success {
			answers[i] = answer(r.effects, nil)
		}
		if h := r.outcome.GetHeaders(); len(h) > 0 {
			usage = append(usage, answeredUsage{account: r.row.AccountID, revision: r.row.CredentialRevision, headers: h})
		}
	}
	if err := l.mergeUsageHeaders(ctx, q, usage, now); err != nil {
		return nil, err
	}
	return answers, nil
}

// answer is the decision a worker is told: the action, its wait and rung,
// and the cooldown in force after merging (nil when none was written).
func answer(e policy.Effects, inForce *db.Cooldown) *weirv1.Decision {
	out := &weirv1.Decision{Action: e.Action, Rung: string(e.Rung)}
	if e.RetryAfter > 0 {
		out.RetryAfter = durationpb.New(e.RetryAfter)
	}
	if inForce != nil {
		out.Cooldown = cooldownProto(*inForce)
	}
	return out
}

// applyBreaker writes a failure's change to its family's breaker (a
// success's is its record's).
func (l leaseService) applyBreaker(ctx context.Context, q *db.Queries, r released, now time.Time) error {
	provider, family := r.row.Provider, policy.ModelFamily(r.row.Model)
	switch r.effects.Breaker {
	case policy.BreakerClose:
		return q.ResetBreaker(ctx, db.ResetBreakerParams{Provider: provider, Family: family, Now: now})
	case policy.BreakerFreeProbe:
		return q.FreeProbe(ctx, db.FreeProbeParams{Provider: provider, Family: family, Now: now})
	case policy.BreakerOverload:
		before, _ := q.GetBreaker(ctx, db.GetBreakerParams{Provider: provider, Family: family})
		b, err := recordOverload(ctx, q, provider, family, r.row.AccountID, now)
		if err != nil {
			return err
		}
		if b.OpenCount > before.OpenCount {
			l.metrics.breakerOpens.Inc()
			l.log.WarnContext(ctx, "overload breaker opened", "provider", provider, "family", family,
				"until", *b.OpenUntil, "open_count", b.OpenCount)
		}
	}
	return nil
}

// applyCooldown writes a failure's cooldown, if it has one, and returns
// the cooldown in force after merging, as routing sees it.
func (l leaseService) applyCooldown(ctx context.Context, q *db.Queries, r released, now time.Time) (*db.Cooldown, error) {
	cw := r.effects.Cooldown
	if cw == nil {
		return nil, nil
	}
	evidence := cw.Evidence
	if cw.Reason == weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT {
		// Read under the lock WriteCooldown takes next, and no sooner:
		// the breaker's rows are locked before it.
		prior, err := q.TransportRun(ctx, r.row.AccountID)
		switch {
		case err == nil:
			evidence = policy.ContinueRun(evidence, policyCooldown(prior))
		case !errors.Is(storeErr(err), ErrNotFound):
			return nil, err
		}
	}
	merged, err := q.WriteCooldown(ctx, withQuota(db.WriteCooldownParams{
		AccountID: r.row.AccountID,
		Reason:    enumName(cw.Reason),
		Transient: transientReason(cw.Reason),
		Until:     cw.Until,
		Now:       now,
		Evidence:  evidence,
	}, cw.Quota))
	if err != nil {
		return nil, err
	}
	// The account's history keeps every cooldown written, with the
	// evidence that decided it; the row above keeps only the live one.
	if err := q.InsertAccountHistory(ctx, db.InsertAccountHistoryParams{AccountID: r.row.AccountID, At: now, Kind: "cooldown",
		Reason: enumName(cw.Reason), Until: cw.Until, Evidence: jsonObject(evidence)}); err != nil {
		return nil, err
	}
	l.metrics.cooldowns.WithLabelValues(enumName(cw.Reason)).Inc()
	l.log.InfoContext(ctx, "cooldown written", "account_id", r.row.AccountID,
		"reason", merged.Reason, "until", merged.Until)
	if merged.Reason == enumName(weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED) &&
		r.row.AuthKind == enumName(weirv1.AuthKind_AUTH_KIND_OAUTH) {
		// The poller reads right after the reset, under a new epoch: a
		// read claimed before the cooldown never lands.
		if _, err := rearmUsage(ctx, q, r.row.AccountID, merged.Until); err != nil {
			return nil, err
		}
	}
	return &merged, nil
}

// jsonObject is b, a JSON object, or {} when there is none.
func jsonObject(b []byte) []byte {
	if len(b) == 0 {
		return []byte("{}")
	}
	return b
}

// withQuota adds a cooldown's quota evidence to its write.
func withQuota(p db.WriteCooldownParams, q *policy.QuotaRecord) db.WriteCooldownParams {
	if q == nil {
		return p
	}
	kind := enumName(q.Kind)
	p.QuotaKind, p.QuotaWindowMinutes, p.QuotaMessage = &kind, q.WindowMinutes, q.Message
	if !q.ResetsAt.IsZero() {
		t := q.ResetsAt
		p.QuotaResetsAt = &t
	}
	return p
}
