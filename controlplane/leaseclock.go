package controlplane

import (
	"context"
	"time"

	"github.com/weirhq/weir/jobs"
)

// The lease clock keeps the concurrency cap across outages
// (sql/migrations/0021_lease_clock.sql). A lease counts against its
// account until it is released or goes unrenewed past its expiry; when no
// control plane can reach Postgres, no worker can renew, and the leases
// of streams still running would lapse and be granted again over the cap.
// So each replica moves the clock every leaseClockEvery, and the first
// touch after a gap longer than a third of the TTL (the heartbeat's, a
// claim's, a renewal's or the reaper's; jobs.MoveLeaseClock) renews as of
// then every lease that was live when the gap began: its worker has a
// whole TTL to renew it for real. The rule:
//
//   - an outage of every control plane or of Postgres, of any length,
//     costs no lease its place (a lease whose worker died in it lapses
//     one TTL after the outage);
//   - a worker cut off alone from every control plane while the others
//     go on loses its leases after their TTL. Its renewal afterwards is
//     refused when the account's places were granted again meanwhile,
//     and the worker ends those requests (dataplane/keeper.go): the cap
//     is exceeded, at most, while the worker is cut off.

// leaseClockEvery is how often each replica moves the clock.
func leaseClockEvery(ttl time.Duration) time.Duration { return min(time.Second, ttl/10) }

// tickLeaseClock moves the clock once.
func (s *Server) tickLeaseClock(ctx context.Context) error {
	n, err := jobs.MoveLeaseClock(ctx, s.q, s.now(), s.cfg.LeaseTTL)
	if err != nil {
		return err
	}
	if n > 0 {
		s.log.WarnContext(ctx, "no control plane reached Postgres for a while: leases live when that began are renewed as of now", "leases", n)
	}
	return nil
}

// leaseClock is the running heartbeat.
type leaseClock struct {
	// tick, when set before Start, replaces the leaseClockEvery ticker
	// (tests).
	tick   <-chan time.Time
	cancel context.CancelFunc
	done   chan struct{}
}

// startLeaseClock moves the clock on every tick until ctx ends or Stop.
func (s *Server) startLeaseClock(ctx context.Context) {
	c := &s.clock
	tick := c.tick
	stopTicker := func() {}
	if tick == nil {
		t := time.NewTicker(leaseClockEvery(s.cfg.LeaseTTL))
		tick, stopTicker = t.C, t.Stop
	}
	ctx, c.cancel = context.WithCancel(ctx)
	c.done = make(chan struct{})
	go func() {
		defer close(c.done)
		defer stopTicker()
		failing := false
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick:
			}
			tctx, cancel := context.WithTimeout(ctx, leaseClockEvery(s.cfg.LeaseTTL)*5)
			err := s.tickLeaseClock(tctx)
			cancel()
			switch {
			case err != nil && ctx.Err() == nil && !failing:
				failing = true
				s.log.WarnContext(ctx, "lease clock: Postgres unreachable", "err", err)
			case err == nil && failing:
				failing = false
				s.log.InfoContext(ctx, "lease clock: Postgres reachable again")
			}
		}
	}()
}

// stopLeaseClock ends the heartbeat and waits for it.
func (s *Server) stopLeaseClock() {
	if s.clock.cancel == nil {
		return
	}
	s.clock.cancel()
	<-s.clock.done
}
