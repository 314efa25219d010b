package policy

import (
	"encoding/json"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// The usage view as quota evidence: rung 4 of the ladder reads the spent
// windows, and a reading that shows a quota cooldown's window recovered
// lifts the cooldown and admits one recovery probe.

// The account-wide windows of the usage view, as usage_windows names them.
const (
	windowFiveHour = "five_hour"
	windowSevenDay = "seven_day"
)

// windowClaims maps the account-wide window names to their header infix
// and length, as claims name them.
var windowClaims = map[string]Claim{
	windowFiveHour: {Claim: "5h", Minutes: 300},
	windowSevenDay: {Claim: "7d", Minutes: 10080},
}

// SpentClaim is an account-wide window of the usage view as a claim, when
// it is spent (at SpentAt or above): its reset rounded up to the second,
// so that a cooldown never ends before its window.
func SpentClaim(window string, utilization float64, resetsAt time.Time) (Claim, bool) {
	if utilization < SpentAt {
		return Claim{}, false
	}
	c := windowClaims[window]
	c.Reset = resetsAt.Add(time.Second - time.Nanosecond).Unix()
	return c, true
}

// Reading is one window of a usage read: utilization nil is no evidence.
type Reading struct {
	Window      string
	Utilization *float64
	ResetsAt    *time.Time
}

// Recovered says whether readings taken at observedAt show the windows
// behind cooldown cd recovered: every account-wide claim of its evidence
// names a window that now reads below SpentAt in a later window than the
// one rejected (its reset moved past the claim's, or, for the weekly
// window, a banked reset landed since the cooldown). A cooldown without
// account-wide claims (a backoff, a re-probe) recovers when every
// account-wide window read is below SpentAt, and at least one was read.
func Recovered(cd Cooldown, readings []Reading, observedAt time.Time, bankedReset bool) bool {
	byClaim := map[string]Reading{}
	for _, r := range readings {
		if c, ok := windowClaims[r.Window]; ok {
			byClaim[c.Claim] = r
		}
	}
	ok := func(r Reading) bool {
		return r.Utilization != nil && *r.Utilization < SpentAt && r.ResetsAt != nil && r.ResetsAt.After(observedAt)
	}
	var e Evidence
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
		if c.Reset > 0 && !r.ResetsAt.After(time.Unix(c.Reset, 0)) && (c.Claim != "7d" || !bankedReset) {
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

// WeeklyLimited says whether an account is at its weekly limit: its live
// cooldown (nil: none) is quota_exhausted on a 7d claim, or the usage
// view's seven_day (nil: no evidence) is at SpentAt or above.
func WeeklyLimited(sevenDay *float64, cd *Cooldown) bool {
	limited := sevenDay != nil && *sevenDay >= SpentAt
	if cd != nil && cd.Reason == weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED {
		var e Evidence
		_ = json.Unmarshal(cd.Evidence, &e)
		for _, c := range e.Claims {
			if c.Claim == "7d" {
				limited = true
			}
		}
	}
	return limited
}
