package bench

import (
	"context"
	"time"
)

// clock is the scheduler's time source; tests inject one that never
// sleeps.
type clock interface {
	Now() time.Time
	// SleepUntil waits until t or until ctx ends (false).
	SleepUntil(ctx context.Context, t time.Time) bool
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) SleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

// plan is one open-loop step: n requests, the i-th due at start + i×interval,
// whatever happened to the earlier ones.
type plan struct {
	start    time.Time
	interval time.Duration
	n        int
}

// newPlan spreads rate requests a second over d, starting at start.
func newPlan(start time.Time, rate int, d time.Duration) plan {
	interval := time.Second / time.Duration(rate)
	return plan{start: start, interval: interval, n: int(d / interval)}
}

// due is when request i is scheduled: latency is measured from here, not
// from when it was actually sent, so a late sender cannot hide a slow
// target (no coordinated omission).
func (p plan) due(i int) time.Time { return p.start.Add(time.Duration(i) * p.interval) }

// run fires each request at its due time, never waiting for earlier ones
// to finish; fire must not block. It returns how many it fired (fewer
// when ctx ends).
func (p plan) run(ctx context.Context, clk clock, fire func(i int, due time.Time)) int {
	for i := range p.n {
		at := p.due(i)
		if !clk.SleepUntil(ctx, at) {
			return i
		}
		fire(i, at)
	}
	return p.n
}
