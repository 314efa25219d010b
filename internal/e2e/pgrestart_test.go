package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/weirhq/weir/internal/migrate"
	"github.com/weirhq/weir/internal/pgembed"
	"github.com/weirhq/weir/jobs"
)

// privateCluster starts a Postgres of the test's own (the shared one
// serves every other test and must not restart), migrated, on a fixed
// port so that it can be restarted at the same URL.
func privateCluster(t *testing.T, dir string, port int) *pgembed.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	c, err := pgembed.Start(ctx, pgembed.Config{DataDir: dir, Database: "weir", Port: port,
		ExtraSettings: map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}})
	if err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	t.Cleanup(func() { c.Stop(context.Background()) }) //nolint:errcheck // teardown
	return c
}

// migratedPool is a pool on cluster's database, migrated; maxConns 0 keeps
// pgx's default.
func migratedPool(t *testing.T, cluster *pgembed.Cluster, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := migrate.Up(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	return pool
}

// TestPostgresRestartUnderLoad: Postgres is shut down under load from two
// workers and started again on the same address.
//   - The control plane answers "unavailable" meanwhile: streams in flight
//     finish, new requests are held, and every client gets a 200.
//   - Its pgx pool reconnects by itself; River takes jobs again.
//   - What could not be stored meanwhile (Releases, route events) is sent
//     again by the workers and stored once: nothing is lost.
func TestPostgresRestartUnderLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cluster := privateCluster(t, dir, 0)
	port := cluster.Port()
	pool := migratedPool(t, cluster, 8)

	dpReg := prometheus.NewRegistry()
	e := setup(t, options{
		db:   pool,
		jobs: true,
		hold: time.Minute,
		// An Acquire whose answer the outage cuts off leaves a lease no
		// worker knows of: it stops counting at its TTL. A short TTL
		// bounds that here; what proves the outbox is every Release sent
		// again (below), not the lease count alone.
		leaseTTL:    3 * time.Second,
		deltaDelay:  15 * time.Millisecond,
		noDataplane: true,
		dpRegistry:  dpReg,
		accounts:    []account{{label: "a", maxConc: 16}, {label: "b", maxConc: 16}},
	})
	_, w1 := e.newDataplane(nil)
	_, w2 := e.newDataplane(nil)
	l := e.startLoad(8, w1.URL, w2.URL)
	defer l.finish()
	start := time.Now()
	eventually(t, "load to be served", func() bool { return l.count(start) >= 30 })

	holdsBefore := metricValue(t, dpReg, "weir_dataplane_holds_total", nil)
	stoppedAt := time.Now()
	if err := cluster.Stop(t.Context()); err != nil {
		t.Fatalf("stop postgres: %v", err)
	}
	eventually(t, "the attempts running at the stop to end, and new requests to be held", func() bool {
		return e.upstream.running() == 0 && metricValue(t, dpReg, "weir_dataplane_holds_total", nil) >= holdsBefore+4
	})
	restartedAt := time.Now()
	privateCluster(t, dir, port)
	eventually(t, "load to be served again", func() bool { return l.count(restartedAt) >= 30 })
	results := l.finish()

	judgeOutage(t, e, results, stoppedAt, restartedAt)

	// River takes jobs again: one inserted now runs to completion.
	ins, err := river.NewClient[pgx.Tx](riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		t.Fatal(err)
	}
	job, err := ins.Insert(t.Context(), jobs.LeaseReaperArgs{}, nil)
	if err != nil {
		t.Fatalf("insert a job after the restart: %v", err)
	}
	eventually(t, "a job inserted after the restart to complete", func() bool {
		var state string
		if err := pool.QueryRow(t.Context(), `SELECT state FROM river_job WHERE id = $1`, job.Job.ID).Scan(&state); err != nil {
			t.Fatal(err)
		}
		return state == "completed"
	})
}
