// Package controlplane owns weir's state in Postgres and serves it over
// Connect RPC (Connect, gRPC and gRPC-Web on one port, h2c or TLS): AccountService
// and KeyService for operators, LeaseService for data-plane workers, and
// River jobs for the periodic work.
package controlplane

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/weirhq/weir/controlplane/dashboard"
	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/notify"
	"github.com/weirhq/weir/controlplane/seal"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/serve"
	"github.com/weirhq/weir/internal/telemetry"
	"github.com/weirhq/weir/jobs"
)

// Server is one control-plane replica: it serves the RPCs and wires the
// services they are made of, the lease service and the jobs' AccountJobs.
type Server struct {
	store
	cfg      Config
	settings settingsSource
	seal     *seal.Sealer
	log      *slog.Logger
	now      func() time.Time
	metrics  *metrics
	integ    *integrityMetrics
	river    *river.Client[pgx.Tx]
	// acct is the jobs' work on accounts, which the account and lease
	// services share a few parts of.
	acct *AccountJobs
	// watch feeds WatchPool from Postgres notifications.
	watch *poolWatch
	// routes is the routing cache Acquire routes over (routecache.go).
	routes *routeCache
	// clock moves the lease clock (leaseclock.go).
	clock ticking
	// notifier raises notifications (notify.go).
	notifier *notify.Notifier
	// prices is the price table route events are priced with (tokens.go).
	prices *priceCache
	// egress are the clients of calls on an account's behalf, through its
	// egress proxy (egress.go).
	egress egressClients
	// oidc is the OpenID provider people sign in with; nil when off.
	oidc *dashboard.OIDC
}

// New builds a replica over a migrated database.
func New(cfg Config, pool *pgxpool.Pool) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	sealer, err := seal.New(cfg.SecretKey, cfg.PreviousSecretKeys...)
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	q := db.New(pool)
	s := &Server{
		store:    store{pool: pool, q: q},
		cfg:      cfg,
		settings: newSettingsSource(q, cfg),
		seal:     sealer,
		log:      cfg.Logger,
		now:      cfg.Now,
		metrics:  newMetrics(cfg.Registry),
		integ:    newIntegrityMetrics(cfg.Registry),
		watch:    newPoolWatch(pool, cfg.Logger),
		egress:   newEgressClients(cfg),
	}
	s.routes = newRouteCache(s.store, s.watch, cfg.Logger, cfg.Now)
	s.acct = &AccountJobs{store: s.store, cfg: cfg, seal: sealer, log: cfg.Logger, now: cfg.Now,
		jitter: defaultJitter, egress: s.egress}
	s.prices = &priceCache{now: cfg.Now}
	if cfg.OIDCIssuer != "" {
		s.oidc = &dashboard.OIDC{Name: cfg.OIDCName, Issuer: cfg.OIDCIssuer, ClientID: cfg.OIDCClientID,
			ClientSecret: cfg.OIDCClientSecret, RedirectURL: cfg.OIDCRedirectURL, Client: cfg.OIDCClient}
	}
	if s.notifier, err = notify.NewNotifier(pool, cfg.Now); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	if s.acct.jobsOut, err = river.NewClient(riverpgxv5.New(pool), &river.Config{}); err != nil {
		return nil, fmt.Errorf("controlplane: river: %w", err)
	}
	cfg.Registry.MustRegister(newPoolCollector(s))
	if !cfg.DisableJobs {
		workers := river.NewWorkers()
		periodic := jobs.Register(workers, jobs.Deps{
			Queries:        s.q,
			Logger:         cfg.Logger,
			Now:            cfg.Now,
			LeaseGrace:     10 * time.Minute,
			LeaseTTL:       cfg.LeaseTTL,
			Retention:      s.RouteRetention,
			UsageRetention: s.UsageRetention,
			SessionTTL:     cfg.SessionTTL,
			Usage:          s.acct,
			Tokens:         s.acct,
			Banked:         s.acct,
			Creds:          s.acct,
			Checks:         s.acct,
			Findings:       s.integ.count,
			Notify:         s,
			NotifyRetry:    cfg.notifyRetry,
		})
		s.river, err = river.NewClient(riverpgxv5.New(pool), &river.Config{
			// River's own info lines (producer stats every few seconds) drown
			// weir's; its warnings and errors still come through.
			Logger:       slog.New(levelFloor{cfg.Logger.Handler(), slog.LevelWarn}).With("component", "river"),
			Queues:       map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
			Workers:      workers,
			PeriodicJobs: periodic,
			JobTimeout:   time.Minute,
			Middleware:   []rivertype.Middleware{s.metrics.jobs},
		})
		if err != nil {
			return nil, fmt.Errorf("controlplane: river: %w", err)
		}
	}
	return s, nil
}

// AccountJobs is the jobs' work on accounts, for running one pass of it
// outside River's schedule (tools, tests).
func (s *Server) AccountJobs() *AccountJobs { return s.acct }

// Start checks that this replica's secret keys open the stored
// credentials, refusing to start (a *WrongKeyError) when they open not
// one, and starts the pool notification listener (WatchPool streams are
// ready once it listens), the River client (job workers and the periodic
// schedule) and the periodic credential check (credcheck.go). They run
// until Stop, or until ctx ends: the listener then ends the WatchPool
// streams, so a draining server does not wait on them.
func (s *Server) Start(ctx context.Context) error {
	if err := s.acct.settleCredentials(ctx); err != nil {
		return fmt.Errorf("controlplane: refusing to start: %w", err)
	}
	s.maintainPartitions(ctx)
	s.watch.start(ctx)
	s.routes.start(ctx)
	if s.river != nil {
		if err := s.river.Start(ctx); err != nil {
			return fmt.Errorf("controlplane: start river: %w", err)
		}
	}
	s.acct.startCredentialWatch(ctx)
	s.startLeaseClock(ctx)
	return nil
}

// maintainPartitions makes the time-partitioned tables' partitions of
// today and the days ahead now, before the first write and whether or not
// this replica runs jobs: a fresh database has them before the retention
// job first runs. It only logs a failure: a write with no partition of its
// own lands in the default partition, and the retention job tries again.
func (s *Server) maintainPartitions(ctx context.Context) {
	_, err := jobs.MaintainPartitions(ctx, jobs.Deps{Queries: s.q, Logger: s.log, Now: s.now,
		Retention: s.RouteRetention, UsageRetention: s.UsageRetention})
	if err != nil {
		s.log.WarnContext(ctx, "partition maintenance at start failed; the retention job tries again", "error", err)
	}
}

// Stop stops the credential check and the listener, ending every
// WatchPool stream, and River, letting running jobs finish until ctx ends.
func (s *Server) Stop(ctx context.Context) error {
	s.acct.creds.stop()
	s.clock.stop()
	s.routes.stop()
	s.watch.stop()
	if s.river == nil {
		return nil
	}
	return s.river.Stop(ctx)
}

// MetricsHandler serves /metrics' content: the control plane's metrics,
// behind Config.MetricsToken when it is set.
func (s *Server) MetricsHandler() http.Handler {
	return serve.Metrics(s.cfg.Registry, s.cfg.MetricsToken)
}

// Handler serves every RPC plus /metrics (unless Config.MetricsApart),
// /healthz and /readyz.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	rpc, paths := s.rpcHandler()
	for _, p := range paths {
		mux.Handle(p, rpc)
	}
	mux.Handle("/dashboard/", s.dashboardHandler(rpc))
	if !s.cfg.MetricsApart {
		mux.Handle("GET /metrics", s.MetricsHandler())
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n")) //nolint:errcheck // a failed health write is the client's problem
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := s.pool.Ping(ctx); err != nil {
			http.Error(w, "database unavailable", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n")) //nolint:errcheck // as above
	})
	return telemetry.RPCHandler(mux, s.cfg.TracerProvider)
}

// rpcHandler serves every Connect service: the network's calls and, in
// process, the dashboard's, through the same interceptors (token, then
// audit, then roles, then errors), and the services' paths.
func (s *Server) rpcHandler() (http.Handler, []string) {
	opts := connect.WithHandlerOptions(
		connect.WithInterceptors(tokenInterceptor{
			admin:     []byte(s.cfg.AdminToken),
			dataplane: []byte(s.cfg.DataplaneToken),
			refused:   s.metrics.unauthenticated,
			person:    s.personOf,
		}, auditInterceptor{q: s.q, now: s.now, log: s.log, failed: s.metrics.auditFailures.Inc}, roleInterceptor{}, errorInterceptor(s.log)),
		// Leases and decisions are a few hundred bytes: gzip would cost
		// both sides CPU on every call and save nothing worth having.
		connect.WithCompressMinBytes(16<<10),
	)
	mux := http.NewServeMux()
	var paths []string
	handle := func(path string, h http.Handler) {
		mux.Handle(path, h)
		paths = append(paths, path)
	}
	handle(weirv1connect.NewAccountServiceHandler(s.accountService(), opts))
	handle(weirv1connect.NewKeyServiceHandler(s.keyService(), opts))
	leasePath, leaseHandler := weirv1connect.NewLeaseServiceHandler(s.leases(), opts)
	if s.cfg.LeaseClientCert {
		leaseHandler = requireClientCert(leaseHandler)
	}
	handle(leasePath, leaseHandler)
	handle(weirv1connect.NewRouteServiceHandler(routeService{store: s.store, now: s.now}, opts))
	handle(weirv1connect.NewSettingsServiceHandler(s.settingsService(), opts))
	handle(weirv1connect.NewAliasServiceHandler(aliasService{store: s.store, now: s.now, log: s.log, watch: s.watch}, opts))
	handle(weirv1connect.NewOpsServiceHandler(opsService{q: s.q}, opts))
	handle(weirv1connect.NewDashboardServiceHandler(s.dashboardService(), opts))
	handle(weirv1connect.NewAuditServiceHandler(auditService{q: s.q}, opts))
	handle(weirv1connect.NewUsageServiceHandler(usageService{store: s.store, now: s.now, sessionTTL: s.cfg.SessionTTL, prices: s.prices}, opts))
	handle(weirv1connect.NewNotifyServiceHandler(s.notifyService(), opts))
	return mux, paths
}

// The services hold what they use of the replica; these build them.

func (s *Server) accountService() accountService {
	return accountService{store: s.store, now: s.now, log: s.log, seal: s.seal, watch: s.watch,
		views:      s.accountViews(),
		identities: identities{q: s.q, seal: s.seal, log: s.log, profile: s.cfg.ProfileClient, proxied: s.egress.profile},
		readUsage:  s.acct.readUsage, bankedReset: s.acct.bankedReset, enqueueCheck: s.acct.enqueueCheck}
}

func (s *Server) leases() leaseService {
	return leaseService{store: s.store, notifier: s.notifier, prices: s.prices, cfg: s.cfg, settings: s.settings, seal: s.seal, log: s.log, now: s.now,
		metrics: s.metrics, watch: s.watch, routes: s.routes, mergeUsageHeaders: s.acct.mergeUsageHeaders, markUnreadable: s.acct.markUnreadable}
}

func (s *Server) keyService() keyService {
	return keyService{store: s.store, now: s.now, log: s.log, watch: s.watch}
}

func (s *Server) settingsService() settingsService {
	return settingsService{store: s.store, settings: s.settings, seal: s.seal, now: s.now, log: s.log}
}

func (s *Server) dashboardService() dashboardService {
	return dashboardService{store: s.store, now: s.now, log: s.log, views: s.accountViews()}
}

func (s *Server) accountViews() accountViews {
	return accountViews{store: s.store, now: s.now, forecasts: s.forecasts, opens: s.acct.opens}
}

// store is the database: the pool, its queries, and the lookups the
// services share.
type store struct {
	pool *pgxpool.Pool
	q    *db.Queries
}

// tx runs fn in a transaction.
func (st store) tx(ctx context.Context, fn func(q *db.Queries) error) error {
	return pgx.BeginFunc(ctx, st.pool, func(tx pgx.Tx) error { return fn(st.q.WithTx(tx)) })
}

// snapshot runs fn's reads in one read-only snapshot (repeatable read):
// what commits meanwhile is in all of them or in none.
func (st store) snapshot(ctx context.Context, fn func(q *db.Queries) error) error {
	return pgx.BeginTxFunc(ctx, st.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error { return fn(st.q.WithTx(tx)) })
}

// levelFloor drops records below a level before they reach a handler.
type levelFloor struct {
	slog.Handler
	min slog.Level
}

func (l levelFloor) Enabled(ctx context.Context, lv slog.Level) bool {
	return lv >= l.min && l.Handler.Enabled(ctx, lv)
}

func (l levelFloor) WithAttrs(a []slog.Attr) slog.Handler {
	return levelFloor{l.Handler.WithAttrs(a), l.min}
}

func (l levelFloor) WithGroup(n string) slog.Handler {
	return levelFloor{l.Handler.WithGroup(n), l.min}
}
