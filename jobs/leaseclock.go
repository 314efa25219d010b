package jobs

import (
	"context"
	"time"

	"github.com/weirhq/weir/controlplane/db"
)

// MoveLeaseClock moves the lease clock to now (0021_lease_clock.sql):
// after a gap longer than a third of the lease TTL in which no control
// plane touched it (every one was down, or their Postgres was), the
// leases and pending route events live when the gap began are renewed as
// of now. A live lease is renewed every third of its TTL, so a shorter
// gap costs nothing its place. It returns how many leases that renewed;
// a ttl of 0 moves nothing.
func MoveLeaseClock(ctx context.Context, q *db.Queries, now time.Time, ttl time.Duration) (int64, error) {
	if ttl <= 0 {
		return 0, nil
	}
	return q.TickLeaseClock(ctx, db.TickLeaseClockParams{Now: now, GapSeconds: (ttl / 3).Seconds(), TtlSeconds: ttl.Seconds()})
}
