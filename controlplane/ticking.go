package controlplane

import (
	"context"
	"time"
)

// ticking runs one function on every tick of its own goroutine until it
// is stopped: the credential check and the lease clock.
type ticking struct {
	// tick, when set before start, replaces the interval's ticker (tests).
	tick   <-chan time.Time
	cancel context.CancelFunc
	done   chan struct{}
}

// start calls fn on every tick (every interval unless tick is set) until
// ctx ends or stop.
func (l *ticking) start(ctx context.Context, interval time.Duration, fn func(context.Context)) {
	tick := l.tick
	stopTicker := func() {}
	if tick == nil {
		t := time.NewTicker(interval)
		tick, stopTicker = t.C, t.Stop
	}
	ctx, l.cancel = context.WithCancel(ctx)
	l.done = make(chan struct{})
	go func() {
		defer close(l.done)
		defer stopTicker()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick:
			}
			fn(ctx)
		}
	}()
}

// stop ends the loop and waits for it; a loop never started is a no-op.
func (l *ticking) stop() {
	if l.cancel == nil {
		return
	}
	l.cancel()
	<-l.done
}
