package bench

import (
	"context"
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
	"github.com/weirhq/weir/internal/pgembed"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/internal/sim"
	weirstack "github.com/weirhq/weir/internal/stack"
)

// target is one thing the load is driven through.
type target struct {
	name string // "direct", "bare", "weir"; "direct-chat", "weir-translated"
	url  string
	// key is the client's credential (x-api-key).
	key string
	// chat: the target is the simulator's Chat Completions, reached
	// directly (the reference for a translated request's upstream).
	chat bool
	// plain and stream are its request bodies; nil: the Messages ones.
	plain, stream []byte
	// header, when set, is how the client authenticates instead of key
	// (a peer gateway's own scheme, e.g. Authorization: Bearer).
	header http.Header
}

// serveLoopback serves h over HTTP/1.1 on a fresh loopback port until
// closed: the bare proxy, which agents and upstreams reach as they reach
// weir's worker.
func serveLoopback(h http.Handler) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 30 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	return srv, "http://" + ln.Addr().String(), nil
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

// stack is the simulator, the bare proxy and weir, all in this process:
// weir (Postgres, control plane, simulator, workers) is an
// internal/stack, the bare proxy the bench's own.
type stack struct {
	w      *weirstack.Stack
	simSrv *sim.Server
	bare   *http.Server
	// simURL, bareURL, cpURL and dpURL are where the simulator, the bare
	// proxy, the control plane and the first worker serve.
	simURL, bareURL, cpURL, dpURL string
	// workers are the data planes: workers[0] serves dpURL; the soak
	// starts a second.
	workers []*worker
	// cpReg holds the control plane's metrics.
	cpReg   *prometheus.Registry
	cluster *pgembed.Cluster
	pool    *pgxpool.Pool
	pgDir   string
	rpc     *rpcTimer
	key     string
	// creds are the Anthropic accounts' credentials, as the simulator
	// knows them; openAI the OpenAI accounts' (Responses).
	creds, openAI []string
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

// stackOptions shape one stack.
type stackOptions struct {
	logger     *slog.Logger
	simLatency time.Duration
	// leaseIdle is the workers' LeaseIdle (0: their default; -1: no reuse).
	leaseIdle time.Duration
	// openAI is how many OpenAI API-key accounts serve /v1/responses
	// besides the Anthropic ones.
	openAI int
}

// The simulator's stream shape when a request names none (a translated
// request carries none of the client's headers, sim.StreamHeader
// included).
const (
	simDeltas     = 32
	simDeltaDelay = 15 * time.Millisecond
)

// translatedAlias is the bench's translating alias: Messages requests for
// it go to the OpenAI accounts as Chat Completions.
const translatedAlias = "bench-translated"

// options are the stack options of a bench run at one simulator latency.
func (c Config) options(simLatency time.Duration) stackOptions {
	o := stackOptions{logger: c.Logger, simLatency: simLatency, leaseIdle: leaseIdle(c)}
	if !c.NoTranslation {
		o.openAI = accountCount
	}
	return o
}

// startStack starts everything with one worker; stop tears it down in
// reverse.
func startStack(ctx context.Context, o stackOptions) (_ *stack, err error) {
	s := &stack{log: o.logger, rpc: newRPCTimer(), cpReg: prometheus.NewRegistry()}
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	// The simulator knows the accounts from the start (the storm scripts
	// faults on each by name), and accepts the direct targets' key too.
	script := sim.Script{AcceptUnknown: true}
	for i := range accountCount {
		cred := "sk-ant-api03-bench-" + randid.Hex(12)
		s.creds = append(s.creds, cred)
		script.Accounts = append(script.Accounts, sim.AccountScript{Name: accountName(i), Kind: sim.KindAPIKey, Credential: cred})
	}
	for i := range o.openAI {
		cred := "sk-proj-bench-" + randid.Hex(12)
		s.openAI = append(s.openAI, cred)
		script.Accounts = append(script.Accounts, sim.AccountScript{Name: openAIName(i), Kind: sim.KindOpenAIKey, Credential: cred})
	}
	if s.pgDir, err = os.MkdirTemp("", "weir-bench-pg-"); err != nil {
		return nil, err
	}
	s.dpToken = "weir_dp_" + randid.Hex(16)
	admin := "weir_admin_" + randid.Hex(16)
	s.w, err = weirstack.Start(ctx, weirstack.Options{
		Logger: s.log, PostgresDir: filepath.Join(s.pgDir, "postgres"),
		// The bench's requests are done when it stops: a handler still
		// running then is not waited on for long.
		Drain: 5 * time.Second,
		ControlPlane: controlplane.Config{
			AdminToken: admin, DataplaneToken: s.dpToken, SecretKey: randid.Bytes(32),
			Logger:      slog.New(slog.DiscardHandler),
			DisableJobs: true, // River's periodic jobs are not on the request path
			Registry:    s.cpReg,
		},
		Sim: &sim.Config{Script: script, Latency: o.simLatency, DeltaDelay: simDeltaDelay, Deltas: simDeltas},
	})
	if err != nil {
		return nil, err
	}
	s.simSrv, s.simURL, s.cpURL = s.w.Sim, s.w.SimURL, s.w.ControlPlaneURL
	s.cluster, s.pool = s.w.Cluster, s.w.Pool
	bp, err := bareProxy(s.simURL)
	if err != nil {
		return nil, err
	}
	if s.bare, s.bareURL, err = serveLoopback(bp); err != nil {
		return nil, fmt.Errorf("bare proxy: %w", err)
	}
	if s.key, err = seed(ctx, s.cpURL, admin, s.simURL, s.creds, s.openAI); err != nil {
		return nil, err
	}
	w, err := s.startWorker(o.leaseIdle)
	if err != nil {
		return nil, err
	}
	s.dpURL = w.url
	return s, nil
}

// worker is one data plane of the stack.
type worker struct {
	url string
	// reg holds its metrics; upstream is its client to the simulator.
	reg      *prometheus.Registry
	upstream *http.Client
}

// startWorker starts a data plane against the stack's control plane, its
// LeaseService calls timed by s.rpc.
func (s *stack) startWorker(leaseIdle time.Duration) (*worker, error) {
	rpcc := rpcclient.HTTPClient()
	rpcc.Transport = s.rpc.wrap(rpcc.Transport)
	w := &worker{reg: prometheus.NewRegistry(), upstream: &http.Client{Transport: upstreamTransport()}}
	dp, err := s.w.StartWorker(dataplane.Config{
		ControlPlane: rpcc, Upstream: w.upstream,
		Logger: slog.New(slog.DiscardHandler), LeaseIdle: leaseIdle, Registry: w.reg,
	}, nil)
	if err != nil {
		return nil, err
	}
	w.url = dp.URL
	s.workers = append(s.workers, w)
	return w, nil
}

// seed creates the API-key accounts, pointed at the simulator, and a
// client key.
func seed(ctx context.Context, cpURL, admin, simURL string, creds, openAI []string) (string, error) {
	hc := rpcclient.HTTPClient()
	opt := connect.WithInterceptors(rpcclient.Token(admin))
	accounts := weirv1connect.NewAccountServiceClient(hc, cpURL, opt)
	keys := weirv1connect.NewKeyServiceClient(hc, cpURL, opt)
	create := func(p weirv1.Provider, label, cred, base string) error {
		_, err := accounts.CreateAccount(ctx, connect.NewRequest(&weirv1.CreateAccountRequest{
			Provider: p, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY,
			Label: label, Credential: cred, BaseUrl: base, MaxConcurrency: accountCap,
		}))
		if err != nil {
			return fmt.Errorf("create account: %w", err)
		}
		return nil
	}
	for i, cred := range creds {
		if err := create(weirv1.Provider_PROVIDER_ANTHROPIC, accountName(i), cred, simURL); err != nil {
			return "", err
		}
	}
	for i, cred := range openAI {
		if err := create(weirv1.Provider_PROVIDER_OPENAI, openAIName(i), cred, simURL+"/v1"); err != nil {
			return "", err
		}
	}
	if len(openAI) > 0 {
		aliases := weirv1connect.NewAliasServiceClient(hc, cpURL, opt)
		if _, err := aliases.SetAlias(ctx, connect.NewRequest(&weirv1.SetAliasRequest{
			Alias: translatedAlias, Targets: []string{chatModel}, Translate: true})); err != nil {
			return "", fmt.Errorf("set alias: %w", err)
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
		{name: "direct", url: s.simURL, key: "sk-ant-api03-bench-direct"},
		{name: "bare", url: s.bareURL, key: "sk-ant-api03-bench-direct"},
		{name: "weir", url: s.dpURL, key: s.key},
	}
}

// translatedTargets are the translation steps' targets: the simulator's
// Chat Completions directly, and a Messages client through weir onto it.
func (s *stack) translatedTargets() []target {
	return []target{
		{name: "direct-chat", url: s.simURL, key: "sk-proj-bench-direct", chat: true, plain: chatBody(false), stream: chatBody(true)},
		{name: "weir-translated", url: s.dpURL, key: s.key, plain: requestBodyFor(translatedAlias, false), stream: requestBodyFor(translatedAlias, true)},
	}
}

// stop ends weir (workers first, then the simulator, the control plane
// and Postgres), then the bare proxy.
func (s *stack) stop() {
	if s.w != nil {
		if err := s.w.Stop(context.Background()); err != nil {
			s.log.Warn("stop weir", "err", err)
		}
	}
	for _, w := range s.workers {
		w.upstream.CloseIdleConnections()
	}
	if s.bare != nil {
		s.bare.Close() //nolint:errcheck // teardown
	}
	if s.pgDir != "" {
		os.RemoveAll(s.pgDir) //nolint:errcheck // a temp dir
	}
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

// accountName is the i-th Anthropic account's label in weir and name in
// the simulator; openAIName the i-th OpenAI account's.
func accountName(i int) string { return fmt.Sprintf("bench-%d", i) }
func openAIName(i int) string  { return fmt.Sprintf("bench-openai-%d", i) }
