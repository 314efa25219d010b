package dataplane

import (
	"fmt"
	"net/http"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/backoff"
)

// The capacity hold: when a routing round ends on a transient failure and
// nothing has reached the client, the worker waits and replays the same
// body on the same model, instead of handing the agent an error that ends
// its turn.

// Hold backoff: 0.5 s doubling, capped at 20 s and jittered ±25%, so the
// longest waits land between 15 and 25 s.
const (
	holdBackoffBase = 500 * time.Millisecond
	holdBackoffMax  = 20 * time.Second
)

// holdBackoff is the wait before the n-th retry round (n from 0); r in
// [0,1) is the jitter. Pure.
func holdBackoff(n int, r float64) time.Duration {
	d := backoff.Capped(holdBackoffBase, holdBackoffMax, n)
	return time.Duration(float64(d) * (0.75 + 0.5*r))
}

// holdMinWait is the least a wait on a known recovery lasts: a clock
// running ahead of the control plane's would otherwise see that time
// passed and spin.
const holdMinWait = 250 * time.Millisecond

// holdUntil says until when to wait before the next round, or that waiting
// cannot help. retryAt is the soonest known recovery among the accounts
// that could serve (zero when unknown): the wait ends then (and lasts at
// least holdMinWait), not at the end of a longer backoff, and when it lies
// beyond the budget's end the request fails at once. With no known
// recovery the wait is the backoff. Either way the budget's end caps it,
// and a change in the pool ends it sooner (Server.sleep). Pure.
func holdUntil(now, deadline, retryAt time.Time, backoff time.Duration) (time.Time, bool) {
	if !now.Before(deadline) {
		return time.Time{}, false
	}
	if !retryAt.IsZero() && retryAt.After(deadline) {
		return time.Time{}, false
	}
	until := now.Add(backoff)
	if !retryAt.IsZero() {
		until = maxTime(retryAt, now.Add(holdMinWait))
	}
	if until.After(deadline) {
		until = deadline
	}
	return until, true
}

// The unreachable hold: while every account that could serve a request is
// unreachable (the round's every attempt was a transport error, and the
// control plane says every account that cools, cools on one:
// NoAccount.unreachable), waiting out the capacity hold only delays an
// answer no wait brings. The request holds for unreachable_hold from the
// round that first showed it, then gets a 503 that names the cause. An
// account that answers (anything but a transport error: a success, a 529,
// a 429) ends it, and with it the short budget: a mix of unreachable and
// merely overloaded accounts holds as long as any storm.

// unreachableState is a request's verdict on its pool: since when every
// account that could serve it has been unreachable (zero: it is not), and
// the run the control plane named last.
type unreachableState struct {
	since time.Time
	run   *weirv1.Unreachable
}

// judge is the verdict after a round that started at start and made
// attempts attempts, transport of them transport errors, so far; none is
// the control plane's answer that ended it (nil while the round goes on,
// or when it ended on the worker's attempt cap: no word on the rest of
// the pool). Pure.
func (u unreachableState) judge(start time.Time, attempts, transport int, none *weirv1.NoAccount) unreachableState {
	switch {
	case transport < attempts:
		return unreachableState{} // an account answered
	case none == nil:
		return u
	case none.GetUnreachable() == nil:
		return unreachableState{}
	case u.since.IsZero():
		return unreachableState{since: start, run: none.GetUnreachable()}
	}
	return unreachableState{since: u.since, run: none.GetUnreachable()}
}

// holdEnd is when the request's holds must end: capacityEnd (the
// capacity hold from its arrival, within its deadline), or sooner, hold
// after its pool was first seen unreachable. Pure.
func (u unreachableState) holdEnd(capacityEnd time.Time, hold time.Duration) time.Time {
	if u.since.IsZero() {
		return capacityEnd
	}
	return minTime(capacityEnd, u.since.Add(hold))
}

// cut says whether the unreachable hold, not the capacity hold, ends the
// request's holds: only then is its end weir's 503 naming the cause. A
// request that fails fast (capacity_hold 0), or whose capacity hold ends
// first, is answered as any other. Pure.
func (u unreachableState) cut(capacityEnd time.Time, hold time.Duration) bool {
	return !u.since.IsZero() && u.since.Add(hold).Before(capacityEnd)
}

// unreachableMessage names the cause: "every account's upstream is
// unreachable: dns: no such host for api.example.invalid".
func unreachableMessage(u *weirv1.Unreachable) string {
	msg := "every account's upstream is unreachable: " + causeName(u.GetCause())
	switch {
	case u.GetCause() == weirv1.TransportCause_TRANSPORT_CAUSE_PROXY && u.GetError() != "":
		// The error names the proxy itself: "egress proxy
		// socks5://10.0.0.7:1080 could not be reached (connection refused)".
		msg = "every account's upstream is unreachable: " + u.GetError()
	case u.GetError() != "":
		msg += ": " + u.GetError()
	}
	if u.GetHost() != "" {
		msg += " for " + u.GetHost()
	}
	return msg
}

// errUnreachable answers a request whose pool is unreachable: 503, no
// Retry-After, and final: no other account could serve it (one that can,
// or could soon, keeps the capacity hold).
func errUnreachable(u *weirv1.Unreachable) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, typ: "api_error", message: "weir: " + unreachableMessage(u), final: true}
}

// heldText says how long a request was held, and how long it could have
// been: "held 20m0s of a 20m0s budget".
func heldText(rt *routing) string {
	held := rt.rec.GetHeld().AsDuration().Round(time.Millisecond)
	return "held " + held.String() + " of a " + rt.holdEnd.Sub(rt.in.start).Round(time.Second).String() + " budget"
}

// quotaVerdict is a pool out of quota past the hold, in one line: every
// account that could serve the model is out of quota, the first back at
// its reset (or at no known time).
func quotaVerdict(qb *weirv1.QuotaBlock, model string) string {
	msg := fmt.Sprintf("every account that serves %s is out of quota past the hold budget (%d accounts", model, qb.GetAccounts())
	if qb.GetResetsAt() != nil {
		msg += ", the first back at " + qb.GetResetsAt().AsTime().UTC().Format(time.RFC3339) + ")"
	} else {
		msg += ", none with a known reset)"
	}
	if qb.GetLastUpstreamError() != "" {
		msg += ": " + qb.GetLastUpstreamError()
	}
	return msg
}
