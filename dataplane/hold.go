package dataplane

import (
	"time"
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
	d := min(holdBackoffBase<<min(n, 10), holdBackoffMax)
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
