package controlplane

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// The overload breaker's arithmetic is policy's (policy/breaker.go); this
// file reads and writes it, shared through Postgres.

// recordOverload folds one overload answer into the family's breaker.
func recordOverload(ctx context.Context, q *db.Queries, provider, family string, account uuid.UUID, now time.Time) (policy.Breaker, error) {
	row, err := q.LockBreaker(ctx, db.LockBreakerParams{Provider: provider, Family: family})
	if err != nil && !errors.Is(storeErr(err), ErrNotFound) {
		return policy.Breaker{}, err
	}
	serving, err := q.CountServingAccounts(ctx, db.CountServingAccountsParams{Provider: provider, Family: family, Now: now})
	if err != nil {
		return policy.Breaker{}, err
	}
	b := policy.AfterOverload(policyBreaker(row), account, serving, now)
	return b, q.PutBreaker(ctx, db.PutBreakerParams{
		Provider: provider, Family: family, Overloads: b.Overloads, WindowStart: b.WindowStart,
		ProbeEveryMs: int32(b.ProbeEvery / time.Millisecond),
		OpenUntil:    b.OpenUntil, OpenCount: b.OpenCount, ProbeUntil: b.ProbeUntil, Now: now,
		SeenAccounts: orEmpty(b.SeenAccounts), JudgedAccounts: orEmpty(b.JudgedAccounts), ProbedAccounts: orEmpty(b.ProbedAccounts),
	})
}

// orEmpty is ids, or an empty list for nil: the columns are NOT NULL.
func orEmpty(ids []uuid.UUID) []uuid.UUID {
	if ids == nil {
		return []uuid.UUID{}
	}
	return ids
}

// breakerGate says whether an Acquire for this family may proceed. When
// the breaker is open it answers the NoAccount to return, unless this
// request takes the next probe (probe is then true, and the caller must
// give the turn back if it grants no lease, and else mark the account
// probed); avoid names the accounts already probed in this round, which
// the probe should not go to while another account can serve.
func (l leaseService) breakerGate(ctx context.Context, provider, family string, now time.Time) (none *weirv1.NoAccount, probe bool, avoid []uuid.UUID, err error) {
	b, err := l.q.GetBreaker(ctx, db.GetBreakerParams{Provider: provider, Family: family})
	if errors.Is(storeErr(err), ErrNotFound) || (err == nil && b.OpenUntil == nil) {
		return nil, false, nil, nil
	}
	if err != nil {
		return nil, false, nil, err
	}
	closed := func(at time.Time) *weirv1.NoAccount {
		return &weirv1.NoAccount{
			Reason:  weirv1.NoAccountReason_NO_ACCOUNT_REASON_BREAKER_OPEN,
			Message: "the provider is overloaded for " + family + " models; weir is probing it before sending more",
			RetryAt: timestamppb.New(at),
		}
	}
	if now.Before(*b.OpenUntil) {
		return closed(*b.OpenUntil), false, nil, nil
	}
	until := now.Add(policy.ProbeTTL)
	next := now.Add(time.Duration(max(b.ProbeEveryMs, 1)) * time.Millisecond)
	probed, err := l.q.ClaimProbe(ctx, db.ClaimProbeParams{Provider: provider, Family: family, ProbeUntil: &until, NextProbe: &next, Now: now})
	switch {
	case err == nil:
		l.metrics.probes.Inc()
		return nil, true, probed, nil // this request is the probe
	case errors.Is(storeErr(err), ErrNotFound):
		// Another request took this turn: the next comes one pace on.
		return closed(next), false, nil, nil
	}
	return nil, false, nil, err
}

// breakers reads the open breakers of the family for providers (open, from
// the routing view, names those that are open or probing: only they are
// asked) and folds them into the request's gate (policy.GateBreakers). On
// an error the gate holds the probes claimed before it, to give back.
func (l leaseService) breakers(ctx context.Context, providers []weirv1.Provider, open map[weirv1.Provider]bool, family string) (policy.BreakerGate, error) {
	var verdicts []policy.BreakerVerdict
	for _, p := range providers {
		if !open[p] {
			continue
		}
		none, probe, probed, err := l.breakerGate(ctx, enumName(p), family, l.now())
		if err != nil {
			return policy.GateBreakers(providers, verdicts), err
		}
		verdicts = append(verdicts, policy.BreakerVerdict{Provider: p, None: none, Probe: probe, Probed: probed})
	}
	return policy.GateBreakers(providers, verdicts), nil
}
