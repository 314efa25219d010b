package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/weirhq/weir/controlplane"
	"github.com/weirhq/weir/controlplane/seal"
	"github.com/weirhq/weir/dataplane"
	"github.com/weirhq/weir/internal/bytesize"
	"github.com/weirhq/weir/internal/migrate"
	"github.com/weirhq/weir/internal/pgxuuid"
	"github.com/weirhq/weir/internal/serve"
	"github.com/weirhq/weir/internal/sim"
	"github.com/weirhq/weir/internal/stack"
	"github.com/weirhq/weir/internal/telemetry"
)

// Default listen addresses; loopback unless an operator says otherwise.
const (
	defaultDataplaneAddr    = "127.0.0.1:7480"
	defaultControlplaneAddr = "127.0.0.1:7481"
	defaultSimAddr          = "127.0.0.1:7482"
)

func newLogger(e env) *slog.Logger {
	level := slog.LevelInfo
	switch strings.ToLower(e.getenv("WEIR_LOG_LEVEL")) {
	case "debug":
		level = slog.LevelDebug
	case "warn":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	}
	return slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: level}))
}

func listen(addr, what string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listen on %s: %w (pick another address with the listen flag)", what, addr, err)
	}
	return ln, nil
}

func openPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxuuid.ParseConfig(url)
	if err != nil {
		return nil, errors.New("database URL is not valid") // the URL may hold a password: never echo it
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to database: %w", err)
	}
	return pool, nil
}

func runMigrate(ctx context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("weir migrate", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	dbURL := fs.String("database-url", e.getenv("WEIR_DATABASE_URL"), "Postgres URL (env WEIR_DATABASE_URL)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dbURL == "" {
		return errors.New("weir migrate: WEIR_DATABASE_URL is required")
	}
	pool, err := openPool(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrate.Up(ctx, pool); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "migrations applied")
	return nil
}

// controlPlaneConfig reads the control plane's secrets and defaults from
// the environment.
func controlPlaneConfig(e env, log *slog.Logger) (controlplane.Config, error) {
	cfg := controlplane.Config{
		AdminToken:     e.getenv("WEIR_ADMIN_TOKEN"),
		DataplaneToken: e.getenv("WEIR_DATAPLANE_TOKEN"),
		OAuthTokenURL:  e.getenv("WEIR_OAUTH_TOKEN_URL"),
		OAuthClientID:  e.getenv("WEIR_OAUTH_CLIENT_ID"),
		CodexTokenURL:  e.getenv("WEIR_CODEX_TOKEN_URL"),
		CodexClientID:  e.getenv("WEIR_CODEX_CLIENT_ID"),
		Logger:         log,
	}
	if err := capacityConfig(e, &cfg); err != nil {
		return cfg, err
	}
	if err := metricsConfig(e, &cfg); err != nil {
		return cfg, err
	}
	if err := peopleConfig(e, &cfg); err != nil {
		return cfg, err
	}
	cfg.MetricsToken = e.getenv("WEIR_METRICS_TOKEN")
	cfg.MetricsApart = e.getenv("WEIR_CONTROLPLANE_METRICS_ADDR") != ""
	key, previous, err := secretKeys(e)
	if err != nil {
		return cfg, err
	}
	cfg.SecretKey, cfg.PreviousSecretKeys = key, previous
	return cfg, cfg.Validate()
}

// secretKeys reads the sealing key, WEIR_SECRET_KEY (required), and the
// retired ones that still open, WEIR_SECRET_KEY_PREVIOUS (comma-separated).
// Errors name the variable, never the value.
func secretKeys(e env) (current []byte, previous [][]byte, err error) {
	raw := e.getenv("WEIR_SECRET_KEY")
	if raw == "" {
		return nil, nil, errors.New("WEIR_SECRET_KEY is required (32 bytes, hex or base64; e.g. openssl rand -hex 32)")
	}
	if current, err = seal.ParseSecretKey(raw); err != nil {
		return nil, nil, fmt.Errorf("WEIR_SECRET_KEY: %w", err)
	}
	previous, err = previousSecretKeys(e)
	return current, previous, err
}

// previousSecretKeys reads WEIR_SECRET_KEY_PREVIOUS.
func previousSecretKeys(e env) ([][]byte, error) {
	var keys [][]byte
	for i, raw := range strings.Split(e.getenv("WEIR_SECRET_KEY_PREVIOUS"), ",") {
		if strings.TrimSpace(raw) == "" {
			continue
		}
		k, err := seal.ParseSecretKey(raw)
		if err != nil {
			return nil, fmt.Errorf("WEIR_SECRET_KEY_PREVIOUS: key %d: %w", i+1, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// holdFromEnv reads a hold budget from the variable name into dst, when
// set: a duration of 0 or more. Config reads 0 as "the default"; an
// explicit 0 means no holding, which Config spells as a negative value.
func holdFromEnv(e env, name, example string, dst *time.Duration) error {
	v := e.getenv(name)
	if v == "" {
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return fmt.Errorf("%s: want a duration of 0 or more like %s (0 fails fast), got %q", name, example, v)
	}
	if d == 0 {
		d = -1
	}
	*dst = d
	return nil
}

// capacityConfig reads WEIR_CAPACITY_HOLD, WEIR_UNREACHABLE_HOLD,
// WEIR_REQUEST_DEADLINE, WEIR_BODY_BUFFER and WEIR_BODY_BUFFER_PER_KEY,
// the defaults until an operator runs 'weir settings set', and
// WEIR_LEASE_REUSE.
func capacityConfig(e env, cfg *controlplane.Config) error {
	for _, v := range []struct {
		name string
		dst  *int64
	}{{"WEIR_BODY_BUFFER", &cfg.BodyBuffer}, {"WEIR_BODY_BUFFER_PER_KEY", &cfg.BodyBufferPerKey}} {
		if s := e.getenv(v.name); s != "" {
			n, err := bytesize.Parse(s)
			if err != nil || n < 1<<20 {
				return fmt.Errorf("%s: want a size of 1MiB or more like 1GiB or 256MiB, got %q", v.name, s)
			}
			*v.dst = n
		}
	}
	if err := holdFromEnv(e, "WEIR_CAPACITY_HOLD", "20m", &cfg.CapacityHold); err != nil {
		return err
	}
	if err := holdFromEnv(e, "WEIR_UNREACHABLE_HOLD", "30s", &cfg.UnreachableHold); err != nil {
		return err
	}
	if v := e.getenv("WEIR_REQUEST_DEADLINE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return fmt.Errorf("WEIR_REQUEST_DEADLINE: want a positive duration like 25m, got %q", v)
		}
		cfg.RequestDeadline = d
	}
	if v := e.getenv("WEIR_LEASE_REUSE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("WEIR_LEASE_REUSE: want a duration of 0 or more like 2s (0 turns reuse off), got %q", v)
		}
		if d == 0 {
			d = -1 // Config reads 0 as "the default"
		}
		cfg.LeaseReuse = d
	}
	return nil
}

// metricsConfig reads WEIR_METRICS_ACCOUNT_LABELS_MAX: up to how many
// accounts the pool may have for each to get its own utilization series
// (labelled by account label). Default 50; 0 turns them off.
func metricsConfig(e env, cfg *controlplane.Config) error {
	v := e.getenv("WEIR_METRICS_ACCOUNT_LABELS_MAX")
	if v == "" {
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return fmt.Errorf("WEIR_METRICS_ACCOUNT_LABELS_MAX: want a number of accounts, 0 or more (0 turns per-account series off), got %q", v)
	}
	if n == 0 {
		n = -1 // Config reads 0 as "the default"
	}
	cfg.MetricsAccountLabelsMax = n
	return nil
}

// peopleConfig reads the OpenID Connect sign-in (WEIR_OIDC_*; off without
// WEIR_OIDC_ISSUER) and WEIR_TRUSTED_PROXIES, comma-separated CIDRs (a
// bare address is its /32 or /128).
func peopleConfig(e env, cfg *controlplane.Config) error {
	cfg.OIDCIssuer = e.getenv("WEIR_OIDC_ISSUER")
	cfg.OIDCName = e.getenv("WEIR_OIDC_NAME")
	cfg.OIDCClientID = e.getenv("WEIR_OIDC_CLIENT_ID")
	cfg.OIDCClientSecret = e.getenv("WEIR_OIDC_CLIENT_SECRET")
	cfg.OIDCRedirectURL = e.getenv("WEIR_OIDC_REDIRECT_URL")
	cfg.OIDCRoles = e.getenv("WEIR_OIDC_ROLES")
	for raw := range strings.SplitSeq(e.getenv("WEIR_TRUSTED_PROXIES"), ",") {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		p, err := netip.ParsePrefix(raw)
		if err != nil {
			a, aerr := netip.ParseAddr(raw)
			if aerr != nil {
				return fmt.Errorf("WEIR_TRUSTED_PROXIES: want CIDRs like 10.0.0.0/8, got %q", raw)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		cfg.TrustedProxies = append(cfg.TrustedProxies, p.Masked())
	}
	return nil
}

// tracing sets up OpenTelemetry tracing from the OTEL_* variables (off
// unless an exporter is configured) for the process named service. stop
// flushes the spans still buffered.
func tracing(ctx context.Context, e env, service string, log *slog.Logger) (tp trace.TracerProvider, stop func(), err error) {
	tp, shutdown, err := telemetry.Setup(ctx, service, e.getenv)
	if err != nil {
		return nil, nil, err
	}
	if tp != nil {
		log.Info("tracing enabled", "service", service)
	}
	return tp, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			log.Warn("flush traces", "err", err)
		}
	}, nil
}

func runControlPlane(ctx context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("weir controlplane", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	addr := fs.String("listen", envOr(e, "WEIR_CONTROLPLANE_LISTEN", defaultControlplaneAddr), "address to serve Connect RPC on (env WEIR_CONTROLPLANE_LISTEN)")
	dbURL := fs.String("database-url", e.getenv("WEIR_DATABASE_URL"), "Postgres URL (env WEIR_DATABASE_URL)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := newLogger(e)
	if *dbURL == "" {
		return errors.New("weir controlplane: WEIR_DATABASE_URL is required ('weir dev' runs an embedded Postgres instead)")
	}
	cfg, err := controlPlaneConfig(e, log)
	if err != nil {
		return fmt.Errorf("weir controlplane: %w", err)
	}
	tc, requireClientCert, err := controlPlaneTLS(e, log)
	if err != nil {
		return fmt.Errorf("weir controlplane: %w", err)
	}
	cfg.LeaseClientCert = requireClientCert
	tp, stopTracing, err := tracing(ctx, e, telemetry.ServiceControlplane, log)
	if err != nil {
		return fmt.Errorf("weir controlplane: %w", err)
	}
	defer stopTracing()
	cfg.TracerProvider = tp
	pool, err := openPool(ctx, *dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrate.Up(ctx, pool); err != nil {
		return err
	}
	cp, err := startControlPlane(ctx, cfg, pool)
	if err != nil {
		return fmt.Errorf("weir controlplane: %w", err)
	}
	ln, err := listen(*addr, "control plane")
	if err != nil {
		return errors.Join(err, cp.Stop(ctx))
	}
	mln, err := metricsListener(e, "WEIR_CONTROLPLANE_METRICS_ADDR", "control-plane metrics")
	if err != nil {
		ln.Close()
		return errors.Join(err, cp.Stop(ctx))
	}
	log.Info("control plane listening", "addr", ln.Addr().String(), "tls", tc != nil, "lease_client_cert", requireClientCert)
	stopMetrics := serveMetrics(ctx, mln, cp.MetricsHandler(), log)
	return errors.Join(serveControlPlane(ctx, cp, ln, tc, log), stopMetrics())
}

// metricsListener listens on the metrics address named by the variable
// name, when it is set (then /metrics is served there only); nil when not.
func metricsListener(e env, name, what string) (net.Listener, error) {
	addr := e.getenv(name)
	if addr == "" {
		return nil, nil
	}
	return listen(addr, what)
}

// serveMetrics serves h on ln (when there is one) until ctx ends; the
// function it returns waits for that and says how it ended.
func serveMetrics(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger) func() error {
	if ln == nil {
		return func() error { return nil }
	}
	log.Info("metrics listening", "addr", ln.Addr().String())
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	done := make(chan error, 1)
	go func() { done <- serve.Run(ctx, ln, mux, serve.Options{Logger: log}) }()
	return func() error { return <-done }
}

// startControlPlane builds a replica and starts it. It refuses to start,
// before it serves anything, when its secret keys open none of the stored
// credentials (controlplane.WrongKeyError).
func startControlPlane(ctx context.Context, cfg controlplane.Config, pool *pgxpool.Pool) (*controlplane.Server, error) {
	cp, err := controlplane.New(cfg, pool)
	if err != nil {
		return nil, err
	}
	if err := cp.Start(ctx); err != nil {
		return nil, err
	}
	return cp, nil
}

// serveControlPlane serves a started replica until ctx ends, over TLS when
// tc is set, then stops it.
func serveControlPlane(ctx context.Context, cp *controlplane.Server, ln net.Listener, tc *tls.Config, log *slog.Logger) error {
	err := serve.Run(ctx, ln, cp.Handler(), serve.Options{Logger: log, TLS: tc})
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return errors.Join(err, cp.Stop(sctx))
}

func runDataPlane(ctx context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("weir dataplane", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	addr := fs.String("listen", envOr(e, "WEIR_DATAPLANE_LISTEN", defaultDataplaneAddr), "address agents connect to (env WEIR_DATAPLANE_LISTEN)")
	cpURL := fs.String("controlplane", e.getenv("WEIR_CONTROLPLANE_URL"), "control-plane URL (env WEIR_CONTROLPLANE_URL; default: the running 'weir dev')")
	fs.String("data-dir", defaultDataDir(e), "where a running 'weir dev' keeps dev.json (env WEIR_DATA_DIR)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dataDir := fs.Lookup("data-dir").Value.String()
	log := newLogger(e)
	cfg := dataplane.Config{ControlPlaneURL: *cpURL, Token: e.getenv("WEIR_DATAPLANE_TOKEN"), Logger: log,
		MetricsToken: e.getenv("WEIR_METRICS_TOKEN"), MetricsApart: e.getenv("WEIR_DATAPLANE_METRICS_ADDR") != ""}
	if cfg.ControlPlaneURL == "" || cfg.Token == "" {
		// Next to a running `weir dev`, join its control plane.
		if d, err := readDevInfo(dataDir); err == nil {
			if cfg.ControlPlaneURL == "" {
				cfg.ControlPlaneURL = d.ControlplaneURL
			}
			if cfg.Token == "" {
				cfg.Token = d.DataplaneToken
			}
		}
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("weir dataplane: %w", err)
	}
	hc, err := controlPlaneClient(e, cfg.ControlPlaneURL, true, log)
	if err != nil {
		return fmt.Errorf("weir dataplane: %w", err)
	}
	cfg.ControlPlane = hc
	tc, err := dataPlaneTLS(e, log)
	if err != nil {
		return fmt.Errorf("weir dataplane: %w", err)
	}
	tp, stopTracing, err := tracing(ctx, e, telemetry.ServiceDataplane, log)
	if err != nil {
		return fmt.Errorf("weir dataplane: %w", err)
	}
	defer stopTracing()
	cfg.TracerProvider = tp
	ln, err := listen(*addr, "data plane")
	if err != nil {
		return err
	}
	mln, err := metricsListener(e, "WEIR_DATAPLANE_METRICS_ADDR", "data-plane metrics")
	if err != nil {
		ln.Close()
		return err
	}
	log.Info("data plane listening", "addr", ln.Addr().String(), "tls", tc != nil)
	return serveDataPlane(ctx, cfg, ln, mln, tc)
}

// serveDataPlane runs a worker until ctx ends, over TLS when tc is set,
// with its /metrics on mln when there is one.
func serveDataPlane(ctx context.Context, cfg dataplane.Config, ln, mln net.Listener, tc *tls.Config) error {
	dp, err := dataplane.New(cfg)
	if err != nil {
		return err
	}
	stopMetrics := serveMetrics(ctx, mln, dp.MetricsHandler(), cfg.Logger)
	err = errors.Join(dp.ServeTLS(ctx, ln, tc), stopMetrics())
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	dp.Close(cctx)
	return err
}

func runSim(ctx context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("weir sim", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	addr := fs.String("listen", defaultSimAddr, "address to serve the simulated upstream on")
	script := fs.String("script", "", "JSON script of accounts and faults, each fault lasting times attempts, for a duration or until a time (see internal/sim/doc.go; default: accept any credential)")
	delay := fs.Duration("delta-delay", 30*time.Millisecond, "pause between streamed text deltas")
	manual := fs.Bool("manual-clock", false, "keep virtual time that only moves on POST /_sim/clock {\"advance\":\"2h\"} (for scenario runs)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := newLogger(e)
	sc := sim.Script{AcceptUnknown: true}
	if *script != "" {
		var err error
		if sc, err = sim.LoadScript(*script); err != nil {
			return fmt.Errorf("weir sim: %w", err)
		}
	}
	ln, err := listen(*addr, "simulator")
	if err != nil {
		return err
	}
	log.Info("simulator listening", "addr", ln.Addr().String())
	s := sim.New(sim.Config{Logger: log, Script: sc, DeltaDelay: *delay, ManualClock: *manual})
	return stack.ServeSim(ctx, s, ln, log)
}

func envOr(e env, key, def string) string {
	if v := e.getenv(key); v != "" {
		return v
	}
	return def
}
