package controlplane

import (
	"context"
	"errors"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// The overload breaker: overload (503/529, overloaded events) is the
// provider's condition for a model family, not an account's. When it
// persists, every worker's retries would only hammer a struggling provider,
// so one breaker per provider and family, shared through Postgres, opens
// and lets a single probe through at a time until the provider answers
// again.
const (
	// breakerThreshold overloads within breakerWindow open the breaker.
	breakerThreshold = 3
	breakerWindow    = 10 * time.Second
	// The wait before the next probe doubles from breakerBaseOpen with each
	// failed probe, up to breakerMaxOpen.
	breakerBaseOpen = 2 * time.Second
	breakerMaxOpen  = 30 * time.Second
	// probeTTL frees the probe slot when a probe never reports back.
	probeTTL = 30 * time.Second
	// breakerPoll is how soon a request waiting behind a running probe
	// asks again: the probe's success closes the breaker for everyone.
	breakerPoll = time.Second
)

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

// afterOverload is the breaker after one more overload answer. Pure.
func afterOverload(b db.OverloadBreaker, now time.Time) db.OverloadBreaker {
	if now.Sub(b.WindowStart) > breakerWindow || b.WindowStart.IsZero() {
		b.Overloads, b.WindowStart = 0, now
	}
	b.Overloads++
	switch {
	case b.OpenUntil != nil && now.Before(*b.OpenUntil):
		// Still waiting out the last opening: a straggler from before it,
		// not a probe. Doubling here would punish the provider for requests
		// already in flight.
	case b.OpenUntil != nil:
		// The probe (or whatever went through after the wait) failed.
		b = openBreaker(b, now)
	case b.Overloads >= breakerThreshold:
		b = openBreaker(b, now)
	}
	return b
}

func openBreaker(b db.OverloadBreaker, now time.Time) db.OverloadBreaker {
	wait := min(breakerBaseOpen<<min(b.OpenCount, 8), breakerMaxOpen)
	until := now.Add(wait)
	b.OpenUntil, b.OpenCount, b.ProbeUntil = &until, b.OpenCount+1, nil
	return b
}

// recordOverload folds one overload answer into the family's breaker.
func recordOverload(ctx context.Context, q *db.Queries, provider, family string, now time.Time) (db.OverloadBreaker, error) {
	b, err := q.LockBreaker(ctx, db.LockBreakerParams{Provider: provider, Family: family})
	if err != nil && !errors.Is(storeErr(err), ErrNotFound) {
		return b, err
	}
	b.Provider, b.Family = provider, family
	b = afterOverload(b, now)
	return b, q.PutBreaker(ctx, db.PutBreakerParams{
		Provider: provider, Family: family, Overloads: b.Overloads, WindowStart: b.WindowStart,
		OpenUntil: b.OpenUntil, OpenCount: b.OpenCount, ProbeUntil: b.ProbeUntil, Now: now,
	})
}

// breakerGate says whether an Acquire for this family may proceed. When
// the breaker is open it answers the NoAccount to return, unless this
// request takes the one probe slot (probe is then true, and the caller
// must give the slot back if it grants no lease).
func (s *Server) breakerGate(ctx context.Context, provider, family string, now time.Time) (none *weirv1.NoAccount, probe bool, err error) {
	b, err := s.q.GetBreaker(ctx, db.GetBreakerParams{Provider: provider, Family: family})
	if errors.Is(storeErr(err), ErrNotFound) || (err == nil && b.OpenUntil == nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	closed := func(at time.Time) *weirv1.NoAccount {
		return &weirv1.NoAccount{
			Reason:  weirv1.NoAccountReason_NO_ACCOUNT_REASON_BREAKER_OPEN,
			Message: "the provider is overloaded for " + family + " models; weir is probing it before sending more",
			RetryAt: timestamppb.New(at),
		}
	}
	if now.Before(*b.OpenUntil) {
		return closed(*b.OpenUntil), false, nil
	}
	until := now.Add(probeTTL)
	_, err = s.q.ClaimProbe(ctx, db.ClaimProbeParams{Provider: provider, Family: family, ProbeUntil: &until, Now: now})
	switch {
	case err == nil:
		s.metrics.probes.Inc()
		return nil, true, nil // this request is the probe
	case errors.Is(storeErr(err), ErrNotFound):
		return closed(now.Add(breakerPoll)), false, nil
	}
	return nil, false, err
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
