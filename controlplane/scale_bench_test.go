package controlplane

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/seal"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/rpcclient"
)

// scaleSize reads a size from the environment, else def.
func scaleSize(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// BenchmarkAcquireAtScale is one control plane as a large deployment
// runs it: 10,000 accounts in every state (some cooling, some gated for
// Sonnet, some paused, half with usage readings), 1,000 client keys and
// 100 workers, each with its own connection and its own WatchPool stream.
// The workers share an open-loop rate of Acquires (WEIR_SCALE_RATE a
// second, 200 by default), each followed by its Release, over b.N
// requests. It reports Acquire's latency as the workers see it (p50,
// p99, max), the CPU per request of this process (the control plane and
// the workers' clients; Postgres apart), the Postgres write transactions
// and WAL per request, and,
// with the load stopped, the CPU one pool invalidation costs the process
// (the notification, the routing cache's mark, and the message to each of
// the 100 streams), and how long the routing cache's whole read takes
// (a new listening epoch, an "all"; the rolling refresh reads as much
// over each cycle, in slices: routeReadShare). Sizes: WEIR_SCALE_ACCOUNTS, WEIR_SCALE_KEYS,
// WEIR_SCALE_WORKERS.
//
//	go test ./controlplane -run x -bench AcquireAtScale -benchtime 4000x
func BenchmarkAcquireAtScale(b *testing.B) {
	accounts := scaleSize("WEIR_SCALE_ACCOUNTS", 10000)
	keys := scaleSize("WEIR_SCALE_KEYS", 1000)
	workers := scaleSize("WEIR_SCALE_WORKERS", 100)
	rate := scaleSize("WEIR_SCALE_RATE", 200)
	srv := benchServer(b)
	pool := srv.pool
	ctx := b.Context()
	hashes := scalePool(b, srv, accounts, keys)
	if err := srv.Start(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Stop(context.Background()) }) //nolint:errcheck // jobs are off: nothing to drain
	ts := startH2C(b, srv.Handler())

	// The workers: a connection and a WatchPool stream each.
	clients := make([]weirv1connect.LeaseServiceClient, workers)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	var watching sync.WaitGroup
	for i := range clients {
		hc := rpcclient.HTTPClient()
		b.Cleanup(hc.CloseIdleConnections)
		clients[i] = weirv1connect.NewLeaseServiceClient(hc, ts.URL, connect.WithInterceptors(rpcclient.Token(srv.cfg.DataplaneToken)))
		stream, err := clients[i].WatchPool(wctx, connect.NewRequest(&weirv1.WatchPoolRequest{}))
		if err != nil {
			b.Fatal(err)
		}
		if !stream.Receive() || !stream.Msg().Ready {
			b.Fatalf("worker %d: no ready: %v", i, stream.Err())
		}
		watching.Add(1)
		go func() {
			defer watching.Done()
			for stream.Receive() {
			}
		}()
	}
	// One warm-up Acquire reads the cache whole.
	scaleRequest(b, clients[0], hashes[0], "warm-up")

	w0, cpu0 := pgWrites(b, pool), cpuTime()
	jobs := make(chan int)
	lat := make([]time.Duration, b.N)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for i := range jobs {
				t0 := time.Now()
				if !scaleRequest(b, clients[w], hashes[i%len(hashes)], "s-"+strconv.Itoa(i%(4*keys))) {
					failed.Add(1)
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	b.ResetTimer()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	for i := range b.N {
		<-tick.C
		jobs <- i
	}
	tick.Stop()
	close(jobs)
	wg.Wait()
	b.StopTimer()
	w1, cpu1 := pgWrites(b, pool), cpuTime()

	// With the load stopped: what an invalidation costs, fanned out to
	// every stream.
	const invalidations = 200
	target := uuid.MustParse(scaleAccountID(b, pool))
	before := cpuTime()
	for i := range invalidations {
		if _, err := pool.Exec(ctx, `UPDATE accounts SET priority = $2 WHERE id = $1`, target, i%2); err != nil {
			b.Fatal(err)
		}
	}
	// Returns once every stream has sent what was committed before it.
	srv.watch.announce(ctx)
	fanout := cpuTime() - before
	stopWatch()
	watching.Wait()

	// What a whole read of the routing cache costs.
	const reloads = 5
	r0 := time.Now()
	for range reloads {
		if err := srv.routes.reload(ctx, srv.watch.listening(), true); err != nil {
			b.Fatal(err)
		}
	}
	reload := time.Since(r0) / reloads

	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "max-µs")
	b.ReportMetric(float64(failed.Load()), "refused")
	b.ReportMetric(float64(w1.xid-w0.xid)/float64(b.N), "pg-write-tx/req")
	b.ReportMetric(float64(w1.wal-w0.wal)/float64(b.N), "wal-B/req")
	b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "cpu-µs/req")
	b.ReportMetric(float64(fanout.Microseconds())/invalidations, "cpu-µs/invalidation")
	b.ReportMetric(float64(reload.Microseconds())/1000, "cache-read-ms")
}

// scaleRequest is one request as a worker makes it that cannot reuse a
// lease: Acquire, then Release with a success. False when no account was
// leased.
func scaleRequest(b *testing.B, c weirv1connect.LeaseServiceClient, hash, session string) bool {
	resp, err := c.Acquire(b.Context(), connect.NewRequest(&weirv1.AcquireRequest{
		KeyHash: hash, Model: "claude-sonnet-4-5", SessionKey: session, RequestId: "scale-" + randid.Hex(6),
		Surface: weirv1.Surface_SURFACE_MESSAGES,
	}))
	if err != nil {
		b.Errorf("acquire: %v", err)
		return false
	}
	lease := resp.Msg.GetLease()
	if lease == nil {
		return false
	}
	if _, err := c.Release(b.Context(), connect.NewRequest(&weirv1.ReleaseRequest{LeaseId: lease.Id,
		Outcome: &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200}})); err != nil {
		b.Errorf("release: %v", err)
	}
	return true
}

// scalePool writes n accounts and k keys straight to Postgres (the
// calls would take minutes at this size), and puts the accounts in every
// state: a tenth cooling, a tenth gated for Sonnet, one in fifty paused,
// half with 5-hour and weekly readings. It returns the keys' hashes.
func scalePool(b *testing.B, srv *Server, n, k int) []string {
	ctx := b.Context()
	now := time.Now()
	err := pgx.BeginFunc(ctx, srv.pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		for i := range n {
			id := uuid.New()
			cred := apiKey()
			if _, err := q.CreateAccount(ctx, db.CreateAccountParams{ID: id, Provider: providerAnthropic, AuthKind: "api_key",
				Label: fmt.Sprintf("scale-%05d", i), MaxConcurrency: 4, CredentialSealed: srv.seal.Seal(id, 1, cred),
				CredentialHint: seal.Hint(cred), Now: now}); err != nil {
				return err
			}
		}
		for _, stmt := range []string{
			`INSERT INTO cooldowns (account_id, reason, transient, until, written_at, evidence)
			 SELECT id, 'rate_limited', true, $1::timestamptz + interval '1 hour', $1, '{}' FROM accounts WHERE label LIKE '%0'`,
			`INSERT INTO family_gates (account_id, family, until, written_at, evidence)
			 SELECT id, 'sonnet', $1::timestamptz + interval '3 hours', $1, '{}' FROM accounts WHERE label LIKE '%1'`,
			`UPDATE accounts SET paused = true, updated_at = $1 WHERE label LIKE '%52'`,
			`INSERT INTO usage_windows (account_id, window_name, utilization, resets_at, source, observed_at, credential_revision, poll_epoch)
			 SELECT id, w, (substr(label, 7)::int % 97) / 100.0, $1::timestamptz + interval '2 hours' + (substr(label, 7)::int % 300) * interval '1 minute', 'header', $1, 1, 1
			 FROM accounts, unnest(ARRAY['five_hour', 'seven_day']) AS w WHERE substr(label, 7)::int % 2 = 0`,
		} {
			if _, err := tx.Exec(ctx, stmt, now); err != nil {
				return fmt.Errorf("%s: %w", stmt, err)
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	hashes := make([]string, k)
	for i := range hashes {
		hashes[i] = HashKey("sk-weir-" + randid.Hex(24))
		if _, err := srv.q.CreateKey(ctx, db.CreateKeyParams{Name: fmt.Sprintf("scale-%04d", i), KeyHash: hashes[i], Prefix: "sk-weir", Now: now}); err != nil {
			b.Fatal(err)
		}
	}
	return hashes
}

func scaleAccountID(b *testing.B, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) string {
	var id string
	if err := pool.QueryRow(b.Context(), `SELECT id::text FROM accounts ORDER BY label LIMIT 1`).Scan(&id); err != nil {
		b.Fatal(err)
	}
	return id
}

// writes is where Postgres's transaction ids and WAL stand.
type writes struct{ xid, wal int64 }

func pgWrites(b *testing.B, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) writes {
	var w writes
	if err := pool.QueryRow(b.Context(), `SELECT txid_current(), pg_current_wal_lsn() - '0/0'::pg_lsn`).Scan(&w.xid, &w.wal); err != nil {
		b.Fatal(err)
	}
	return w
}

// cpuTime is this process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
