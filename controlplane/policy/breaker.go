package policy

import (
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/weirhq/weir/internal/modelpattern"
)

// The overload breaker. Overload (503/529, overloaded events) is judged
// per account first: an account that answers overloaded is retried once
// (unless another account answered within the last seconds: then the
// request fails over at once) and the request then fails over (Decide),
// and nothing is gated for anyone. Only when several of the accounts that
// can serve now (not paused, broken, cooling or gated for the family) are
// judged overloaded within breakerWindow, and none answered in between,
// is it the provider's condition for the model family: then one breaker
// per provider and family, shared through Postgres, opens, and every
// worker's requests wait while probes ask the provider. The first real
// answer closes it (a success as soon as its output starts), and its
// notification wakes every held request.
//
// Probes go per account, not one at a time round the pool: each probe
// claimed moves the next one on by ProbeEvery(n), so that each of the n
// accounts that can serve is probed once every BreakerProbeEvery, within
// the family's budget of BreakerProbeBudget probes a second; each goes to
// an account not probed yet in this round. An account that recovers is
// therefore probed within max(BreakerProbeEvery, n/BreakerProbeBudget)
// (2 s up to 16 accounts, n/8 s beyond) and served one answer's time to
// first output later; while a storm lasts the upstream sees at most
// min(n/2, BreakerProbeBudget) probes a second per provider and family,
// each of them a held request that wanted to go anyway.
const (
	breakerWindow = 10 * time.Second
	// BreakerProbeEvery is the least time between two probes of one
	// account while the breaker is open: short, so that a storm's end is
	// noticed within seconds.
	BreakerProbeEvery = 2 * time.Second
	// BreakerProbeBudget is the most probes a second per provider and
	// family, whatever the pool's size: it bounds what a storm on a large
	// pool sends the provider.
	BreakerProbeBudget = 8
	// ProbeTTL frees a probe's turn when it never reports back.
	ProbeTTL = 30 * time.Second
)

// ProbeEvery is the wait between two probes of a family whose breaker
// is open with serving accounts that can serve: every account once per
// BreakerProbeEvery, no faster than the budget, in whole milliseconds
// (as stored). Pure.
func ProbeEvery(serving int32) time.Duration {
	return max(BreakerProbeEvery/time.Duration(max(serving, 1)), time.Second/BreakerProbeBudget).Truncate(time.Millisecond)
}

// Breaker is one provider and family's overload breaker.
type Breaker struct {
	// Overloads counts the overload answers since WindowStart.
	Overloads   int32
	WindowStart time.Time
	// OpenUntil is when the next probe may go; nil while closed.
	OpenUntil *time.Time
	OpenCount int32
	// ProbeUntil is when the latest probe's turn lapses if it never
	// reports back; nil when none is out.
	ProbeUntil *time.Time
	// ProbeEvery is the wait between two probes (ProbeEvery()), set from
	// the accounts that can serve at the latest overload.
	ProbeEvery time.Duration
	// SeenAccounts answered overloaded once within the window,
	// JudgedAccounts twice (judged overloaded); ProbedAccounts were
	// probed since the breaker opened.
	SeenAccounts, JudgedAccounts, ProbedAccounts []uuid.UUID
}

// breakerThreshold is how many accounts judged overloaded (two overload
// answers within the window) make it the provider's condition, out of the
// serving accounts that could serve at all: every one of them when there
// are fewer than two, else at least two and at least half.
func breakerThreshold(serving int32) int {
	serving = max(serving, 1)
	return int(max(min(2, serving), (serving+1)/2))
}

// ModelFamily groups models that share provider capacity
// (modelpattern.Family, which workers use as well).
func ModelFamily(model string) string { return modelpattern.Family(model) }

// AfterOverload is the breaker after one more overload answer, from
// account, with serving accounts of the provider able to serve the family
// now.
func AfterOverload(b Breaker, account uuid.UUID, serving int32, now time.Time) Breaker {
	if now.Sub(b.WindowStart) > breakerWindow || b.WindowStart.IsZero() {
		b.Overloads, b.WindowStart, b.SeenAccounts, b.JudgedAccounts = 0, now, nil, nil
	}
	b.Overloads++
	b.ProbeEvery = ProbeEvery(serving)
	switch {
	case slices.Contains(b.JudgedAccounts, account):
	case slices.Contains(b.SeenAccounts, account):
		b.SeenAccounts = slices.DeleteFunc(slices.Clone(b.SeenAccounts), func(id uuid.UUID) bool { return id == account })
		b.JudgedAccounts = append(slices.Clone(b.JudgedAccounts), account)
	default:
		b.SeenAccounts = append(slices.Clone(b.SeenAccounts), account)
	}
	switch {
	case b.OpenUntil != nil:
		// A probe failed (or a request sent before the breaker opened):
		// the account is probed for this round. Probes are paced as they
		// are claimed, so nothing else moves.
		b.ProbedAccounts = Probed(b.ProbedAccounts, account, serving)
	case len(b.JudgedAccounts) >= breakerThreshold(serving):
		b = openBreaker(b, now)
	}
	return b
}

// Probed is the round's probed accounts once account was probed: a new
// round begins when every account that can serve was. Pure.
func Probed(probed []uuid.UUID, account uuid.UUID, serving int32) []uuid.UUID {
	if int32(len(probed)) >= max(serving, 1) {
		probed = nil
	}
	if slices.Contains(probed, account) {
		return probed
	}
	return append(slices.Clone(probed), account)
}

func openBreaker(b Breaker, now time.Time) Breaker {
	until := now.Add(b.ProbeEvery)
	b.OpenUntil, b.OpenCount, b.ProbeUntil, b.ProbedAccounts = &until, b.OpenCount+1, nil, nil
	return b
}
