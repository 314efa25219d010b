package controlplane

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// The overload breaker. Overload (503/529, overloaded events) is judged
// per account first: an account that answers overloaded is retried once
// and the request then fails over (decide), and nothing is gated for
// anyone. Only when several of the accounts that can serve are judged
// overloaded within breakerWindow, and none answered in between, is it the
// provider's condition for the model family: then one breaker per provider
// and family, shared through Postgres, opens, and every worker's requests
// wait while one probe at a time, every breakerProbeEvery, asks the
// provider, each on an account the breaker has not probed yet. The first
// real answer closes it (a success as soon as its output starts), and its
// notification wakes every held request. During a storm that lasts, the
// upstream sees one attempt per provider and family every
// breakerProbeEvery (30 a minute), plus the requests already in flight when
// it opened; the end of the storm is noticed within breakerProbeEvery and
// one answer's time to first output.
const (
	breakerWindow = 10 * time.Second
	// breakerProbeEvery is the wait between probes while the breaker is
	// open: short, so that a storm's end is noticed within seconds; fixed,
	// because a probe is one request across all workers, whatever the
	// storm's length.
	breakerProbeEvery = 2 * time.Second
	// probeTTL frees the probe slot when a probe never reports back.
	probeTTL = 30 * time.Second
	// breakerPoll is how soon a request waiting behind a running probe
	// asks again: the probe's success closes the breaker for everyone.
	breakerPoll = breakerProbeEvery
)

// breakerThreshold is how many accounts judged overloaded (two overload
// answers within the window) make it the provider's condition, out of the
// serving accounts that could serve at all: every one of them when there
// are fewer than two, else at least two and at least half. Pure.
func breakerThreshold(serving int32) int {
	serving = max(serving, 1)
	return int(max(min(2, serving), (serving+1)/2))
}

// modelFamily groups models that share provider capacity.
func modelFamily(model string) string {
	m := strings.ToLower(model)
	for _, f := range []string{"opus", "sonnet", "haiku"} {
		if strings.Contains(m, f) {
			return f
		}
	}
	return m
}

// afterOverload is the breaker after one more overload answer, from
// account, with serving accounts of the provider able to serve. Pure.
func afterOverload(b db.OverloadBreaker, account uuid.UUID, serving int32, now time.Time) db.OverloadBreaker {
	if now.Sub(b.WindowStart) > breakerWindow || b.WindowStart.IsZero() {
		b.Overloads, b.WindowStart, b.SeenAccounts, b.JudgedAccounts = 0, now, nil, nil
	}
	b.Overloads++
	switch {
	case slices.Contains(b.JudgedAccounts, account):
	case slices.Contains(b.SeenAccounts, account):
		b.SeenAccounts = slices.DeleteFunc(slices.Clone(b.SeenAccounts), func(id uuid.UUID) bool { return id == account })
		b.JudgedAccounts = append(slices.Clone(b.JudgedAccounts), account)
	default:
		b.SeenAccounts = append(slices.Clone(b.SeenAccounts), account)
	}
	switch {
	case b.OpenUntil != nil && now.Before(*b.OpenUntil):
		// Still waiting for the next probe: a straggler sent before the
		// breaker opened, not a probe.
	case b.OpenUntil != nil:
		// The probe (or whatever went through after the wait) failed: the
		// next one goes to an account not probed yet, round the pool.
		probed := b.ProbedAccounts
		if int32(len(probed)) >= max(serving, 1) {
			probed = nil
		}
		if !slices.Contains(probed, account) {
			b.ProbedAccounts = append(slices.Clone(probed), account)
		}
		b = openBreaker(b, now)
	case len(b.JudgedAccounts) >= breakerThreshold(serving):
		b = openBreaker(b, now)
	}
	return b
}

func openBreaker(b db.OverloadBreaker, now time.Time) db.OverloadBreaker {
	until := now.Add(breakerProbeEvery)
	b.OpenUntil, b.OpenCount, b.ProbeUntil = &until, b.OpenCount+1, nil
	return b
}

// recordOverload folds one overload answer into the family's breaker.
func recordOverload(ctx context.Context, q *db.Queries, provider, family string, account uuid.UUID, now time.Time) (db.OverloadBreaker, error) {
	b, err := q.LockBreaker(ctx, db.LockBreakerParams{Provider: provider, Family: family})
	if err != nil && !errors.Is(storeErr(err), ErrNotFound) {
		return b, err
	}
	serving, err := q.CountServingAccounts(ctx, provider)
	if err != nil {
		return b, err
	}
	b.Provider, b.Family = provider, family
	b = afterOverload(b, account, serving, now)
	return b, q.PutBreaker(ctx, db.PutBreakerParams{
		Provider: provider, Family: family, Overloads: b.Overloads, WindowStart: b.WindowStart,
		OpenUntil: b.OpenUntil, OpenCount: b.OpenCount, ProbeUntil: b.ProbeUntil, Now: now,
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
// request takes the one probe slot (probe is then true, and the caller
// must give the slot back if it grants no lease); avoid names the
// accounts already probed since it opened, which the probe should not
// go to while another account can serve.
func (s *Server) breakerGate(ctx context.Context, provider, family string, now time.Time) (none *weirv1.NoAccount, probe bool, avoid []uuid.UUID, err error) {
	b, err := s.q.GetBreaker(ctx, db.GetBreakerParams{Provider: provider, Family: family})
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
	until := now.Add(probeTTL)
	_, err = s.q.ClaimProbe(ctx, db.ClaimProbeParams{Provider: provider, Family: family, ProbeUntil: &until, Now: now})
	switch {
	case err == nil:
		s.metrics.probes.Inc()
		return nil, true, b.ProbedAccounts, nil // this request is the probe
	case errors.Is(storeErr(err), ErrNotFound):
		return closed(now.Add(breakerPoll)), false, nil, nil
	}
	return nil, false, nil, err
}

// settleBreaker applies an answer that was not an overload. Any real answer
// from the provider (a success, a rate limit, a client error) shows it is
// serving again and closes the family's breaker; an attempt that ended
// without one (a dropped connection, a gateway error, a client that left)
// only gives back the probe slot it may have held.
func settleBreaker(ctx context.Context, q *db.Queries, provider, family string, class weirv1.OutcomeClass, now time.Time) error {
	switch class {
	case weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR,
		weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR, weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED:
		return q.FreeProbe(ctx, db.FreeProbeParams{Provider: provider, Family: family, Now: now})
	}
	return q.ResetBreaker(ctx, db.ResetBreakerParams{Provider: provider, Family: family, Now: now})
}
