package controlplane

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/rpcclient"
)

// BenchmarkAcquireRelease is one request's round trip through the control
// plane as a worker makes it: Acquire, then Release with a success, over
// Connect (HTTP/2 cleartext) and a real Postgres, on a pool of accounts.
// It reports the two halves separately (acquire-µs, release-µs).
func BenchmarkAcquireRelease(b *testing.B) {
	for _, tc := range []struct {
		name     string
		accounts int
	}{{"accounts=4", 4}, {"accounts=64", 64}, {"accounts=1000", 1000}, {"accounts=10000", 10000}} {
		accounts := tc.accounts
		b.Run(tc.name, func(b *testing.B) {
			srv := benchServer(b)
			cfg := srv.cfg
			ts := startH2C(b, srv.Handler())
			hc := rpcclient.HTTPClient()
			admin := connect.WithInterceptors(rpcclient.Token(cfg.AdminToken))
			accts := weirv1connect.NewAccountServiceClient(hc, ts.URL, admin)
			keys := weirv1connect.NewKeyServiceClient(hc, ts.URL, admin)
			leases := weirv1connect.NewLeaseServiceClient(hc, ts.URL, connect.WithInterceptors(rpcclient.Token(cfg.DataplaneToken)))
			ctx := b.Context()
			for i := range accounts {
				if _, err := accts.CreateAccount(ctx, connect.NewRequest(&weirv1.CreateAccountRequest{
					Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY,
					Label: "bench-" + randid.Hex(4) + "-" + strconv.Itoa(i), Credential: apiKey(), MaxConcurrency: 1000,
				})); err != nil {
					b.Fatal(err)
				}
			}
			key, err := keys.CreateKey(ctx, connect.NewRequest(&weirv1.CreateKeyRequest{Name: "bench"}))
			if err != nil {
				b.Fatal(err)
			}
			hash := HashKey(key.Msg.Secret)
			// Started, as a replica runs: Acquire routes over the routing
			// cache, kept true by the pool notifications.
			if err := srv.Start(ctx); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { srv.Stop(context.Background()) }) //nolint:errcheck // jobs are off: nothing to drain
			var acq, rel time.Duration
			b.ResetTimer()
			for b.Loop() {
				t0 := time.Now()
				resp, err := leases.Acquire(ctx, connect.NewRequest(&weirv1.AcquireRequest{
					KeyHash: hash, Model: "claude-sonnet-4-5", SessionKey: "bench-session", RequestId: "bench",
					Surface: weirv1.Surface_SURFACE_MESSAGES,
				}))
				if err != nil || resp.Msg.GetLease() == nil {
					b.Fatalf("acquire: %v %v", err, resp.Msg.GetNoAccount())
				}
				t1 := time.Now()
				if _, err := leases.Release(ctx, connect.NewRequest(&weirv1.ReleaseRequest{LeaseId: resp.Msg.GetLease().Id,
					Outcome: &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200}})); err != nil {
					b.Fatal(err)
				}
				acq += t1.Sub(t0)
				rel += time.Since(t1)
			}
			b.ReportMetric(float64(acq.Microseconds())/float64(b.N), "acquire-µs")
			b.ReportMetric(float64(rel.Microseconds())/float64(b.N), "release-µs")
		})
	}
}

// BenchmarkAcquireQueries times Acquire's two Postgres round trips alone
// (the routing view, the claim and its release), without Connect.
func BenchmarkAcquireQueries(b *testing.B) {
	srv := benchServer(b)
	ctx := b.Context()
	a := srv.accountService()
	for i := range 4 {
		if _, err := a.CreateAccount(ctx, connect.NewRequest(&weirv1.CreateAccountRequest{
			Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY,
			Label: "q-" + string(rune('a'+i)), Credential: apiKey(), MaxConcurrency: 1000,
		})); err != nil {
			b.Fatal(err)
		}
	}
	key, err := srv.keyService().CreateKey(ctx, connect.NewRequest(&weirv1.CreateKeyRequest{Name: "q"}))
	if err != nil {
		b.Fatal(err)
	}
	hash := HashKey(key.Msg.Secret)
	l := srv.leases()
	var view, claim, release time.Duration
	for b.Loop() {
		t0 := time.Now()
		v, err := srv.leases().routingView(ctx, hash, "claude-sonnet-4-5", "s", "sonnet", waiter{}, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		row := v.snap.row(&v.all()[0])
		lease, err := l.claim(ctx, row, v.egressDefault, v.key.id, &weirv1.AcquireRequest{Model: "claude-sonnet-4-5", RequestId: "q"}, time.Now(), true, false)
		if err != nil || lease == nil {
			b.Fatalf("claim: %v", err)
		}
		t2 := time.Now()
		if _, err := l.Release(ctx, connect.NewRequest(&weirv1.ReleaseRequest{LeaseId: lease.Id,
			Outcome: &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200}})); err != nil {
			b.Fatal(err)
		}
		view += t1.Sub(t0)
		claim += t2.Sub(t1)
		release += time.Since(t2)
	}
	b.ReportMetric(float64(view.Microseconds())/float64(b.N), "view-µs")
	b.ReportMetric(float64(claim.Microseconds())/float64(b.N), "claim-µs")
	b.ReportMetric(float64(release.Microseconds())/float64(b.N), "release-µs")
}

// benchServer is a control plane over a fresh Postgres, without jobs, for
// benchmarks that call its services directly.
func benchServer(b *testing.B) *Server {
	b.Helper()
	cfg := Config{AdminToken: "admin-" + randid.Hex(16), DataplaneToken: "dataplane-" + randid.Hex(16),
		SecretKey: randid.Bytes(32), DisableJobs: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	srv, err := New(cfg, pgtest.NewPool(b))
	if err != nil {
		b.Fatal(err)
	}
	return srv
}

// BenchmarkTakeRequestToken is what a rate-limited key adds to each of its
// requests: one TakeRequestToken over Connect (one statement on the key's
// bucket row). VerifyKey, on the same connection, is the scale.
func BenchmarkTakeRequestToken(b *testing.B) {
	srv := benchServer(b)
	cfg := srv.cfg
	ts := startH2C(b, srv.Handler())
	hc := rpcclient.HTTPClient()
	keys := weirv1connect.NewKeyServiceClient(hc, ts.URL, connect.WithInterceptors(rpcclient.Token(cfg.AdminToken)))
	leases := weirv1connect.NewLeaseServiceClient(hc, ts.URL, connect.WithInterceptors(rpcclient.Token(cfg.DataplaneToken)))
	// A limit no benchmark reaches: every call takes a token.
	key, err := keys.CreateKey(b.Context(), connect.NewRequest(&weirv1.CreateKeyRequest{Name: "bench", RateLimitPerMinute: maxRatePerMin}))
	if err != nil {
		b.Fatal(err)
	}
	hash := HashKey(key.Msg.Secret)
	b.Run("take", func(b *testing.B) {
		for b.Loop() {
			if _, err := leases.TakeRequestToken(b.Context(), connect.NewRequest(&weirv1.TakeRequestTokenRequest{KeyHash: hash})); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("verify", func(b *testing.B) {
		for b.Loop() {
			if _, err := leases.VerifyKey(b.Context(), connect.NewRequest(&weirv1.VerifyKeyRequest{KeyHash: hash})); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkPolicyInputs: converting one account and its cooldown for
// policy, which the routing view does for every account of every Acquire.
func BenchmarkPolicyInputs(b *testing.B) {
	a := db.Account{Provider: "anthropic", AuthKind: "oauth"}
	c := db.Cooldown{Reason: "rate_limited"}
	for b.Loop() {
		_ = policyAccount(a)
		_ = policyCooldown(c)
	}
}
