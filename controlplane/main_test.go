package controlplane

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/clock"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/internal/syncbuf"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// epoch is where every test clock starts: whole seconds, so times survive
// Postgres' microsecond precision and HTTP dates' second precision intact.
var epoch = time.Date(2030, time.March, 4, 5, 6, 7, 0, time.UTC)

// newClock is the injected clock; tests move it, never sleep.
func newClock() *clock.Manual { return clock.NewManual(epoch) }

// syncBuffer collects log output so a test can prove no secret was logged.
type syncBuffer = syncbuf.Buffer

// clients is one set of Connect clients speaking one protocol with one token.
type clients struct {
	accounts weirv1connect.AccountServiceClient
	keys     weirv1connect.KeyServiceClient
	leases   weirv1connect.LeaseServiceClient
	routes   weirv1connect.RouteServiceClient
	usage    weirv1connect.UsageServiceClient
}

// env is the test bundle: a database, a replica over it, an h2c server
// in front of the replica, and clients holding the right tokens.
type env struct {
	t     *testing.T
	pool  *pgxpool.Pool
	q     *db.Queries
	clock *clock.Manual
	cfg   Config
	srv   *Server
	ts    *httptest.Server

	// admin holds the admin token (AccountService, KeyService,
	// RouteService); dp holds the data-plane token (LeaseService).
	admin, dp clients

	logs    *syncBuffer
	secrets *secretSet
}

// secretSet is every credential and key a test created; none of them may
// appear in any log line.
type secretSet struct {
	mu   sync.Mutex
	list []string
}

func (s *secretSet) add(v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.list = append(s.list, v)
}

func (s *secretSet) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.list...)
}

func testConfig(clock *clock.Manual) Config {
	return Config{
		AdminToken:     "admin-" + randid.Hex(16),
		DataplaneToken: "dataplane-" + randid.Hex(16),
		SecretKey:      randid.Bytes(32),
		Now:            clock.Now,
		DisableJobs:    true,
	}
}

// setup gives a test its own database and one replica over it.
func setup(t *testing.T) *env {
	t.Helper()
	pool := pgtest.NewPool(t)
	clock := newClock()
	return newEnv(t, pool, testConfig(clock), clock)
}

// replica starts another control-plane replica over e's database, with the
// same tokens, key and clock: a second process of the same deployment.
func (e *env) replica() *env {
	e.t.Helper()
	cfg := e.cfg
	cfg.Registry = nil
	cfg.Logger = nil
	r := newEnv(e.t, e.pool, cfg, e.clock)
	r.secrets = e.secrets
	return r
}

func newEnv(t *testing.T, pool *pgxpool.Pool, cfg Config, clock *clock.Manual) *env {
	t.Helper()
	e := &env{t: t, pool: pool, q: db.New(pool), clock: clock, logs: &syncBuffer{}, secrets: &secretSet{}}
	// Registered first, so it runs last: after every request has finished.
	t.Cleanup(func() {
		logs := e.logs.String()
		for _, s := range e.secrets.all() {
			if strings.Contains(logs, s) {
				t.Errorf("a secret (%d characters) appeared in the server log", len(s))
			}
		}
	})
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), e.logs), nil))
	}
	srv, err := New(cfg, pool)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	// The effective config, defaults filled in (LeaseTTL, SessionTTL, ...).
	e.cfg, e.srv = srv.cfg, srv
	e.ts = startH2C(t, srv.Handler())
	e.admin = e.clients(cfg.AdminToken)
	e.dp = e.clients(cfg.DataplaneToken)
	return e
}

// startH2C serves h on cleartext HTTP/1.1 and HTTP/2, as the control plane does.
func startH2C(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	ts := httptest.NewUnstartedServer(h)
	ts.EnableHTTP2 = false
	ts.Config.Protocols = new(http.Protocols)
	ts.Config.Protocols.SetHTTP1(true)
	ts.Config.Protocols.SetUnencryptedHTTP2(true)
	ts.Start()
	t.Cleanup(ts.Close)
	return ts
}

// clients builds the four service clients with token and extra options
// (connect.WithGRPC(), connect.WithGRPCWeb()).
func (e *env) clients(token string, opts ...connect.ClientOption) clients {
	e.t.Helper()
	hc := rpcclient.HTTPClient()
	e.t.Cleanup(hc.CloseIdleConnections)
	if token != "" {
		opts = append(opts, connect.WithInterceptors(rpcclient.Token(token)))
	}
	return clients{
		accounts: weirv1connect.NewAccountServiceClient(hc, e.ts.URL, opts...),
		keys:     weirv1connect.NewKeyServiceClient(hc, e.ts.URL, opts...),
		leases:   weirv1connect.NewLeaseServiceClient(hc, e.ts.URL, opts...),
		routes:   weirv1connect.NewRouteServiceClient(hc, e.ts.URL, opts...),
		usage:    weirv1connect.NewUsageServiceClient(hc, e.ts.URL, opts...),
	}
}

// apiKey and oauthToken look like the real thing and are unique per call.
func apiKey() string     { return "sk-ant-api03-" + randid.Hex(40) }
func oauthToken() string { return "sk-ant-oat01-" + randid.Hex(40) }

// acct describes an account to create; zero fields take test defaults.
type acct struct {
	label      string
	credential string
	kind       weirv1.AuthKind
	baseURL    string
	maxConc    int32
	priority   int32
}

// createAccount creates an account through the RPC and returns it with
// the plaintext credential it was given.
func (e *env) createAccount(a acct) (*weirv1.Account, string) {
	e.t.Helper()
	if a.label == "" {
		a.label = "acct-" + randid.Hex(4)
	}
	if a.credential == "" {
		a.credential = apiKey()
	}
	if a.kind == weirv1.AuthKind_AUTH_KIND_UNSPECIFIED {
		a.kind = weirv1.AuthKind_AUTH_KIND_API_KEY
	}
	e.secrets.add(a.credential)
	resp, err := e.admin.accounts.CreateAccount(e.t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider:       weirv1.Provider_PROVIDER_ANTHROPIC,
		AuthKind:       a.kind,
		Label:          a.label,
		Credential:     a.credential,
		BaseUrl:        a.baseURL,
		MaxConcurrency: a.maxConc,
		Priority:       a.priority,
	}))
	if err != nil {
		e.t.Fatalf("CreateAccount %s: %v", a.label, err)
	}
	return resp.Msg.Account, a.credential
}

// createKey creates a client key and returns it with its secret's hash.
func (e *env) createKey(name string) (*weirv1.Key, string) {
	e.t.Helper()
	if name == "" {
		name = "key-" + randid.Hex(4)
	}
	resp, err := e.admin.keys.CreateKey(e.t.Context(), connect.NewRequest(&weirv1.CreateKeyRequest{Name: name}))
	if err != nil {
		e.t.Fatalf("CreateKey %s: %v", name, err)
	}
	e.secrets.add(resp.Msg.Secret)
	return resp.Msg.Key, HashKey(resp.Msg.Secret)
}

// acquire calls Acquire and fails the test on an RPC error.
func (e *env) acquire(req *weirv1.AcquireRequest) *weirv1.AcquireResponse {
	e.t.Helper()
	if req.RequestId == "" {
		req.RequestId = "req-" + randid.Hex(4)
	}
	resp, err := e.dp.leases.Acquire(e.t.Context(), connect.NewRequest(req))
	if err != nil {
		e.t.Fatalf("Acquire: %v", err)
	}
	return resp.Msg
}

// mustLease acquires and requires a lease.
func (e *env) mustLease(req *weirv1.AcquireRequest) *weirv1.Lease {
	e.t.Helper()
	resp := e.acquire(req)
	l := resp.GetLease()
	if l == nil {
		e.t.Fatalf("Acquire: want a lease, got no account: %v", resp.GetNoAccount())
	}
	return l
}

// mustNoAccount acquires and requires a NoAccount with the given reason.
func (e *env) mustNoAccount(req *weirv1.AcquireRequest, want weirv1.NoAccountReason) *weirv1.NoAccount {
	e.t.Helper()
	resp := e.acquire(req)
	none := resp.GetNoAccount()
	if none == nil {
		e.t.Fatalf("Acquire: want no account (%v), got a lease on %s", want, resp.GetLease().GetAccountLabel())
	}
	if none.Reason != want {
		e.t.Fatalf("Acquire: reason %v (%q), want %v", none.Reason, none.Message, want)
	}
	return none
}

// release ends a lease with an outcome and returns the decision.
func (e *env) release(leaseID string, o *weirv1.Outcome) *weirv1.Decision {
	e.t.Helper()
	resp, err := e.dp.leases.Release(e.t.Context(), connect.NewRequest(&weirv1.ReleaseRequest{LeaseId: leaseID, Outcome: o}))
	if err != nil {
		e.t.Fatalf("Release: %v", err)
	}
	return resp.Msg.Decision
}

func (e *env) getAccount(id string) *weirv1.Account {
	e.t.Helper()
	resp, err := e.admin.accounts.GetAccount(e.t.Context(), connect.NewRequest(&weirv1.GetAccountRequest{Id: id}))
	if err != nil {
		e.t.Fatalf("GetAccount %s: %v", id, err)
	}
	return resp.Msg.Account
}

func (e *env) pause(id string) *weirv1.Account {
	e.t.Helper()
	resp, err := e.admin.accounts.PauseAccount(e.t.Context(), connect.NewRequest(&weirv1.PauseAccountRequest{Id: id}))
	if err != nil {
		e.t.Fatalf("PauseAccount: %v", err)
	}
	return resp.Msg.Account
}

func (e *env) resume(id string) *weirv1.Account {
	e.t.Helper()
	resp, err := e.admin.accounts.ResumeAccount(e.t.Context(), connect.NewRequest(&weirv1.ResumeAccountRequest{Id: id}))
	if err != nil {
		e.t.Fatalf("ResumeAccount: %v", err)
	}
	return resp.Msg.Account
}

// accountRow reads an account's row straight from Postgres.
func (e *env) accountRow(id string) db.Account {
	e.t.Helper()
	row, err := e.q.GetAccount(e.t.Context(), uuid.MustParse(id))
	if err != nil {
		e.t.Fatalf("read account %s: %v", id, err)
	}
	return row
}

// cooldownRow reads an account's cooldown row (live or not), or nil.
func (e *env) cooldownRow(id string) *db.Cooldown {
	e.t.Helper()
	var c db.Cooldown
	err := e.pool.QueryRow(e.t.Context(),
		`SELECT account_id, reason, transient, until, written_at, evidence FROM cooldowns WHERE account_id = $1`,
		uuid.MustParse(id)).Scan(&c.AccountID, &c.Reason, &c.Transient, &c.Until, &c.WrittenAt, &c.Evidence)
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		e.t.Fatalf("read cooldown: %v", err)
	}
	return &c
}

// count runs a SELECT count(*) and returns the count.
// advanceAlive moves the clock by d the way time passes while the control
// plane is up: its heartbeat touches the lease clock every second
// (leaseclock.go), so no stretch of d reads as an outage.
func (e *env) advanceAlive(d time.Duration) time.Time {
	e.t.Helper()
	for d > 0 {
		step := min(d, time.Second)
		e.clock.Advance(step)
		d -= step
		if err := e.srv.tickLeaseClock(e.t.Context()); err != nil {
			e.t.Fatalf("lease clock: %v", err)
		}
	}
	return e.clock.Now()
}

func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.t.Context(), sql, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// wantCode requires err to be a Connect error with code.
func wantCode(t *testing.T, err error, code connect.Code) *connect.Error {
	t.Helper()
	if err == nil {
		t.Fatalf("want %v, got no error", code)
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("want a connect error %v, got %T %v", code, err, err)
	}
	if ce.Code() != code {
		t.Fatalf("want %v, got %v: %s", code, ce.Code(), ce.Message())
	}
	return ce
}

// jsonOf is the protojson form of a message, to search it for secrets.
func jsonOf(t *testing.T, m proto.Message) string {
	t.Helper()
	b, err := protojson.Marshal(m)
	if err != nil {
		t.Fatalf("protojson: %v", err)
	}
	return string(b)
}

// requireAbsent fails if secret occurs in m's JSON or binary form.
func requireAbsent(t *testing.T, what string, m proto.Message, secret string) {
	t.Helper()
	if strings.Contains(jsonOf(t, m), secret) {
		t.Errorf("%s: the secret appears in the JSON response", what)
	}
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatalf("proto.Marshal: %v", err)
	}
	if bytes.Contains(b, []byte(secret)) {
		t.Errorf("%s: the secret appears in the binary response", what)
	}
}
