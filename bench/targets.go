package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/weirhq/weir/controlplane"
	"github.com/weirhq/weir/dataplane"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/migrate"
	"github.com/weirhq/weir/internal/pgembed"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/internal/sim"
)

// target is one thing the load is driven through.
type target struct {
	name string // "direct", "bare", "weir"
	url  string
	// key is the client's credential (x-api-key).
	key string
}

// listener serves h on a fresh loopback port until closed. h2c adds
// cleartext HTTP/2 (the control plane's Connect clients use it); agents
// and upstreams speak HTTP/1.1.
type listener struct {
	srv *http.Server
	url string
}

func serveLoopback(h http.Handler, h2c bool) (*listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 30 * time.Second, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	if h2c {
		srv.Protocols.SetUnencryptedHTTP2(true)
	}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	return &listener{srv: srv, url: "http://" + ln.Addr().String()}, nil
}

func (l *listener) close() { l.srv.Close() } //nolint:errcheck // teardown

// drain lets in-flight requests finish (up to 5 s) before closing: the
// data plane's handlers must be done before the data plane is closed.
func (l *listener) drain() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if l.srv.Shutdown(ctx) != nil {
		l.close()
	}
}

// upstreamTransport is how both proxies reach the simulator: the data
// plane's default upstream transport, so the bare proxy is not handicapped.
func upstreamTransport() *http.Transport {
	return &http.Transport{
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
		WriteBufferSize:       1 << 10,
		ReadBufferSize:        256,
	}
}

// bareProxy is a proxy that does nothing: it forwards to the simulator
// and flushes every write, as a streaming proxy must.
func bareProxy(simURL string) (http.Handler, error) {
	u, err := url.Parse(simURL)
	if err != nil {
		return nil, err
	}
	p := httputil.NewSingleHostReverseProxy(u)
	p.Transport = upstreamTransport()
	p.FlushInterval = -1
	p.ErrorLog = log.New(io.Discard, "", 0) // a client going away is not news
	return p, nil
}

// stack is the simulator, the bare proxy and weir, all in this process
// except Postgres.
type stack struct {
	sim    *listener
	simSrv *sim.Server
	bare   *listener
	cp, dp *listener
	cpSrv  *controlplane.Server
	dpSrv  *dataplane.Server
	// cpReg and dpReg hold the control plane's and the worker's metrics.
	cpReg, dpReg *prometheus.Registry
	cluster      *pgembed.Cluster
	pool         *pgxpool.Pool
	pgDir        string
	rpc          *rpcTimer
	key          string
	// creds are the accounts' credentials, as the simulator knows them.
	creds []string
	// dpToken is the data-plane token, for worker children.
	dpToken string
	log     *slog.Logger
}

// accountCount × accountCap leases may be in flight: more than the idle
// stream test opens, so the pool never runs out.
const (
	accountCount = 8
	accountCap   = 1000
)

// startStack starts everything; stop tears it down in reverse.
func startStack(ctx context.Context, cfg Config, simLatency time.Duration) (_ *stack, err error) {
	s := &stack{log: cfg.Logger, rpc: newRPCTimer(), dpReg: prometheus.NewRegistry(), cpReg: prometheus.NewRegistry()}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	// The simulator knows the accounts from the start (the storm scripts
	// faults on each by name), and accepts the direct targets' key too.
	script := sim.Script{AcceptUnknown: true}
	for i := range accountCount {
		cred := "sk-ant-api03-bench-" + randomHex(12)
		s.creds = append(s.creds, cred)
		script.Accounts = append(script.Accounts, sim.AccountScript{Name: accountName(i), Kind: sim.KindAPIKey, Credential: cred})
	}
	s.simSrv = sim.New(sim.Config{Script: script, Latency: simLatency, DeltaDelay: 15 * time.Millisecond, Deltas: 32})
	if s.sim, err = serveLoopback(s.simSrv, false); err != nil {
		return nil, fmt.Errorf("simulator: %w", err)
	}
	bp, err := bareProxy(s.sim.url)
	if err != nil {
		return nil, err
	}
	if s.bare, err = serveLoopback(bp, false); err != nil {
		return nil, fmt.Errorf("bare proxy: %w", err)
	}

	if s.pgDir, err = os.MkdirTemp("", "weir-bench-pg-"); err != nil {
		return nil, err
	}
	s.cluster, err = pgembed.Start(ctx, pgembed.Config{DataDir: filepath.Join(s.pgDir, "postgres"), Logger: s.log.With("component", "postgres")})
	if err != nil {
		return nil, fmt.Errorf("embedded postgres: %w", err)
	}
	if s.pool, err = pgxpool.New(ctx, s.cluster.URL()); err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	if err := migrate.Up(ctx, s.pool); err != nil {
		return nil, err
	}
	admin, dpToken := "weir_admin_"+randomHex(16), "weir_dp_"+randomHex(16)
	s.dpToken = dpToken
	secret := make([]byte, 32)
	rand.Read(secret) //nolint:errcheck // never fails on Linux
	cp, err := controlplane.New(controlplane.Config{
		AdminToken: admin, DataplaneToken: dpToken, SecretKey: secret,
		Logger:      slog.New(slog.DiscardHandler),
		DisableJobs: true, // River's periodic jobs are not on the request path
		Registry:    s.cpReg,
	}, s.pool)
	if err != nil {
		return nil, err
	}
	// The pool watch, which lease reuse needs (River's jobs stay off).
	if err := cp.Start(ctx); err != nil {
		return nil, err
	}
	s.cpSrv = cp
	if s.cp, err = serveLoopback(cp.Handler(), true); err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	if s.key, err = seed(ctx, s.cp.url, admin, s.sim.url, s.creds); err != nil {
		return nil, err
	}
	rpcc := rpcclient.HTTPClient()
	rpcc.Transport = s.rpc.wrap(rpcc.Transport)
	s.dpSrv, err = dataplane.New(dataplane.Config{
		ControlPlaneURL: s.cp.url, Token: dpToken, ControlPlane: rpcc,
		Logger: slog.New(slog.DiscardHandler), LeaseIdle: leaseIdle(cfg), Registry: s.dpReg,
	})
	if err != nil {
		return nil, err
	}
	if s.dp, err = serveLoopback(s.dpSrv.Handler(), false); err != nil {
		return nil, fmt.Errorf("data plane: %w", err)
	}
	return s, nil
}

// seed creates the API-key accounts, pointed at the simulator, and a
// client key.
func seed(ctx context.Context, cpURL, admin, simURL string, creds []string) (string, error) {
	hc := rpcclient.HTTPClient()
	opt := connect.WithInterceptors(rpcclient.Token(admin))
	accounts := weirv1connect.NewAccountServiceClient(hc, cpURL, opt)
	keys := weirv1connect.NewKeyServiceClient(hc, cpURL, opt)
	for i, cred := range creds {
		_, err := accounts.CreateAccount(ctx, connect.NewRequest(&weirv1.CreateAccountRequest{
			Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY,
			Label: accountName(i), Credential: cred,
			BaseUrl: simURL, MaxConcurrency: accountCap,
		}))
		if err != nil {
			return "", fmt.Errorf("create account: %w", err)
		}
	}
	k, err := keys.CreateKey(ctx, connect.NewRequest(&weirv1.CreateKeyRequest{Name: "bench"}))
	if err != nil {
		return "", fmt.Errorf("create key: %w", err)
	}
	return k.Msg.Secret, nil
}

func (s *stack) targets() []target {
	return []target{
		{name: "direct", url: s.sim.url, key: "sk-ant-api03-bench-direct"},
		{name: "bare", url: s.bare.url, key: "sk-ant-api03-bench-direct"},
		{name: "weir", url: s.dp.url, key: s.key},
	}
}

func (s *stack) stop() {
	if s.dp != nil {
		s.dp.drain()
	}
	if s.dpSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.dpSrv.Close(ctx)
		cancel()
	}
	if s.cpSrv != nil {
		s.cpSrv.Stop(context.Background()) //nolint:errcheck // River is off: only the watch stops
	}
	for _, l := range []*listener{s.cp, s.bare, s.sim} {
		if l != nil {
			l.close()
		}
	}
	if s.pool != nil {
		s.pool.Close()
	}
	if s.cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		if err := s.cluster.Stop(ctx); err != nil {
			s.log.Warn("stop postgres", "err", err)
		}
		cancel()
	}
	if s.pgDir != "" {
		os.RemoveAll(s.pgDir) //nolint:errcheck // a temp dir
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) //nolint:errcheck // never fails on Linux
	return hex.EncodeToString(b)
}

// rpcTimer times the data plane's LeaseService calls as the worker sees
// them (the control plane exports a histogram for Acquire only).
type rpcTimer struct {
	mu sync.Mutex
	ds map[string][]time.Duration // method → durations since the last take
}

func newRPCTimer() *rpcTimer { return &rpcTimer{ds: map[string][]time.Duration{}} }

type timedTransport struct {
	next http.RoundTripper
	t    *rpcTimer
}

func (t *rpcTimer) wrap(next http.RoundTripper) http.RoundTripper {
	return timedTransport{next: next, t: t}
}

// RoundTrip times a unary call up to its response headers; Connect unary
// answers are small, so that is the call.
func (tt timedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	method := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
	start := time.Now()
	res, err := tt.next.RoundTrip(r)
	d := time.Since(start)
	if err == nil && (method == "Acquire" || method == "Release" || method == "ReleaseBatch") {
		tt.t.mu.Lock()
		tt.t.ds[method] = append(tt.t.ds[method], d)
		tt.t.mu.Unlock()
	}
	return res, err
}

// take returns and forgets what was timed so far.
func (t *rpcTimer) take() map[string][]time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.ds
	t.ds = map[string][]time.Duration{}
	return out
}

// leaseIdle is the worker's LeaseIdle for the run: its default, or off.
func leaseIdle(cfg Config) time.Duration {
	if cfg.NoLeaseReuse {
		return -1
	}
	return 0
}

// accountName is the i-th account's label in weir and name in the
// simulator.
func accountName(i int) string { return fmt.Sprintf("bench-%d", i) }
