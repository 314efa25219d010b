package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/weirhq/weir/controlplane/db"
)

// partitioned are the tables partitioned by time
// (sql/migrations/0036_partitioned_events.sql): the unit of a partition,
// how many units ahead of now have theirs made, and which setting says how
// long they are kept. Two days ahead of today: the retention job runs
// every RetentionInterval, and a day partition is there two days before
// its first write even if every run until then fails. usage_hourly's
// partitions are months (400 days of days would be 400 partitions for the
// planner to consider); the next month's exists from the start of this
// one.
var partitioned = []struct {
	table string
	unit  string
	ahead int32
	usage bool // kept usage_retention, else route_events_retention
}{
	{table: "route_events", unit: "day", ahead: 2},
	{table: "account_history", unit: "day", ahead: 2},
	{table: "usage_hourly", unit: "month", ahead: 1, usage: true},
}

// PartitionCounts is what one maintenance did to one table.
type PartitionCounts struct {
	Table   string
	Created int32
	Dropped int32
	// Purged counts the rows of its default partition deleted as past
	// retention (rows written where no partition was, since gone).
	Purged int64
}

// MaintainPartitions creates the partitions of every time-partitioned
// table ahead of now, moves what their default partitions caught into
// partitions of their own, and drops the partitions wholly older than now
// less the table's retention: route events and account history past
// route_events_retention, the usage rollup past usage_retention. A nil
// retention reader keeps the table's partitions. Retention thus goes by
// whole partitions: a row is kept its retention and at most one more
// partition's span (a day; a month for the usage rollup). A table busy
// beyond a second's lock wait is left for the next run (its writes land
// in the default partition meanwhile, none refused).
func MaintainPartitions(ctx context.Context, d Deps) ([]PartitionCounts, error) {
	keep := map[bool]func(context.Context) (time.Duration, error){false: d.Retention, true: d.UsageRetention}
	now := d.Now()
	out := make([]PartitionCounts, 0, len(partitioned))
	for _, p := range partitioned {
		var keepSeconds *float64
		if read := keep[p.usage]; read != nil {
			k, err := read(ctx)
			if err != nil {
				return out, fmt.Errorf("partitions: %s: read the retention: %w", p.table, err)
			}
			s := k.Seconds()
			keepSeconds = &s
		}
		r, err := d.Queries.MaintainPartitions(ctx, db.MaintainPartitionsParams{
			Parent: p.table, Unit: p.unit, Now: now, Ahead: p.ahead, KeepSeconds: keepSeconds})
		if err != nil {
			return out, fmt.Errorf("partitions: %s: %w", p.table, err)
		}
		c := PartitionCounts{Table: p.table, Created: r.Created, Dropped: r.Dropped, Purged: r.Purged}
		out = append(out, c)
		if c.Created > 0 || c.Dropped > 0 || c.Purged > 0 {
			d.Logger.InfoContext(ctx, "partitions maintained", "table", c.Table, "created", c.Created,
				"dropped", c.Dropped, "default_rows_deleted", c.Purged)
		}
	}
	return out, nil
}
