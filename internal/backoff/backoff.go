// Package backoff is the one capped doubling every wait in weir uses:
// cooldowns after repeated failures, the usage reader's and the token
// refresher's pauses, the hold's backoff, and the loops that send again
// what a control plane did not take.
package backoff

import "time"

// Capped is base doubled n times (n ≤ 0: base), at most limit.
func Capped(base, limit time.Duration, n int) time.Duration {
	d := base
	for i := 0; i < n && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// Next is the wait after d in a doubling loop: twice d, at least floor
// (the first wait, when d is 0) and at most limit.
func Next(d, floor, limit time.Duration) time.Duration {
	return min(max(2*d, floor), limit)
}
