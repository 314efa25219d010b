package jobs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
)

// partitionsOf lists table's partitions, the default one included, by name.
func (f *fixture) partitionsOf(t *testing.T, table string) []string {
	t.Helper()
	rows, err := f.pool.Query(t.Context(), `SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = $1::regclass ORDER BY 1`, table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		out = append(out, name)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// routeEvent writes a route event started at at straight into the table
// and returns its id.
func (f *fixture) routeEvent(t *testing.T, id string, at time.Time, pending bool) int64 {
	t.Helper()
	var until any
	if pending {
		until = at.Add(time.Minute)
	}
	var n int64
	if err := f.pool.QueryRow(t.Context(), `INSERT INTO route_events (request_id, surface, model, stream, status, error_type,
		attempts, duration_ms, input_tokens, output_tokens, started_at, recorded_at, pending_until)
		VALUES ($1, 'messages', 'm', false, 200, '', 1, 1, 0, 0, $2, $2, $3) RETURNING id`, id, at, until).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// whereIs names the partition holding request id's route event, or "" if
// there is none.
func (f *fixture) whereIs(t *testing.T, id string) string {
	t.Helper()
	var part string
	err := f.pool.QueryRow(t.Context(), `SELECT tableoid::regclass::text FROM route_events WHERE request_id = $1`, id).Scan(&part)
	if err != nil && err.Error() != "no rows in result set" {
		t.Fatal(err)
	}
	return part
}

func partitionDeps(f *fixture, at *time.Time, keep, usageKeep *time.Duration) Deps {
	return Deps{Queries: f.q, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: func() time.Time { return *at },
		Retention:      func(context.Context) (time.Duration, error) { return *keep, nil },
		UsageRetention: func(context.Context) (time.Duration, error) { return *usageKeep, nil }}
}

// TestPartitionsAhead: maintenance makes the partitions of today and the
// two days after it (the usage rollup's: this month and the next), and a
// write of today lands in today's; a second run changes nothing.
func TestPartitionsAhead(t *testing.T) {
	t.Parallel()
	f := setup(t)
	at, keep, usageKeep := now, 30*24*time.Hour, 400*24*time.Hour
	d := partitionDeps(f, &at, &keep, &usageKeep)
	counts, err := MaintainPartitions(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int32{"route_events": 3, "account_history": 3, "usage_hourly": 2}
	// (It drops the partitions the migration made, years before now.)
	for _, c := range counts {
		if c.Created != want[c.Table] {
			t.Errorf("%s: created %d; want %d", c.Table, c.Created, want[c.Table])
		}
	}
	for table, names := range map[string][]string{
		"route_events":    {"route_events_p20300304", "route_events_p20300305", "route_events_p20300306", "route_events_default"},
		"account_history": {"account_history_p20300304", "account_history_p20300305", "account_history_p20300306", "account_history_default"},
		"usage_hourly":    {"usage_hourly_p203003", "usage_hourly_p203004", "usage_hourly_default"},
	} {
		got := f.partitionsOf(t, table)
		for _, n := range names {
			if !slices.Contains(got, n) {
				t.Errorf("%s: no %s among %v", table, n, got)
			}
		}
	}
	f.routeEvent(t, "today", now, false)
	if p := f.whereIs(t, "today"); p != "route_events_p20300304" {
		t.Errorf("today's event is in %q", p)
	}
	counts, err = MaintainPartitions(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range counts {
		if c.Created != 0 || c.Dropped != 0 || c.Purged != 0 {
			t.Errorf("second run changed %+v", c)
		}
	}
}

// TestPartitionsDefaultCatches: a write of a day without a partition, far
// in the past or the future, lands in the default partition, never
// refused; maintenance moves it into a partition of its own day, the
// same row (its id kept), and a row of a day past retention goes.
func TestPartitionsDefaultCatches(t *testing.T) {
	t.Parallel()
	f := setup(t)
	at, keep, usageKeep := now, 30*24*time.Hour, 400*24*time.Hour
	d := partitionDeps(f, &at, &keep, &usageKeep)
	past, future, gone := now.Add(-20*24*time.Hour), now.Add(3*365*24*time.Hour), now.Add(-40*24*time.Hour)
	ids := map[string]int64{}
	for name, when := range map[string]time.Time{"past": past, "future": future, "gone": gone} {
		ids[name] = f.routeEvent(t, name, when, false)
		if p := f.whereIs(t, name); p != "route_events_default" {
			t.Fatalf("%s: written to %q, want the default partition", name, p)
		}
	}
	if _, err := f.pool.Exec(t.Context(), `INSERT INTO account_history (account_id, at, kind, reason, until)
		VALUES ($1, $2, 'cooldown', 'rate_limited', $2)`, f.account, future); err != nil {
		t.Fatal(err)
	}
	counts, err := MaintainPartitions(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	if c := counts[0]; c.Table != "route_events" || c.Created != 5 || c.Purged != 1 {
		t.Errorf("route events: %+v; want 5 partitions (the 2 strays' days, today and 2 ahead) and the stray past retention deleted", c)
	}
	for name, part := range map[string]string{"past": "route_events_p" + past.Format("20060102"),
		"future": "route_events_p" + future.Format("20060102"), "gone": ""} {
		if p := f.whereIs(t, name); p != part {
			t.Errorf("%s: in %q, want %q", name, p, part)
		}
	}
	for _, name := range []string{"past", "future"} {
		var id int64
		if err := f.pool.QueryRow(t.Context(), `SELECT id FROM route_events WHERE request_id = $1`, name).Scan(&id); err != nil || id != ids[name] {
			t.Errorf("%s: id %d (%v), want %d", name, id, err, ids[name])
		}
	}
	var n int
	if err := f.pool.QueryRow(t.Context(), `SELECT count(*) FROM account_history_default`).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d account history rows left in the default partition (%v)", n, err)
	}
	if err := f.pool.QueryRow(t.Context(), `SELECT count(*) FROM account_history`).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d account history rows (%v), want the one", n, err)
	}
}

// TestPartitionsRetention: partitions wholly older than now less the
// retention are dropped, the rest kept; a partition holding a pending
// event (a request in progress) stays until it is final; a shorter
// retention drops more at the next run. The usage rollup goes by month
// under usage_retention.
func TestPartitionsRetention(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	at, keep, usageKeep := now.Add(-10*24*time.Hour), 3*24*time.Hour, 60*24*time.Hour
	d := partitionDeps(f, &at, &keep, &usageKeep)
	// Ten days of partitions, made ahead as days went by, under a long
	// retention.
	keep = 365 * 24 * time.Hour
	for range 10 {
		if _, err := MaintainPartitions(ctx, d); err != nil {
			t.Fatal(err)
		}
		at = at.Add(24 * time.Hour)
	}
	at, keep = now, 3*24*time.Hour
	for i := range 10 {
		f.routeEvent(t, fmt.Sprint("day-", i), now.Add(-time.Duration(i)*24*time.Hour), false)
	}
	f.routeEvent(t, "old-pending", now.Add(-6*24*time.Hour).Add(time.Hour), true)
	for i, m := range []int{0, 1, 2, 3} {
		hour := time.Date(2030, time.March-time.Month(m), 1, 5, 0, 0, 0, time.UTC)
		if _, err := f.pool.Exec(ctx, `INSERT INTO usage_hourly (hour, key_id, account_id, model, session_key, requests)
			VALUES ($1, $2, $2, 'm', $3, 1)`, hour, uuid.Nil, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	counts, err := MaintainPartitions(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	// Kept: the days from now-3d's (whose end is past the cutoff) on. The
	// day of old-pending stays with it.
	var left []string
	rows, err := f.pool.Query(ctx, `SELECT request_id FROM route_events ORDER BY started_at DESC`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		left = append(left, id)
	}
	if fmt.Sprint(left) != "[day-0 day-1 day-2 day-3 old-pending day-6]" {
		t.Errorf("route events left: %v", left)
	}
	if c := counts[0]; c.Dropped != 6 || c.Purged != 0 {
		t.Errorf("route events: %+v; want 6 days dropped (now-10d to -4d but the pending one's), none through the default partition", c)
	}
	gone := f.partitionsOf(t, "route_events")
	if slices.Contains(gone, "route_events_p"+now.Add(-4*24*time.Hour).Format("20060102")) ||
		!slices.Contains(gone, "route_events_p"+now.Add(-3*24*time.Hour).Format("20060102")) {
		t.Errorf("partitions left: %v", gone)
	}
	// 60 days back from 4 March 2030 is 3 January: December goes, January
	// (not wholly past) stays.
	var months int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM usage_hourly`).Scan(&months); err != nil || months != 3 {
		t.Errorf("%d usage rows left (%v), want January to March", months, err)
	}

	// Finished, the pending event's day goes; a day's retention leaves today
	// and yesterday (whose end is less than a day ago).
	if _, err := f.pool.Exec(ctx, `UPDATE route_events SET pending_until = NULL WHERE request_id = 'old-pending'`); err != nil {
		t.Fatal(err)
	}
	keep = 24 * time.Hour
	if _, err := MaintainPartitions(ctx, d); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM route_events`).Scan(&n); err != nil || n != 2 {
		t.Errorf("%d route events left (%v), want today's and yesterday's", n, err)
	}
}
