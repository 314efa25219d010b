package policy

import (
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// PooledWindow is one usage window (five-hour or weekly) across the
// subscription accounts that may serve a request: what a client key is
// shown instead of the window of whichever account served it.
type PooledWindow struct {
	// Utilization is the mean of the accounts' utilizations, 0..1: an
	// account without a current reading counts as unused (it serves, and
	// routing has no evidence against it), one blocked by quota evidence
	// on the window (or reading it at SpentAt or above) as spent.
	Utilization float64
	// ResetsAt is the soonest reset among the accounts' current readings
	// and quota evidence.
	ResetsAt time.Time
	// Accounts is how many accounts were pooled, Readings how many of them
	// had a current reading or quota evidence of the window.
	Accounts, Readings int
}

// Window lengths, in minutes, as quota evidence names them.
const (
	fiveHourMinutes = 300
	weekMinutes     = 10080
)

// PoolWindows pools the five-hour and weekly windows of the subscription
// accounts that may serve req: those QuotaBlock weighs (the provider
// serves the surface, metered_accounts=never does not withhold it, not
// paused, broken, unreadable or holding a rejected credential), less
// metered accounts, which have no such windows. A window none of them has
// evidence of is nil: no evidence is not "unused". Pure.
func PoolWindows(cands []Candidate, req RouteRequest, now time.Time) (fiveHour, sevenDay *PooledWindow) {
	var five, week PooledWindow
	add := func(pw *PooledWindow, w *Window, spentUntil time.Time) {
		pw.Accounts++
		var util float64
		var reset time.Time
		switch {
		case !spentUntil.IsZero():
			util, reset = 1, spentUntil
		case w.live(now):
			util, reset = min(max(w.Utilization, 0), 1), w.ResetsAt
			if util >= SpentAt {
				util = 1 // the headers saturate below 1: spent is spent
			}
		default:
			return
		}
		pw.Readings++
		pw.Utilization += util
		if pw.ResetsAt.IsZero() || reset.Before(pw.ResetsAt) {
			pw.ResetsAt = reset
		}
	}
	for _, c := range cands {
		if !c.mayServe(req, now) || IsMetered(c.Account) {
			continue
		}
		fiveSpent, weekSpent := c.windowSpentUntil(now)
		add(&five, c.FiveHour, fiveSpent)
		add(&week, c.SevenDay, weekSpent)
	}
	return five.mean(), week.mean()
}

// mean is pw with its sum of utilizations made their mean; nil without
// evidence.
func (pw PooledWindow) mean() *PooledWindow {
	if pw.Readings == 0 {
		return nil
	}
	pw.Utilization /= float64(pw.Accounts)
	return &pw
}

// windowSpentUntil says which account-wide window quota evidence shows
// spent, and until when: the evidence that blocks the account (quotaUntil:
// a 429 that named the window, a spent reading), when it names a reset
// and is not a model family's gate; zero for a window it does not name.
func (c *Candidate) windowSpentUntil(now time.Time) (fiveHour, sevenDay time.Time) {
	e, ok := c.quotaUntil(now)
	if !ok || e.resetsAt.IsZero() || e.kind == weirv1.QuotaKind_QUOTA_KIND_FAMILY_WINDOW {
		return time.Time{}, time.Time{}
	}
	switch e.windowMinutes {
	case fiveHourMinutes:
		return e.resetsAt, time.Time{}
	case weekMinutes:
		return time.Time{}, e.resetsAt
	}
	return time.Time{}, time.Time{}
}

// mayServe says whether the account is in the pool for req as QuotaBlock
// weighs it: its provider serves the surface, metered_accounts=never does
// not withhold it, it is not another owner's seat under owners_only,
// and no operator must act first (paused, broken, a
// credential this replica cannot open or the upstream rejected). An open
// breaker or a cooldown does not take it out: it serves again on its own.
func (c *Candidate) mayServe(req RouteRequest, now time.Time) bool {
	a := &c.Account
	if !Serves(a.Provider, req.Surface) || req.withheld(a) || req.keptAway(a) || a.Paused || a.Broken || req.Unreadable[a.ID] {
		return false
	}
	_, blocked, transient := c.blockedUntil(now) // a rejected credential: only an operator brings it back
	return !blocked || transient
}

// ProvidersServing are the providers of the accounts in cands that req's
// surface reaches and metered_accounts=never does not withhold, whatever
// their state, in ProvidersFor's order.
func ProvidersServing(cands []Candidate, req RouteRequest) []weirv1.Provider {
	var out []weirv1.Provider
	for _, p := range ProvidersFor(req.Surface) {
		for _, c := range cands {
			if c.Account.Provider == p && !req.withheld(&c.Account) {
				out = append(out, p)
				break
			}
		}
	}
	return out
}
