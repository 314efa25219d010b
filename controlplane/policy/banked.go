package policy

import (
	"slices"
	"time"
)

// Banked resets: an OAuth account with banked resets enabled may hold
// reset grants that empty its weekly windows once. DecideBankedReset says
// whether to claim one now; the control plane's banked.go reads the
// grants, keeps the ledger and sends the claim.

const (
	// bankedClaimEvery: at most one claim per account per hour, whatever
	// asked for it (the applier or an operator).
	bankedClaimEvery = time.Hour
	// bankedExpiringWithin: a grant expiring this soon is used rather than
	// lost...
	bankedExpiringWithin = 2 * time.Hour
	// bankedExpiringMinWeek: ...when the account has used at least this
	// much of its week. A reset of a mostly unused week buys little, and
	// the provider may answer not_limited (or, unverified, spend the grant
	// for nothing) on an account far from its limit.
	bankedExpiringMinWeek = 0.5
)

// Grant statuses, as the usage endpoint reports them.
const (
	GrantAvailable = "available"
	GrantUsed      = "used"
)

// Grant is one reset grant as the usage endpoint reported it.
type Grant struct {
	ID, Program, Status string
	// ExpiresAt nil: never expires.
	ExpiresAt *time.Time
}

// BankedInput is what DecideBankedReset decides on.
type BankedInput struct {
	Now time.Time
	// WeeklyLimited: a quota_exhausted cooldown on a 7d claim, or the
	// usage view's seven_day at SpentAt or above (WeeklyLimited).
	WeeklyLimited bool
	// SevenDay is the usage view's weekly utilization; nil: no evidence.
	SevenDay *float64
	Grants   []Grant
	// LastClaim is when the account's last claim was written; nil: never.
	LastClaim *time.Time
	// ManualGrant, when set, is an operator's claim of that grant: it
	// overrides the weekly-limit condition, not the once-an-hour rule.
	ManualGrant string
}

// BankedDecision says which grant to claim, if any, and why.
type BankedDecision struct {
	Claim bool
	Grant Grant
	Why   string
}

// DecideBankedReset decides whether to claim a grant now: never within an
// hour of the last claim; an operator's named grant when it is available;
// else the soonest-expiring available grant when the account is at its
// weekly limit; else a grant expiring within 2 hours when at least half
// the week is used.
func DecideBankedReset(in BankedInput) BankedDecision {
	if in.LastClaim != nil && in.Now.Sub(*in.LastClaim) < bankedClaimEvery {
		return BankedDecision{Why: "a grant was claimed within the hour"}
	}
	var avail []Grant
	for _, g := range in.Grants {
		if g.Status == GrantAvailable && (g.ExpiresAt == nil || g.ExpiresAt.After(in.Now)) {
			avail = append(avail, g)
		}
	}
	// Soonest expiry first; grants that never expire last.
	slices.SortStableFunc(avail, func(a, b Grant) int {
		switch {
		case a.ExpiresAt == nil && b.ExpiresAt == nil:
			return 0
		case a.ExpiresAt == nil:
			return 1
		case b.ExpiresAt == nil:
			return -1
		}
		return a.ExpiresAt.Compare(*b.ExpiresAt)
	})
	if in.ManualGrant != "" {
		for _, g := range avail {
			if g.ID == in.ManualGrant {
				return BankedDecision{Claim: true, Grant: g, Why: "claimed by an operator"}
			}
		}
		return BankedDecision{Why: "the grant is not available"}
	}
	if len(avail) == 0 {
		return BankedDecision{Why: "no grant available"}
	}
	if in.WeeklyLimited {
		return BankedDecision{Claim: true, Grant: avail[0], Why: "at the weekly limit"}
	}
	g := avail[0]
	if g.ExpiresAt != nil && g.ExpiresAt.Sub(in.Now) <= bankedExpiringWithin &&
		in.SevenDay != nil && *in.SevenDay >= bankedExpiringMinWeek {
		return BankedDecision{Claim: true, Grant: g, Why: "the grant expires within 2 hours"}
	}
	return BankedDecision{Why: "not at the weekly limit"}
}
