package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane"
	"github.com/weirhq/weir/dataplane"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/clock"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/internal/sim"
	"github.com/weirhq/weir/internal/stack"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const model = "claude-sonnet-4-5-20250929"

// waitFor bounds every wait on something asynchronous.
const waitFor = 10 * time.Second

// account is one upstream account a test needs: created in the control
// plane under label and in the simulator under the same name.
type account struct {
	label    string
	oauth    bool
	priority int32
	maxConc  int32
	faults   []sim.Fault
	// windows gives an oauth account live usage windows in the simulator.
	windows *sim.Windows
	// provider is "codex" (a ChatGPT login on the Codex backend) or
	// "openai" (an OpenAI key); empty is Anthropic.
	provider string
	// baseURL, when set, replaces the simulator's (a real address that
	// does not answer, say).
	baseURL string
	// proxy is the account's egress proxy (CreateAccountRequest's: a URL,
	// "direct", or "" for the default).
	proxy string
	// refreshable gives an oauth account a refresh token, and an access
	// token that expires within the control plane's refresh horizon.
	refreshable bool
	// revoked: the simulator answers every request of the account 401.
	revoked bool
}

// options shape one test's topology; zero values are the defaults.
type options struct {
	accounts []account
	// leaseTTL is the control plane's; default 30s (1h with virtual).
	leaseTTL time.Duration
	// now is the control plane's clock; default time.Now.
	now func() time.Time
	// keyCacheTTL is the worker's; default 50ms.
	keyCacheTTL time.Duration
	// maxBodyBytes is the worker's; default 32 MiB.
	maxBodyBytes int64
	// deltaDelay is the simulator's pause between streamed deltas.
	deltaDelay time.Duration
	// noDataplane skips the default worker (the test starts its own).
	noDataplane bool
	// reportInterval is the workers' ReportInterval; default 20ms.
	reportInterval time.Duration
	// leaseIdle is the workers' LeaseIdle; default 100ms. A test counting
	// reuses of sequential requests sets it longer: on a loaded machine a
	// gap between two requests can exceed 100ms.
	leaseIdle time.Duration
	// bodyReadTimeout and bodyIdleTimeout are the workers'
	// BodyReadTimeout and BodyIdleTimeout; defaults 2m and 10s.
	bodyReadTimeout, bodyIdleTimeout time.Duration
	// refusalInterval is the workers' RefusalInterval; default 1s, so
	// that refusal counts reach the control plane within a second or two
	// (with a virtual clock, once it passes an interval's end).
	refusalInterval time.Duration
	// maxWebSocketsPerKey is the workers' MaxWebSocketsPerKey; default 32.
	maxWebSocketsPerKey int
	// streamIdleTimeout and upstreamHeaderTimeout are the workers'
	// StreamIdleTimeout and UpstreamHeaderTimeout; defaults 3m and 10m.
	streamIdleTimeout, upstreamHeaderTimeout time.Duration
	// maxResponseBytes is the workers' MaxResponseBytes; default 64 MiB.
	maxResponseBytes int64
	// logs, when set, receives the control plane's and every worker's
	// logs, at debug level; default: discarded.
	logs io.Writer
	// hold is the capacity hold budget for the control plane and workers;
	// 0 means fail fast (the tests written before holds expect it).
	hold time.Duration
	// virtual, when set, is one clock for the control plane, the workers
	// and the simulator, and a worker's wait advances it at once: a
	// 20-minute storm runs in milliseconds.
	virtual *clock.Manual
	// maxAttempts is the worker's attempts per routing round.
	maxAttempts int
	// sleep, with virtual, replaces the workers' wait (a scheduler that
	// lets concurrent waits overlap in virtual time).
	sleep func(ctx context.Context, d time.Duration) bool
	// cpTracer and dpTracer receive the control plane's and the workers'
	// spans; default none.
	cpTracer, dpTracer trace.TracerProvider
	// db is the database; default a fresh one from pgtest.
	db *pgxpool.Pool
	// jobs runs River's jobs in the control plane; default off.
	jobs bool
	// cpRegistry and dpRegistry receive their metrics; default new ones.
	cpRegistry, dpRegistry *prometheus.Registry
}

// holdBudget maps options.hold to the configs' convention (negative = none).
func (o options) holdBudget() time.Duration {
	if o.hold == 0 {
		return -1
	}
	return o.hold
}

// env is one test's weir: database, control plane, simulator, worker.
type env struct {
	t *testing.T

	// st runs the parts below; cpAddr is where the control plane listens
	// (a restart keeps the address the workers know); served is the
	// httptest server of the worker started last.
	st        *stack.Stack
	cpAddr    string
	served    *httptest.Server
	cp        *controlplane.Server
	cpSrv     *httptest.Server
	pool      *pgxpool.Pool
	secretKey []byte
	dpToken   string
	admin     string // the admin token

	sim      *sim.Server
	simSrv   *httptest.Server
	upstream *recorder

	dp     *dataplane.Server
	dpSrv  *httptest.Server
	client *http.Client
	// dpReg is the first worker's metrics registry (the default worker's,
	// unless the test starts its own).
	dpReg      *prometheus.Registry
	dpRegTaken bool
	// workerRegs are every worker's metrics registries, in start order.
	workerRegs []*prometheus.Registry

	accounts weirv1connect.AccountServiceClient
	keys     weirv1connect.KeyServiceClient
	routes   weirv1connect.RouteServiceClient
	leases   weirv1connect.LeaseServiceClient
	aliases  weirv1connect.AliasServiceClient
	settings weirv1connect.SettingsServiceClient
	ops      weirv1connect.OpsServiceClient

	key    string // the client's weir key
	keyID  string
	ids    map[string]string // label → account id
	labels map[string]string // account id → label
	creds  map[string]string // label → upstream credential
	// refreshTokens are the refreshable accounts' refresh tokens, by label.
	refreshTokens map[string]string
	opts          options
}

// setup builds a fresh weir for one test. Everything is torn down in
// t.Cleanup: workers first, then the simulator, the control plane and the
// database.
func setup(t *testing.T, opts options) *env {
	t.Helper()
	if opts.virtual != nil {
		opts.now = opts.virtual.Now
		if opts.leaseTTL == 0 {
			// Virtual time runs minutes a real second, and workers renew
			// leases in real time: with a 30 s TTL a stream's lease would
			// lapse, its place be granted again, and its worker end it
			// (dataplane/keeper.go), as it should with a real clock.
			opts.leaseTTL = time.Hour
		}
	}
	e := &env{t: t, opts: opts, ids: map[string]string{}, labels: map[string]string{}, creds: map[string]string{},
		refreshTokens: map[string]string{}}
	pool := opts.db
	if pool == nil {
		pool = pgtest.NewPool(t)
	}

	e.admin = "admin-" + randid.Hex(16)
	e.dpToken = "dataplane-" + randid.Hex(16)
	e.secretKey = []byte(randid.Hex(16))
	e.pool = pool
	e.cpAddr = "127.0.0.1:0"
	admin := e.admin

	script := sim.Script{AcceptUnknown: true}
	for _, a := range opts.accounts {
		as := sim.AccountScript{Name: a.label, Kind: sim.KindAPIKey, Credential: "sk-ant-api03-e2e-" + a.label + "-" + randid.Hex(8), Faults: a.faults,
			Revoked: a.revoked}
		switch {
		case a.provider == "codex":
			as.Kind, as.Credential = sim.KindChatGPT, "chatgpt-access-e2e-"+a.label+"-"+randid.Hex(8)
			as.Windows = a.windows
		case a.provider == "openai":
			as.Kind, as.Credential = sim.KindOpenAIKey, "sk-proj-e2e-"+a.label+"-"+randid.Hex(8)
		case a.oauth:
			as.Kind, as.Credential = sim.KindOAuth, "sk-ant-oat01-e2e-"+a.label+"-"+randid.Hex(8)
			as.Windows = a.windows
			if a.refreshable {
				as.RefreshToken = "sk-ant-ort01-e2e-" + a.label + "-" + randid.Hex(8)
				e.refreshTokens[a.label] = as.RefreshToken
			}
		}
		e.creds[a.label] = as.Credential
		script.Accounts = append(script.Accounts, as)
	}
	simCfg := sim.Config{Script: script, DeltaDelay: opts.deltaDelay}
	if opts.virtual != nil {
		simCfg.Now = opts.virtual.Now
	}
	// The stack serves every part on an httptest server (serveHTTPTest),
	// which a test can cut, and stops them in order at the end: workers,
	// simulator, control plane; the database is pgtest's.
	st, err := stack.Start(context.Background(), stack.Options{
		Pool: pool, Migrated: true, Logger: opts.logger(),
		ControlPlane: controlplane.Config{
			AdminToken:     e.admin,
			DataplaneToken: e.dpToken,
			SecretKey:      e.secretKey,
			LeaseTTL:       opts.leaseTTL,
			Now:            opts.now,
			Logger:         opts.logger(),
			DisableJobs:    !opts.jobs,
			CapacityHold:   opts.holdBudget(),
			TracerProvider: opts.cpTracer,
			Registry:       opts.cpRegistry,
		},
		Sim:   &simCfg,
		Serve: e.serveHTTPTest,
	})
	if err != nil {
		t.Fatalf("start weir: %v", err)
	}
	t.Cleanup(func() { st.Stop(context.Background()) }) //nolint:errcheck // teardown
	e.st, e.cp, e.sim = st, st.ControlPlane, st.Sim

	hc := rpcclient.HTTPClient()
	adminOpt := connect.WithInterceptors(rpcclient.Token(admin))
	e.accounts = weirv1connect.NewAccountServiceClient(hc, e.cpSrv.URL, adminOpt)
	e.keys = weirv1connect.NewKeyServiceClient(hc, e.cpSrv.URL, adminOpt)
	e.routes = weirv1connect.NewRouteServiceClient(hc, e.cpSrv.URL, adminOpt)
	e.aliases = weirv1connect.NewAliasServiceClient(hc, e.cpSrv.URL, adminOpt)
	e.settings = weirv1connect.NewSettingsServiceClient(hc, e.cpSrv.URL, adminOpt)
	e.ops = weirv1connect.NewOpsServiceClient(hc, e.cpSrv.URL, adminOpt)
	e.leases = weirv1connect.NewLeaseServiceClient(hc, e.cpSrv.URL, connect.WithInterceptors(rpcclient.Token(e.dpToken)))

	ctx := t.Context()
	for _, a := range opts.accounts {
		req := &weirv1.CreateAccountRequest{
			Provider:       weirv1.Provider_PROVIDER_ANTHROPIC,
			AuthKind:       weirv1.AuthKind_AUTH_KIND_API_KEY,
			Label:          a.label,
			Credential:     e.creds[a.label],
			BaseUrl:        e.simSrv.URL,
			MaxConcurrency: a.maxConc,
			Priority:       a.priority,
			EgressProxy:    a.proxy,
		}
		if rt := e.refreshTokens[a.label]; rt != "" {
			now := time.Now
			if opts.now != nil {
				now = opts.now
			}
			req.Credential = fmt.Sprintf(`{"access_token":%q,"refresh_token":%q,"expires_at":%q}`,
				e.creds[a.label], rt, now().Add(time.Minute).UTC().Format(time.RFC3339))
		}
		switch {
		case a.provider == "codex":
			req.Provider, req.AuthKind, req.BaseUrl = weirv1.Provider_PROVIDER_CODEX, weirv1.AuthKind_AUTH_KIND_OAUTH, e.simSrv.URL+"/backend-api"
			id, ok := e.sim.ChatGPTAccountID(a.label)
			if !ok {
				t.Fatalf("simulator has no ChatGPT account id for %s", a.label)
			}
			req.UpstreamAccountId = id
		case a.provider == "openai":
			req.Provider, req.BaseUrl = weirv1.Provider_PROVIDER_OPENAI, e.simSrv.URL+"/v1"
		case a.oauth:
			req.AuthKind = weirv1.AuthKind_AUTH_KIND_OAUTH
		}
		if a.baseURL != "" {
			req.BaseUrl = a.baseURL
		}
		res, err := e.accounts.CreateAccount(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatalf("create account %s: %v", a.label, err)
		}
		e.ids[a.label] = res.Msg.Account.Id
		e.labels[res.Msg.Account.Id] = a.label
	}
	key, err := e.keys.CreateKey(ctx, connect.NewRequest(&weirv1.CreateKeyRequest{Name: "agent-" + randid.Hex(4)}))
	if err != nil {
		t.Fatalf("create key: %v", err)
	}
	e.key, e.keyID = key.Msg.Secret, key.Msg.Key.Id

	if opts.dpRegistry == nil {
		opts.dpRegistry = prometheus.NewRegistry()
		e.opts.dpRegistry = opts.dpRegistry
	}
	e.dpReg = opts.dpRegistry
	if !opts.noDataplane {
		e.dp, e.dpSrv = e.newDataplane(nil)
		e.client = e.dpSrv.Client()
	}
	return e
}

// serveHTTPTest serves a part of the stack on an httptest server, kept
// in e: the control plane on e.cpAddr over HTTP/1.1 and h2c, the
// simulator behind e.upstream's recorder over HTTP/1.1 only (dropped
// connections must be dropped TCP connections, not HTTP/2 stream resets,
// as with `weir sim`), a worker in e.served.
func (e *env) serveHTTPTest(part string, h http.Handler, _ net.Listener) (string, func(), error) {
	var srv *httptest.Server
	switch part {
	case "control plane":
		ln, err := net.Listen("tcp", e.cpAddr)
		if err != nil {
			return "", nil, err
		}
		srv = httptest.NewUnstartedServer(h)
		srv.Listener.Close() //nolint:errcheck // replaced
		srv.Listener = ln
		srv.Config.Protocols = new(http.Protocols)
		srv.Config.Protocols.SetHTTP1(true)
		srv.Config.Protocols.SetUnencryptedHTTP2(true)
		srv.Start()
		e.cpSrv = srv
	case "simulator":
		e.upstream = &recorder{next: h}
		srv = httptest.NewServer(e.upstream)
		e.simSrv = srv
	default:
		srv = httptest.NewServer(h)
		e.served = srv
	}
	return srv.URL, func() { closeServer(srv) }, nil
}

// startControlPlane starts the control plane again on e's database,
// listening on addr (the address the workers know).
func (e *env) startControlPlane(addr string) {
	e.t.Helper()
	e.cpAddr = addr
	if err := e.st.StartControlPlane(context.Background()); err != nil {
		e.t.Fatalf("start control plane: %v", err)
	}
	e.cp = e.st.ControlPlane
}

// stopControlPlane kills the control plane: its connections are cut, its
// listener closed, its pool watch ended. It returns the address it had.
func (e *env) stopControlPlane() string {
	e.t.Helper()
	addr := e.cpSrv.Listener.Addr().String()
	e.st.StopControlPlane() //nolint:errcheck // a kill: what it says does not matter
	return addr
}

// logger is where the servers log: opts.logs at debug level, or nowhere.
func (o options) logger() *slog.Logger {
	if o.logs == nil {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(o.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newDataplane starts a worker against e's control plane; cpClient, when
// set, is its LeaseService client.
func (e *env) newDataplane(cpClient *http.Client) (*dataplane.Server, *httptest.Server) {
	e.t.Helper()
	ttl := e.opts.keyCacheTTL
	if ttl == 0 {
		ttl = 50 * time.Millisecond
	}
	cfg := dataplane.Config{
		ControlPlaneURL:       e.cpSrv.URL,
		Token:                 e.dpToken,
		KeyCacheTTL:           ttl,
		MaxBodyBytes:          e.opts.maxBodyBytes,
		MaxAttempts:           e.opts.maxAttempts,
		ReportInterval:        e.opts.reportInterval,
		LeaseIdle:             e.opts.leaseIdle,
		BodyReadTimeout:       e.opts.bodyReadTimeout,
		BodyIdleTimeout:       e.opts.bodyIdleTimeout,
		RefusalInterval:       cmp.Or(e.opts.refusalInterval, time.Second),
		MaxWebSocketsPerKey:   e.opts.maxWebSocketsPerKey,
		ControlPlane:          cpClient,
		StreamIdleTimeout:     e.opts.streamIdleTimeout,
		UpstreamHeaderTimeout: e.opts.upstreamHeaderTimeout,
		MaxResponseBytes:      e.opts.maxResponseBytes,
		Logger:                e.opts.logger(),
		CapacityHold:          e.opts.holdBudget(),
		TracerProvider:        e.opts.dpTracer,
		Registry:              e.opts.dpRegistry,
	}
	if e.dpRegTaken {
		cfg.Registry = prometheus.NewRegistry() // dpRegistry is the first worker's
	}
	e.dpRegTaken = true
	e.workerRegs = append(e.workerRegs, cfg.Registry)
	if v := e.opts.virtual; v != nil {
		cfg.Now = v.Now
		// Concurrent waits overlap: each moves the clock to its own end,
		// not by its length on top of everyone else's.
		cfg.Sleep = func(ctx context.Context, d time.Duration) bool {
			v.AdvanceTo(v.Now().Add(d))
			return ctx.Err() == nil
		}
		cfg.Rand = func() float64 { return 0.5 } // no jitter: exact backoff
		if e.opts.sleep != nil {
			cfg.Sleep = e.opts.sleep
		}
	}
	// The stack stops it, before the control plane.
	w, err := e.st.StartWorker(cfg, nil)
	if err != nil {
		e.t.Fatalf("start worker: %v", err)
	}
	return w.Server, e.served
}

// closeServer ends every connection first: Close alone waits for handlers
// that are parked on a stream. The listener closes before the connections
// do, or a client that reconnects at once (a worker's WatchPool) opens a
// stream between the two that Close then waits for forever.
func closeServer(s *httptest.Server) {
	s.Listener.Close() //nolint:errcheck // Close closes it again
	s.CloseClientConnections()
	s.Close()
}

// messagesBody is a minimal valid Messages request.
func messagesBody(stream bool) string {
	b := `{"model":"` + model + `","max_tokens":64,"messages":[{"role":"user","content":"Say hello."}]`
	if stream {
		b += `,"stream":true`
	}
	return b + "}"
}

// response is what an agent got back.
type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request the way an agent does: the weir key as x-api-key,
// anthropic-version, a JSON body. edit may change the request first.
func (e *env) do(method, path, body string, edit func(*http.Request)) response {
	e.t.Helper()
	return e.doWith(e.client, e.dpSrv.URL, method, path, body, edit)
}

func (e *env) doWith(c *http.Client, base, method, path, body string, edit func(*http.Request)) response {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(e.t.Context(), method, base+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", e.key)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if edit != nil {
		edit(req)
	}
	res, err := c.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

// post sends a Messages request.
func (e *env) post(stream bool) response {
	e.t.Helper()
	return e.do(http.MethodPost, "/v1/messages", messagesBody(stream), nil)
}

// eventually polls cond until it holds, failing the test after waitFor.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(waitFor)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s", waitFor, what)
		case <-tick.C:
		}
	}
}

// refusalMetric sums weir_dataplane_refusals_total for reason over every
// worker and surface.
func (e *env) refusalMetric(reason string) float64 {
	e.t.Helper()
	var labels map[string]string
	if reason != "" { // "": every reason
		labels = map[string]string{"reason": reason}
	}
	var n float64
	for _, reg := range e.workerRegs {
		n += metricValue(e.t, reg, "weir_dataplane_refusals_total", labels)
	}
	return n
}

// refusalRows waits until the control plane's refusal counts for reason
// (and keyID, "" for requests with no known key) add up to want, and
// returns how many rows hold them.
func (e *env) refusalRows(keyID, reason string, want int64) int {
	e.t.Helper()
	var rows int
	eventually(e.t, fmt.Sprintf("%d %s refusals stored", want, reason), func() bool {
		res, err := e.routes.ListRefusals(e.t.Context(), connect.NewRequest(&weirv1.ListRefusalsRequest{
			Since: timestamppb.New(time.Unix(0, 0)), Limit: 1000}))
		if err != nil {
			e.t.Fatalf("list refusals: %v", err)
		}
		var sum int64
		rows = 0
		for _, r := range res.Msg.Refusals {
			if r.KeyId == keyID && r.Reason == reason {
				sum += r.Count
				rows++
			}
		}
		return sum == want
	})
	return rows
}

// noRouteEvents checks that none of the requests left a route event,
// once every event reported so far is stored (the reporters are idle).
func (e *env) noRouteEvents(ids []string) {
	e.t.Helper()
	res, err := e.routes.ListRouteEvents(e.t.Context(), connect.NewRequest(&weirv1.ListRouteEventsRequest{Limit: 1000}))
	if err != nil {
		e.t.Fatalf("list route events: %v", err)
	}
	for _, ev := range res.Msg.Events {
		for _, id := range ids {
			if ev.RequestId == id {
				e.t.Errorf("refused request %s has a route event: %v", id, ev)
			}
		}
	}
}

// routeEvent waits for the final route event of a request (reports are
// async; a request in progress has a pending one first).
func (e *env) routeEvent(requestID string) *weirv1.RouteEvent {
	e.t.Helper()
	if requestID == "" {
		e.t.Fatal("no Weir-Request-Id on the response")
	}
	var found *weirv1.RouteEvent
	eventually(e.t, "route event "+requestID, func() bool {
		res, err := e.routes.ListRouteEvents(e.t.Context(), connect.NewRequest(&weirv1.ListRouteEventsRequest{Limit: 1000}))
		if err != nil {
			e.t.Fatalf("list route events: %v", err)
		}
		for _, ev := range res.Msg.Events {
			if ev.RequestId == requestID && !ev.Pending {
				found = ev
				return true
			}
		}
		return false
	})
	return found
}

// account reads an account as operators see it.
func (e *env) account(label string) *weirv1.Account {
	e.t.Helper()
	res, err := e.accounts.GetAccount(e.t.Context(), connect.NewRequest(&weirv1.GetAccountRequest{Id: label}))
	if err != nil {
		e.t.Fatalf("get account %s: %v", label, err)
	}
	return res.Msg.Account
}

// leasesReleased waits until no account has a lease in flight.
func (e *env) leasesReleased() {
	e.t.Helper()
	for label := range e.ids {
		eventually(e.t, "account "+label+" to have no lease in flight", func() bool {
			return e.account(label).InFlight == 0
		})
	}
}

// attempts returns the simulator's attempt log as "account:outcome:status".
func (e *env) attempts() []string {
	var out []string
	for _, a := range e.sim.Attempts() {
		out = append(out, a.Account+":"+a.Outcome+":"+strconv.Itoa(a.Status))
	}
	return out
}

// apiError is the Anthropic error body.
type apiError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
	RequestID string `json:"request_id"`
}

// decodeError checks that body is exactly the Anthropic error shape
// {"type":"error","error":{"type","message"},"request_id"} and returns it.
func decodeError(t *testing.T, body []byte) apiError {
	t.Helper()
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, body)
	}
	var inner map[string]json.RawMessage
	if len(top) != 3 || json.Unmarshal(top["error"], &inner) != nil || len(inner) != 2 {
		t.Fatalf("error body is not {type, error{type, message}, request_id}: %s", body)
	}
	var e apiError
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("error body: %v: %s", err, body)
	}
	if e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" || e.RequestID == "" {
		t.Fatalf("error body incomplete: %s", body)
	}
	return e
}

// weirError checks an error weir itself answered: status, Anthropic shape,
// error type, and the request id that matches Weir-Request-Id.
func weirError(t *testing.T, r response, status int, typ string) apiError {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d: %s", r.status, status, r.body)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	e := decodeError(t, r.body)
	if e.Error.Type != typ {
		t.Errorf("error type = %q, want %q (%s)", e.Error.Type, typ, e.Error.Message)
	}
	if id := r.header.Get("Weir-Request-Id"); id != "" && e.RequestID != id {
		t.Errorf("request_id = %q, Weir-Request-Id = %q", e.RequestID, id)
	}
	return e
}

// recorder sits in front of the simulator and keeps every exchange as the
// upstream saw and sent it, so tests can compare bytes exactly.
type recorder struct {
	next http.Handler
	mu   sync.Mutex
	xs   []*exchange
	// inflight and peak count concurrent requests per credential (the
	// x-api-key or bearer token the upstream saw).
	inflight, peak map[string]int
}

type exchange struct {
	// remote is the address the request came from.
	remote                 string
	method, path, rawQuery string
	reqHeader              http.Header
	reqBody                []byte
	status                 int
	header                 http.Header
	body                   bytes.Buffer
}

// upstreamExchange is a snapshot of one exchange.
type upstreamExchange struct {
	remote                 string
	method, path, rawQuery string
	reqHeader              http.Header
	reqBody                []byte
	status                 int
	header                 http.Header
	body                   []byte
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The control plane reads a Claude login's profile when the account is
	// created (its identity); tests count the traffic of requests.
	if r.URL.Path == "/api/oauth/profile" {
		rc.next.ServeHTTP(w, r)
		return
	}
	x := &exchange{remote: r.RemoteAddr, method: r.Method, path: r.URL.Path, rawQuery: r.URL.RawQuery, reqHeader: r.Header.Clone()}
	if r.Body != nil {
		x.reqBody, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(x.reqBody))
	}
	cred := r.Header.Get("X-Api-Key")
	if cred == "" {
		cred = strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	}
	rc.mu.Lock()
	rc.xs = append(rc.xs, x)
	if rc.inflight == nil {
		rc.inflight, rc.peak = map[string]int{}, map[string]int{}
	}
	rc.inflight[cred]++
	rc.peak[cred] = max(rc.peak[cred], rc.inflight[cred])
	rc.mu.Unlock()
	defer func() {
		rc.mu.Lock()
		rc.inflight[cred]--
		rc.mu.Unlock()
	}()
	rc.next.ServeHTTP(&recordingWriter{ResponseWriter: w, rc: rc, x: x}, r)
}

// workerMetric sums a metric over every worker.
func (e *env) workerMetric(name string, labels map[string]string) float64 {
	e.t.Helper()
	var n float64
	for _, reg := range e.workerRegs {
		n += metricValue(e.t, reg, name, labels)
	}
	return n
}

// running is how many requests the upstream is serving now.
func (rc *recorder) running() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := 0
	for _, v := range rc.inflight {
		n += v
	}
	return n
}

// peakConcurrency is the most requests the upstream ran at once with a
// credential.
func (rc *recorder) peakConcurrency(cred string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.peak[cred]
}

func (rc *recorder) exchanges() []upstreamExchange {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make([]upstreamExchange, 0, len(rc.xs))
	for _, x := range rc.xs {
		out = append(out, upstreamExchange{
			remote: x.remote, method: x.method, path: x.path, rawQuery: x.rawQuery, reqHeader: x.reqHeader, reqBody: x.reqBody,
			status: x.status, header: x.header.Clone(), body: bytes.Clone(x.body.Bytes()),
		})
	}
	return out
}

// only returns the single exchange a test expects.
func (rc *recorder) only(t *testing.T) upstreamExchange {
	t.Helper()
	xs := rc.exchanges()
	if len(xs) != 1 {
		t.Fatalf("upstream saw %d requests, want 1", len(xs))
	}
	return xs[0]
}

type recordingWriter struct {
	http.ResponseWriter
	rc *recorder
	x  *exchange
}

func (w *recordingWriter) WriteHeader(code int) {
	w.rc.mu.Lock()
	if w.x.status == 0 {
		w.x.status, w.x.header = code, w.Header().Clone()
	}
	w.rc.mu.Unlock()
	w.ResponseWriter.WriteHeader(code)
}

// maxRecordedBody bounds what the recorder keeps of one answer (the
// huge-body scenarios send more), so that the recorder is not what
// needs the memory.
const maxRecordedBody = 32 << 20

func (w *recordingWriter) Write(b []byte) (int, error) {
	w.rc.mu.Lock()
	if w.x.status == 0 {
		w.x.status, w.x.header = http.StatusOK, w.Header().Clone()
	}
	w.x.body.Write(b[:min(len(b), max(0, maxRecordedBody-w.x.body.Len()))])
	w.rc.mu.Unlock()
	return w.ResponseWriter.Write(b)
}

// Unwrap lets the simulator flush and hijack through the recorder.
func (w *recordingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// sseEvents splits an event stream into (name, data) pairs.
func sseEvents(t *testing.T, body []byte) [][2]string {
	t.Helper()
	var out [][2]string
	for _, block := range strings.Split(strings.TrimSuffix(string(body), "\n\n"), "\n\n") {
		var name, data string
		for _, line := range strings.Split(block, "\n") {
			if v, ok := strings.CutPrefix(line, "event: "); ok {
				name = v
			} else if v, ok := strings.CutPrefix(line, "data: "); ok {
				data = v
			}
		}
		out = append(out, [2]string{name, data})
	}
	return out
}

// usageOf reads the usage a simulator reply carried, streamed or not.
func usageOf(t *testing.T, body []byte, stream bool) (input, output int64) {
	t.Helper()
	type counts struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	}
	var u struct {
		Usage   counts `json:"usage"`
		Message struct {
			Usage counts `json:"usage"`
		} `json:"message"`
	}
	decode := func(s string) {
		u.Usage.InputTokens, u.Usage.OutputTokens = 0, 0
		if err := json.Unmarshal([]byte(s), &u); err != nil {
			t.Fatalf("usage: %v: %s", err, s)
		}
	}
	if !stream {
		decode(string(body))
		return u.Usage.InputTokens, u.Usage.OutputTokens
	}
	for _, ev := range sseEvents(t, body) {
		switch ev[0] {
		case "message_start":
			decode(ev[1])
			input, output = u.Message.Usage.InputTokens, u.Message.Usage.OutputTokens
		case "message_delta":
			decode(ev[1])
			output = u.Usage.OutputTokens
		}
	}
	return input, output
}

// advanceAlive moves clk by d the way time passes while the control
// plane is up: in steps shorter than the lease clock's gap (a third of the
// TTL), each taken by the control plane's heartbeat
// (controlplane/leaseclock.go) before the next, so that no stretch of d
// reads as an outage in which leases keep their places.
func (e *env) advanceAlive(clk *clock.Manual, d time.Duration) {
	e.t.Helper()
	ttl := e.opts.leaseTTL
	if ttl == 0 {
		ttl = 30 * time.Second
	}
	for d > 0 {
		step := min(d, ttl/6)
		clk.Advance(step)
		d -= step
		now := clk.Now()
		eventually(e.t, "the control plane's heartbeat to take the clock", func() bool {
			var at time.Time
			err := e.pool.QueryRow(e.t.Context(), `SELECT alive_at FROM lease_clock`).Scan(&at)
			return err == nil && !at.Before(now.Add(-time.Microsecond)) // Postgres keeps microseconds
		})
	}
}

// openedStream is a streamed request read up to its first delta.
type openedStream struct {
	res *http.Response
	sc  *bufio.Scanner // reads on from the first delta
	end func()         // the client hangs up
}

// startStream starts a streamed request through url with e's key and
// reads it until its first delta; the simulator's deltaDelay decides how
// long it then runs.
func (e *env) startStream(client *http.Client, url string) *openedStream {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.t.Context())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/messages", strings.NewReader(messagesBody(true)))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", e.key)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	res, err := client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	end := func() {
		cancel()
		res.Body.Close()
	}
	e.t.Cleanup(end)
	if res.StatusCode != http.StatusOK {
		e.t.Fatalf("stream status %d", res.StatusCode)
	}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() && sc.Text() != "event: content_block_delta" {
	}
	if sc.Text() != "event: content_block_delta" {
		e.t.Fatalf("no delta before the stream hung: %v", sc.Err())
	}
	return &openedStream{res: res, sc: sc, end: end}
}

// openStream is startStream for a test that only ends the stream.
func (e *env) openStream(client *http.Client, url string) (end func()) {
	e.t.Helper()
	return e.startStream(client, url).end
}

// killable is a transport that can be cut at once and for good, the way a
// worker's calls stop when its process dies.
type killable struct {
	base     http.RoundTripper
	mu       sync.Mutex
	dead     bool
	inflight sync.WaitGroup
}

var errKilled = errors.New("worker killed")

func (k *killable) RoundTrip(r *http.Request) (*http.Response, error) {
	k.mu.Lock()
	if k.dead {
		k.mu.Unlock()
		return nil, errKilled
	}
	k.inflight.Add(1)
	k.mu.Unlock()
	defer k.inflight.Done()
	return k.base.RoundTrip(r)
}

// kill fails every later call and waits for calls already on the wire, so
// none of them can land after kill returns.
func (k *killable) kill() {
	k.mu.Lock()
	k.dead = true
	k.mu.Unlock()
	k.inflight.Wait()
}

// cutOff fails every later call, leaving calls on the wire (a stream such
// as the pool watch) be: the worker is cut off from the control plane.
func (k *killable) cutOff() {
	k.mu.Lock()
	k.dead = true
	k.mu.Unlock()
}

// heal lets calls through again after kill or cutOff: the worker was cut
// off from the control plane, not dead.
func (k *killable) heal() {
	k.mu.Lock()
	k.dead = false
	k.mu.Unlock()
}

// change makes an operator's change and waits until the default worker
// has heard of it through its pool watch: the change reaches workers
// milliseconds after it commits, and only from then on may a test expect
// the worker's next request to follow it. The worker's watch must be
// ready first, or there is nothing to wait for.
func (e *env) change(do func()) {
	e.t.Helper()
	poolReady(e.t, e.dpReg)
	count := func() float64 {
		return metricValue(e.t, e.dpReg, "weir_dataplane_lease_pool_invalidations_total", nil)
	}
	before := count()
	do()
	eventually(e.t, "the change to reach the worker", func() bool { return count() > before })
}
