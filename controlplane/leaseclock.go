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

// startLeaseClock moves the clock every leaseClockEvery until ctx ends or
// Stop.
func (s *Server) startLeaseClock(ctx context.Context) {
	every := leaseClockEvery(s.cfg.LeaseTTL)
	failing := false
	s.clock.start(ctx, every, func(ctx context.Context) {
		tctx, cancel := context.WithTimeout(ctx, 5*every)
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
	})
}
