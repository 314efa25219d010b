package policy

import (
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
)

// The overload breaker. Overload (503/529, overloaded events) is judged
// per account first: an account that answers overloaded is retried once
// and the request then fails over (Decide), and nothing is gated for
// anyone. Only when several of the accounts that can serve are judged
// overloaded within breakerWindow, and none answered in between, is it the
// provider's condition for the model family: then one breaker per provider
// and family, shared through Postgres, opens, and every worker's requests
// wait while one probe at a time, every BreakerProbeEvery, asks the
// provider, each on an account the breaker has not probed yet. The first
// real answer closes it (a success as soon as its output starts), and its
// notification wakes every held request. During a storm that lasts, the
// upstream sees one attempt per provider and family every
// BreakerProbeEvery (30 a minute), plus the requests already in flight when
// it opened; the end of the storm is noticed within BreakerProbeEvery and
// one answer's time to first output.
const (
	breakerWindow = 10 * time.Second
	// BreakerProbeEvery is the wait between probes while the breaker is
	// open: short, so that a storm's end is noticed within seconds; fixed,
	// because a probe is one request across all workers, whatever the
	// storm's length.
	BreakerProbeEvery = 2 * time.Second
	// ProbeTTL frees the probe slot when a probe never reports back.
	ProbeTTL = 30 * time.Second
	// BreakerPoll is how soon a request waiting behind a running probe
	// asks again: the probe's success closes the breaker for everyone.
	BreakerPoll = BreakerProbeEvery
)

// Breaker is one provider and family's overload breaker.
type Breaker struct {
	// Overloads counts the overload answers since WindowStart.
	Overloads   int32
	WindowStart time.Time
	// OpenUntil is when the next probe may go; nil while closed.
	OpenUntil *time.Time
	OpenCount int32
	// ProbeUntil holds the probe slot; nil when it is free.
	ProbeUntil *time.Time
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

// ModelFamily groups models that share provider capacity.
func ModelFamily(model string) string {
	m := strings.ToLower(model)
	for _, f := range []string{"opus", "sonnet", "haiku"} {
		if strings.Contains(m, f) {
			return f
		}
	}
	return m
}

// AfterOverload is the breaker after one more overload answer, from
// account, with serving accounts of the provider able to serve.
func AfterOverload(b Breaker, account uuid.UUID, serving int32, now time.Time) Breaker {
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

func openBreaker(b Breaker, now time.Time) Breaker {
	until := now.Add(BreakerProbeEvery)
	b.OpenUntil, b.OpenCount, b.ProbeUntil = &until, b.OpenCount+1, nil
	return b
}
