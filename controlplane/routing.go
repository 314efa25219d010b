package controlplane

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// candidate is one account as routing sees it at one instant.
type candidate struct {
	account  db.Account
	live     int32        // unexpired leases
	cooldown *db.Cooldown // live cooldown, if any
	// gate is the live gate for the request's model family, if any: the
	// account is cooling for that family only. Unlike a cooldown, the
	// claim does not re-check it under the row lock: a gate written between
	// the view and the claim costs at most one more 429 of that family.
	gate *db.FamilyGate
}

// routeRequest is what one Acquire asks for.
type routeRequest struct {
	model          string
	exclude        map[uuid.UUID]bool
	sessionAccount uuid.UUID // uuid.Nil when the session is unbound
	// preferAccount goes first when eligible: a retry after an overload
	// returns to the account that has the conversation's prompt cache.
	preferAccount uuid.UUID
}

// serves says whether an account's provider serves a model. Every model is
// Anthropic's until other providers join the pool.
func serves(provider string, _ string) bool {
	return provider == enumName(weirv1.Provider_PROVIDER_ANTHROPIC)
}

// route orders the accounts that may serve req, best first, or says why
// there are none and when that may change. It is pure: the claim that
// follows re-checks eligibility under a row lock, so a stale view costs a
// retry, never a broken cap.
func route(cands []candidate, req routeRequest, now time.Time) ([]candidate, *weirv1.NoAccount) {
	var (
		eligible                                []candidate
		serving, disabled, tried, full, cooling int
		gated                                   int // cooling for the request's family only
		recoverable                             int // could serve again without an operator
		rejected                                int // holding a rejected credential
		soonest                                 time.Time
	)
	for _, c := range cands {
		a := c.account
		if !serves(a.Provider, req.model) {
			continue
		}
		serving++
		if a.Paused || a.BrokenAt != nil {
			disabled++
			continue
		}
		back, coolingNow, transient := c.blockedUntil(now)
		if !coolingNow || transient {
			recoverable++
		} else {
			rejected++
		}
		if coolingNow && transient && (soonest.IsZero() || back.Before(soonest)) {
			// Tried accounts count too: the request will come back to them.
			soonest = back
		}
		switch {
		case req.exclude[a.ID]:
			tried++
		case coolingNow:
			cooling++
			if c.cooldown == nil || !c.cooldown.Until.After(now) {
				gated++
			}
		case c.live >= a.MaxConcurrency:
			full++
		default:
			eligible = append(eligible, c)
		}
	}
	if len(eligible) > 0 {
		slices.SortStableFunc(eligible, func(x, y candidate) int { return compareCandidates(x, y, req) })
		return eligible, nil
	}
	none := &weirv1.NoAccount{Permanent: recoverable == 0}
	if !soonest.IsZero() {
		none.RetryAt = timestamppb.New(soonest)
	}
	switch {
	case serving == 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED
		none.Message = "no account in the pool serves this model"
	case full > 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY
		none.Message = fmt.Sprintf("all %d eligible accounts are at their concurrency cap", full)
		none.RetryAt = timestamppb.New(now.Add(time.Second))
	case tried > 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_TRIED
		none.Message = fmt.Sprintf("all %d eligible accounts were tried for this request", tried)
	case cooling > 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING
		none.Message = fmt.Sprintf("all %d accounts are cooling down", cooling)
		if gated > 0 {
			none.Message += fmt.Sprintf(" (%d gated for %s models only)", gated, modelFamily(req.model))
		}
		if none.Permanent {
			none.Message += " with rejected credentials"
		}
	default:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED
		none.Message = fmt.Sprintf("all %d accounts are paused or broken", disabled)
	}
	if none.Permanent && rejected > 0 {
		none.Message = fmt.Sprintf("no account can serve until an operator acts: %d paused or broken, %d with a credential the upstream rejected", disabled, rejected)
	}
	if none.RetryAt != nil && none.Reason != weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY {
		none.Message += "; the first recovers at " + none.RetryAt.AsTime().UTC().Format(time.RFC3339)
	}
	return nil, none
}

// blockedUntil says whether the account is cooling for this request (a
// live cooldown, or a live gate for the request's family), whether that
// passes on its own, and when it is expected to: the later of the two
// deadlines, since both must pass.
func (c candidate) blockedUntil(now time.Time) (until time.Time, blocked, transient bool) {
	transient = true
	if c.cooldown != nil && c.cooldown.Until.After(now) {
		until, blocked, transient = c.cooldown.Until, true, c.cooldown.Transient
	}
	if c.gate != nil && c.gate.Until.After(now) {
		blocked = true
		if c.gate.Until.After(until) {
			until = c.gate.Until
		}
	}
	return until, blocked, transient
}

// compareCandidates ranks: the session's own account first (its prompt
// cache lives there), then operator priority, then the most free share of
// the concurrency cap, then the least recently used.
func compareCandidates(x, y candidate, req routeRequest) int {
	for _, first := range []uuid.UUID{req.preferAccount, req.sessionAccount} {
		if first == uuid.Nil {
			continue
		}
		xs, ys := x.account.ID == first, y.account.ID == first
		if xs != ys {
			if xs {
				return -1
			}
			return 1
		}
	}
	if c := cmp.Compare(y.account.Priority, x.account.Priority); c != 0 {
		return c
	}
	// x.live/x.cap < y.live/y.cap, compared without division.
	if c := cmp.Compare(int64(x.live)*int64(y.account.MaxConcurrency), int64(y.live)*int64(x.account.MaxConcurrency)); c != 0 {
		return c
	}
	return compareTimes(x.account.LastUsedAt, y.account.LastUsedAt)
}

// compareTimes orders never-used first, then oldest.
func compareTimes(x, y *time.Time) int {
	switch {
	case x == nil && y == nil:
		return 0
	case x == nil:
		return -1
	case y == nil:
		return 1
	}
	return x.Compare(*y)
}
