package chaos

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/migrate"
	"github.com/weirhq/weir/internal/pgembed"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/internal/sim"
)

// Config is one seed's run. Zero values take the defaults noted.
type Config struct {
	Seed uint64
	// Duration is how long traffic runs. Default 15s.
	Duration time.Duration
	// Clients is how many agents loop requests. Default 8.
	Clients int
	// LeaseTTL is the control planes' lease TTL. Default 8s: short, so
	// that "no lease is live a TTL after the run" fits in a seed; pauses
	// are kept to a quarter of it.
	LeaseTTL time.Duration
	// CapacityHold and UnreachableHold are the hold budgets. Default 12s
	// and 8s.
	CapacityHold, UnreachableHold time.Duration
	// LogDir keeps the children's logs of a seed with violations, and its
	// Record as JSON. Default: none kept.
	LogDir string
	Logger *slog.Logger
}

func (c *Config) defaults() {
	if c.Duration == 0 {
		c.Duration = 15 * time.Second
	}
	if c.Clients == 0 {
		c.Clients = 8
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 8 * time.Second
	}
	if c.CapacityHold == 0 {
		c.CapacityHold = 12 * time.Second
	}
	if c.UnreachableHold == 0 {
		c.UnreachableHold = 8 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// scheduleConfig bounds the faults of a run of c.
func (c Config) scheduleConfig(accounts []Account) ScheduleConfig {
	anth := make([]bool, len(accounts))
	for i, a := range accounts {
		anth[i] = a.Anthropic
	}
	return ScheduleConfig{Duration: c.Duration, Warmup: time.Second, Quiet: 4 * time.Second, Every: 700 * time.Millisecond,
		Workers: numWorkers, ControlPlanes: numControlPlanes, Anthropic: anth,
		MaxPause: c.LeaseTTL / 4, MaxDown: 4 * time.Second}
}

const (
	numWorkers       = 3
	numControlPlanes = 2
)

// pool is the accounts: four Anthropic API keys and two OpenAI ones, some
// with a cap of 1 or 2.
var pool = []Account{
	{Name: "anth-0", Anthropic: true, Cap: 1}, {Name: "anth-1", Anthropic: true, Cap: 2},
	{Name: "anth-2", Anthropic: true, Cap: 2}, {Name: "anth-3", Anthropic: true, Cap: 3},
	{Name: "oai-0", Cap: 1}, {Name: "oai-1", Cap: 2},
}

// Result is one seed's outcome.
type Result struct {
	Seed       uint64        `json:"seed"`
	Elapsed    time.Duration `json:"elapsed"`
	Record     *Record       `json:"-"`
	Violations []Violation   `json:"violations"`
	// Timeline is what reproduces the violations ("" with none).
	Timeline string `json:"timeline,omitempty"`
	LogFile  string `json:"log_file,omitempty"`
}

// Failed is the violations that fail the run: all, or with tolerateKnown
// those not known.
func (r *Result) Failed(tolerateKnown bool) []Violation {
	var out []Violation
	for _, v := range r.Violations {
		if v.Known == "" || !tolerateKnown {
			out = append(out, v)
		}
	}
	return out
}

// Runner keeps one Postgres cluster across seeds; each seed gets a fresh
// database cloned from a migrated template.
type Runner struct {
	log      *slog.Logger
	dir      string
	port     int
	cluster  *pgembed.Cluster
	admin    *pgxpool.Pool
	n        int
	template string
}

var pgSettings = map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "max_connections": "200"}

// NewRunner starts Postgres and migrates the template.
func NewRunner(ctx context.Context, log *slog.Logger) (_ *Runner, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Runner{log: log, template: "chaos_template"}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	if r.dir, err = os.MkdirTemp("", "weir-chaos-pg-"); err != nil {
		return nil, err
	}
	if r.cluster, err = pgembed.Start(ctx, pgembed.Config{DataDir: r.dir, Database: "postgres", ExtraSettings: pgSettings}); err != nil {
		return nil, err
	}
	r.port = r.cluster.Port()
	if r.admin, err = pgxpool.New(ctx, r.cluster.URLFor("postgres")); err != nil {
		return nil, err
	}
	if _, err := r.admin.Exec(ctx, "CREATE DATABASE "+r.template); err != nil {
		return nil, err
	}
	tp, err := pgxpool.New(ctx, r.cluster.URLFor(r.template))
	if err != nil {
		return nil, err
	}
	defer tp.Close()
	return r, migrate.Up(ctx, tp)
}

// Close stops Postgres and removes its data.
func (r *Runner) Close() {
	if r.admin != nil {
		r.admin.Close()
	}
	if r.cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		r.cluster.Stop(ctx) //nolint:errcheck // teardown
		cancel()
	}
	if r.dir != "" {
		os.RemoveAll(r.dir) //nolint:errcheck // a temp dir
	}
}

// startPostgres starts the cluster again on its data directory and port.
func (r *Runner) startPostgres(ctx context.Context) error {
	c, err := pgembed.Start(ctx, pgembed.Config{DataDir: r.dir, Database: "postgres", Port: r.port, ExtraSettings: pgSettings})
	if err != nil {
		return err
	}
	r.cluster = c
	return nil
}

// run is one seed in progress.
type run struct {
	cfg   Config
	r     *Runner
	log   *slog.Logger
	logw  io.Writer
	start time.Time

	sim          *proc
	cps, workers []*slot
	cpProxy      *Proxy
	pgProxy      *Proxy

	// spent names the accounts spent for the whole run.
	spent []string

	mu      sync.Mutex
	applied []Applied
}

// Run runs one seed: start everything, prime, traffic under the
// schedule, quiet, collect, check.
func (r *Runner) Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg.defaults()
	began := time.Now()
	res := &Result{Seed: cfg.Seed}
	x := &run{cfg: cfg, r: r, log: cfg.Logger}
	var logf *os.File
	var err error
	if cfg.LogDir != "" {
		if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
			return nil, err
		}
		res.LogFile = filepath.Join(cfg.LogDir, fmt.Sprintf("chaos-seed-%d.log", cfg.Seed))
		if logf, err = os.Create(res.LogFile); err != nil {
			return nil, err
		}
		defer logf.Close()
		x.logw = logf
	} else {
		x.logw = io.Discard
	}
	r.n++
	db := fmt.Sprintf("chaos_%d_%d", cfg.Seed, r.n)
	if _, err := r.admin.Exec(ctx, "CREATE DATABASE "+db+" TEMPLATE "+r.template); err != nil {
		return nil, fmt.Errorf("create database: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		r.admin.Exec(dctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)") //nolint:errcheck // best effort
	}()
	defer x.stop()
	rec, err := x.execute(ctx, db)
	if err != nil {
		return nil, err
	}
	res.Record = rec
	res.Violations = Check(rec)
	if len(res.Violations) > 0 {
		res.Timeline = Timeline(rec, res.Violations)
		if cfg.LogDir != "" {
			// The whole record, for checking again offline.
			b, _ := json.Marshal(rec)
			os.WriteFile(filepath.Join(cfg.LogDir, fmt.Sprintf("chaos-seed-%d.json", cfg.Seed)), b, 0o644) //nolint:errcheck // a diagnostic
		}
	} else if logf != nil {
		logf.Close()
		os.Remove(res.LogFile) //nolint:errcheck // nothing to keep
		res.LogFile = ""
	}
	res.Elapsed = time.Since(began)
	return res, nil
}

func (x *run) stop() {
	var wg sync.WaitGroup
	for _, s := range append(append([]*slot(nil), x.workers...), x.cps...) {
		wg.Go(s.stop)
	}
	wg.Wait()
	if x.sim != nil {
		x.sim.stop()
	}
	for _, p := range []*Proxy{x.cpProxy, x.pgProxy} {
		if p != nil {
			p.Close()
		}
	}
}

func (x *run) execute(ctx context.Context, db string) (*Record, error) {
	r, cfg := x.r, x.cfg
	var err error
	if x.pgProxy, err = NewProxy(fmt.Sprintf("127.0.0.1:%d", r.port)); err != nil {
		return nil, err
	}
	if x.cpProxy, err = NewProxy(); err != nil {
		return nil, err
	}
	dbURL, _ := url.Parse(r.cluster.URLFor(db))
	dbURL.Host = x.pgProxy.Addr()

	// The simulator, with the pool's accounts.
	creds := map[string]string{}
	var script sim.Script
	for _, a := range pool {
		kind, cred := sim.KindAPIKey, "sk-ant-api03-chaos-"+randid.Hex(12)
		if !a.Anthropic {
			kind, cred = sim.KindOpenAIKey, "sk-proj-chaos-"+randid.Hex(12)
		}
		creds[a.Name] = cred
		script.Accounts = append(script.Accounts, sim.AccountScript{Name: a.Name, Kind: kind, Credential: cred})
	}
	sb, _ := json.Marshal(script)
	if x.sim, err = startProc(ctx, roleSim, []string{"WEIR_CHAOS_SIM_SCRIPT=" + string(sb)}, x.logw); err != nil {
		return nil, err
	}

	admin, dpToken := "weir_admin_"+randid.Hex(16), "weir_dp_"+randid.Hex(16)
	cpEnv := []string{
		"WEIR_CHAOS_DATABASE_URL=" + dbURL.String(), "WEIR_CHAOS_ADMIN_TOKEN=" + admin, "WEIR_CHAOS_DATAPLANE_TOKEN=" + dpToken,
		"WEIR_CHAOS_SECRET_KEY=" + randid.Hex(32), "WEIR_CHAOS_LEASE_TTL=" + cfg.LeaseTTL.String(),
		"WEIR_CHAOS_CAPACITY_HOLD=" + cfg.CapacityHold.String(), "WEIR_CHAOS_UNREACHABLE_HOLD=" + cfg.UnreachableHold.String(),
	}
	for range numControlPlanes {
		s := &slot{start: func(ctx context.Context) (*proc, error) { return startProc(ctx, roleControlPlane, cpEnv, x.logw) }}
		s.up = func(*proc) { x.refreshControlPlanes() }
		x.cps = append(x.cps, s)
	}
	dpEnv := []string{"WEIR_CHAOS_CONTROLPLANE_URL=http://" + x.cpProxy.Addr(), "WEIR_CHAOS_DATAPLANE_TOKEN=" + dpToken}
	for range numWorkers {
		x.workers = append(x.workers, &slot{start: func(ctx context.Context) (*proc, error) { return startProc(ctx, roleDataPlane, dpEnv, x.logw) }})
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := launchAll(sctx, x.cps); err != nil {
		return nil, fmt.Errorf("control planes: %w", err)
	}
	cp0, _ := x.cps[0].current()
	key, err := seedPool(ctx, cp0.URL, admin, x.sim.URL, creds)
	if err != nil {
		return nil, err
	}
	if err := launchAll(sctx, x.workers); err != nil {
		return nil, fmt.Errorf("workers: %w", err)
	}

	plan := Plan(cfg.Seed, cfg.scheduleConfig(pool))
	x.log.Info("chaos: seed", "seed", cfg.Seed, "events", len(plan))
	// The spent accounts are spent before the first request.
	var spent []Event
	for _, e := range plan {
		if e.Kind == Spent {
			spent = append(spent, e)
			x.spent = append(x.spent, pool[e.Target].Name)
		}
	}
	spentAt := time.Now()
	for _, e := range spent {
		f := sim.Fault{Kind: sim.FaultRateLimit, Times: -1, RetryAfter: int(e.ResetIn / time.Second),
			Unified: &sim.UnifiedRejection{Claim: e.Claim, ResetIn: sim.Duration(e.ResetIn)}}
		if err := addFault(ctx, x.sim.URL, pool[e.Target].Name, f); err != nil {
			return nil, fmt.Errorf("spend %s: %w", pool[e.Target].Name, err)
		}
	}

	t := &traffic{seed: cfg.Seed, key: key, workers: x.workers, clients: map[string]*http.Client{}}
	t.start = time.Now()
	if err := t.prime(ctx); err != nil {
		return nil, err
	}

	// Traffic under the schedule.
	x.start = time.Now()
	t.shift(x.start.Sub(t.start))
	t.start = x.start
	tctx, stopTraffic := context.WithTimeout(ctx, cfg.Duration)
	defer stopTraffic()
	var faults sync.WaitGroup
	for _, e := range plan {
		if e.Kind != Spent {
			faults.Go(func() { x.apply(ctx, e) })
		}
	}
	t.run(tctx, cfg.Clients)
	stopped := time.Since(x.start)
	faults.Wait()
	rec := &Record{Seed: cfg.Seed, Start: x.start, Stopped: stopped, Accounts: pool, LeaseTTL: cfg.LeaseTTL, CapacityHold: cfg.CapacityHold}
	quietFrom := stopped
	for _, a := range x.applied {
		quietFrom = max(quietFrom, a.To)
	}

	conn, err := pgx.Connect(ctx, r.cluster.URLFor(db))
	if err != nil {
		return nil, fmt.Errorf("connect to the run's database: %w", err)
	}
	defer conn.Close(context.Background()) //nolint:errcheck // teardown
	rec.Requests = t.requests()
	// Route events: until every answered request has its own, or the
	// workers have had time to send again what waited (5 s apart at most).
	deadline := x.start.Add(quietFrom + 7*time.Second)
	for {
		if rec.Events, err = routeEvents(ctx, conn); err != nil {
			return nil, err
		}
		if allReported(rec.Requests, rec.Events) || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	// Leases: none live, or a TTL and a margin after the last fault and
	// the end of traffic.
	deadline = x.start.Add(quietFrom + cfg.LeaseTTL + 2*time.Second)
	for {
		if rec.Leases, err = liveLeases(ctx, conn); err != nil {
			return nil, err
		}
		if len(rec.Leases) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if rec.Cooldowns, err = cooldowns(ctx, conn); err != nil {
		return nil, err
	}
	if rec.Attempts, err = attempts(ctx, x.sim.URL); err != nil {
		return nil, err
	}
	rec.Collected = time.Since(x.start)
	rec.Applied = x.applied
	for _, e := range spent {
		// Spent from before priming to beyond the record.
		rec.Applied = append(rec.Applied, Applied{Event: e, From: spentAt.Sub(x.start), To: rec.Collected})
	}
	slices.SortStableFunc(rec.Applied, func(a, b Applied) int { return cmp.Compare(a.From, b.From) })
	return rec, nil
}

func launchAll(ctx context.Context, slots []*slot) error {
	errs := make([]error, len(slots))
	var wg sync.WaitGroup
	for i, s := range slots {
		wg.Go(func() { errs[i] = s.launch(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// refreshControlPlanes points the proxy at the control planes up now.
func (x *run) refreshControlPlanes() {
	var addrs []string
	for _, s := range x.cps {
		if p, _ := s.current(); p != nil {
			addrs = append(addrs, p.addr())
		}
	}
	x.cpProxy.SetBackends(addrs...)
}

// apply runs one event at its time and records it as it ran.
func (x *run) apply(ctx context.Context, e Event) {
	if !sleepUntil(ctx, x.start.Add(e.At)) {
		return
	}
	a := Applied{Event: e, From: time.Since(x.start)}
	hold := func() { sleepUntil(ctx, time.Now().Add(e.For)) }
	switch e.Kind {
	case KillWorker, KillControlPlane:
		s := x.workers
		if e.Kind == KillControlPlane {
			s = x.cps
		}
		_, a.Incarnation = s[e.Target].current()
		s[e.Target].kill()
		if e.Kind == KillControlPlane {
			x.refreshControlPlanes()
		}
		hold()
		s[e.Target].launch(ctx) //nolint:errcheck // only ctx ends it
	case PauseWorker, PauseControlPlane:
		s := x.workers
		if e.Kind == PauseControlPlane {
			s = x.cps
		}
		p, _ := s[e.Target].current()
		if p == nil {
			return
		}
		p.pause()
		hold()
		p.resume()
	case StopPostgres:
		sctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		x.r.cluster.Stop(sctx) //nolint:errcheck // it is started again below
		cancel()
		hold()
		for ctx.Err() == nil {
			if err := x.r.startPostgres(ctx); err == nil {
				break
			}
			x.log.Warn("chaos: postgres did not start again; retrying")
		}
	case CutControlPlanes:
		x.cpProxy.Cut()
	case CutPostgres:
		x.pgProxy.Cut()
	case BlackholeControlPlanes, BlackholePostgres:
		p := x.cpProxy
		if e.Kind == BlackholePostgres {
			p = x.pgProxy
		}
		p.Blackhole(true)
		hold()
		p.Blackhole(false)
	case Upstream, Storm:
		until := time.Now().Add(e.For)
		f := sim.Fault{Kind: e.Fault, Until: until, RetryAfter: e.RetryAfter}
		targets := []Account{pool[e.Target]}
		if e.Kind == Storm {
			// A spent account's 429 comes first in its queue: the storm
			// is for the rest.
			f.Kind, targets = sim.FaultOverloaded, nil
			for _, acct := range pool {
				if acct.Anthropic && !slices.Contains(x.spent, acct.Name) {
					targets = append(targets, acct)
				}
			}
		}
		for _, acct := range targets {
			if err := addFault(ctx, x.sim.URL, acct.Name, f); err != nil {
				x.log.Warn("chaos: add fault", "err", err)
			}
		}
		hold()
	}
	a.To = time.Since(x.start)
	x.mu.Lock()
	x.applied = append(x.applied, a)
	x.mu.Unlock()
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	dctx, cancel := context.WithDeadline(ctx, t)
	defer cancel()
	<-dctx.Done()
	return ctx.Err() == nil
}

// seedPool creates the accounts, pointed at the simulator, and a client
// key, the way `weir dev --simulate` does.
func seedPool(ctx context.Context, cpURL, admin, simURL string, creds map[string]string) (string, error) {
	hc := rpcclient.HTTPClient()
	opt := connect.WithInterceptors(rpcclient.Token(admin))
	accounts := weirv1connect.NewAccountServiceClient(hc, cpURL, opt)
	for _, a := range pool {
		p, base := weirv1.Provider_PROVIDER_ANTHROPIC, simURL
		if !a.Anthropic {
			p, base = weirv1.Provider_PROVIDER_OPENAI, simURL+"/v1"
		}
		if _, err := accounts.CreateAccount(ctx, connect.NewRequest(&weirv1.CreateAccountRequest{
			Provider: p, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY, Label: a.Name, Credential: creds[a.Name],
			BaseUrl: base, MaxConcurrency: int32(a.Cap),
		})); err != nil {
			return "", fmt.Errorf("create account %s: %w", a.Name, err)
		}
	}
	k, err := weirv1connect.NewKeyServiceClient(hc, cpURL, opt).CreateKey(ctx, connect.NewRequest(&weirv1.CreateKeyRequest{Name: "chaos"}))
	if err != nil {
		return "", fmt.Errorf("create key: %w", err)
	}
	// A pool out of quota is answered with the final usage limit, the
	// answer a mixed pool must never get while an account can serve.
	if _, err := weirv1connect.NewSettingsServiceClient(hc, cpURL, opt).UpdateSettings(ctx, connect.NewRequest(&weirv1.UpdateSettingsRequest{
		Settings:   &weirv1.Settings{QuotaResponseMode: weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"quota_response_mode"}},
	})); err != nil {
		return "", fmt.Errorf("quota response mode: %w", err)
	}
	return k.Msg.Secret, nil
}

func addFault(ctx context.Context, simURL, account string, f sim.Fault) error {
	b, _ := json.Marshal([]sim.Fault{f})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, simURL+"/_sim/accounts/"+account+"/faults", bytes.NewReader(b))
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(res.Body, 500))
		return fmt.Errorf("%s: %s", res.Status, msg)
	}
	return nil
}

func attempts(ctx context.Context, simURL string) ([]sim.Attempt, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, simURL+"/_sim/attempts", nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	var out []sim.Attempt
	return out, json.NewDecoder(res.Body).Decode(&out)
}

func routeEvents(ctx context.Context, conn *pgx.Conn) ([]RouteEvent, error) {
	rows, err := conn.Query(ctx, `SELECT request_id, surface, model, stream, status, started_at FROM route_events`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (RouteEvent, error) {
		var e RouteEvent
		return e, row.Scan(&e.RequestID, &e.Surface, &e.Model, &e.Stream, &e.Status, &e.StartedAt)
	})
}

func liveLeases(ctx context.Context, conn *pgx.Conn) ([]Lease, error) {
	rows, err := conn.Query(ctx, `SELECT a.label, l.request_id, l.acquired_at, l.expires_at FROM leases l JOIN accounts a ON a.id = l.account_id WHERE l.expires_at > now()`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Lease, error) {
		var l Lease
		return l, row.Scan(&l.Account, &l.RequestID, &l.Acquired, &l.Expires)
	})
}

func cooldowns(ctx context.Context, conn *pgx.Conn) ([]Cooldown, error) {
	rows, err := conn.Query(ctx, `SELECT a.label, c.reason, c.until FROM cooldowns c JOIN accounts a ON a.id = c.account_id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Cooldown, error) {
		var c Cooldown
		return c, row.Scan(&c.Account, &c.Reason, &c.Until)
	})
}

// allReported says whether every request answered with an id has its
// route event.
func allReported(reqs []Request, events []RouteEvent) bool {
	have := map[string]bool{}
	for _, e := range events {
		have[e.RequestID] = true
	}
	for _, q := range reqs {
		if q.RequestID != "" && !have[q.RequestID] {
			return false
		}
	}
	return true
}
