// Package stack runs weir in one process: a database (an embedded
// Postgres, or a pool the caller opened) with its migrations, a control
// plane, the upstream simulator when asked, and data-plane workers, each
// served on its own listener. `weir dev` and the bench build it; the
// options carry what differs between them.
//
// Stop ends the parts in dependency order: workers first (their requests
// in flight release leases through the control plane), then the
// simulator, the control plane, and the database last.
package stack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weirhq/weir/controlplane"
	"github.com/weirhq/weir/dataplane"
	"github.com/weirhq/weir/internal/migrate"
	"github.com/weirhq/weir/internal/pgembed"
	"github.com/weirhq/weir/internal/pgxuuid"
	"github.com/weirhq/weir/internal/serve"
	"github.com/weirhq/weir/internal/sim"
)

// Options shape a stack; zero values are the defaults.
type Options struct {
	// Logger receives Postgres's and the servers' own logs; nil discards
	// them. The control plane's and the workers' loggers are their
	// configs' (this one when those are nil).
	Logger *slog.Logger
	// Pool is the database; the caller opened it and closes it after
	// Stop. Nil starts an embedded Postgres in PostgresDir, which Stop
	// stops.
	Pool        *pgxpool.Pool
	PostgresDir string
	// Migrated says Pool's migrations are applied already (a test
	// database cloned from a migrated template); otherwise Start applies
	// them.
	Migrated bool
	// ControlPlane is the replica's config; its Logger defaults to Logger.
	ControlPlane controlplane.Config
	// ControlPlaneListener is where the control plane serves (HTTP/1.1
	// and h2c); nil is a fresh loopback port.
	ControlPlaneListener net.Listener
	// Sim, when set, runs the simulator with this config, served over
	// HTTP/1.1 only on SimListener (nil: a fresh loopback port): its
	// dropped connections must be dropped TCP connections, not HTTP/2
	// stream resets.
	Sim         *sim.Config
	SimListener net.Listener
	// Drain bounds each served part's drain at Stop, and the control
	// plane's own stop (River's running jobs) after it; zero is each
	// part's own: 10 s for the control plane, the data plane's Serve's
	// for a worker (long streams finish).
	Drain time.Duration
	// Serve, when set, serves each part's handler in place of the
	// stack's own servers (serve.Run for the control plane and workers,
	// ServeSim for the simulator): part is "control plane", "simulator"
	// or "data plane" (ln, when the caller gave one for it, else nil); it
	// returns the URL the part is reached at and a close that ends its
	// serving, connections and all. Tests serve through it to watch or
	// cut the parts' traffic.
	Serve func(part string, h http.Handler, ln net.Listener) (url string, close func(), err error)
	// Exited, when set, hears of a part the stack serves that stopped
	// before Stop asked it to ("control plane", "simulator", "data plane", "postgres"), with
	// its error (nil when it ended cleanly): the caller decides whether
	// the rest goes on.
	Exited func(part string, err error)
}

// Stack is a running weir.
type Stack struct {
	// Pool is the database, Cluster the embedded Postgres (nil when the
	// caller gave the pool).
	Pool    *pgxpool.Pool
	Cluster *pgembed.Cluster
	// ControlPlane is the replica, served at ControlPlaneURL.
	ControlPlane    *controlplane.Server
	ControlPlaneURL string
	// Sim is the simulator, served at SimURL; nil without Options.Sim.
	Sim    *sim.Server
	SimURL string

	opts    Options
	log     *slog.Logger
	ownPool bool
	// stopping is closed when Stop begins: a part ending after it is not
	// news for Options.Exited.
	stopping chan struct{}
	stopOnce sync.Once
	cp, sim  *part
	// cpAddr is where the control plane listened, for a restart.
	cpAddr  string
	mu      sync.Mutex
	workers []*Worker
}

// Worker is one data plane of the stack, served at URL.
type Worker struct {
	Server *dataplane.Server
	URL    string
	part   *part
}

// part is one served component; end ends it, waits for it, and returns
// what its serving returned, named.
type part struct {
	name string
	end  func() error
}

// Start builds and starts the database, the control plane and, with
// Options.Sim, the simulator. On error what started is stopped again.
// The parts run until Stop, not until ctx ends: ctx bounds the start.
func Start(ctx context.Context, o Options) (_ *Stack, err error) {
	s := &Stack{opts: o, log: o.Logger, Pool: o.Pool, stopping: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	defer func() {
		if err != nil {
			s.Stop(context.WithoutCancel(ctx)) //nolint:errcheck // the start's error is the news
		}
	}()
	if s.Pool == nil {
		if s.Cluster, err = pgembed.Start(ctx, pgembed.Config{DataDir: o.PostgresDir, Logger: s.log.With("component", "postgres")}); err != nil {
			return nil, fmt.Errorf("embedded postgres: %w", err)
		}
		go s.watchCluster()
		cfg, err := pgxuuid.ParseConfig(s.Cluster.URL())
		if err != nil {
			return nil, errors.New("connect to embedded postgres failed")
		}
		if s.Pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			return nil, errors.New("connect to embedded postgres failed")
		}
		s.ownPool = true
	}
	if !o.Migrated {
		if err := migrate.Up(ctx, s.Pool); err != nil {
			return nil, err
		}
	}
	if err := s.startControlPlane(ctx, o.ControlPlaneListener); err != nil {
		return nil, err
	}
	if o.Sim != nil {
		if err := s.startSim(o.Sim); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Stack) startControlPlane(ctx context.Context, ln net.Listener) error {
	cfg := s.opts.ControlPlane
	if cfg.Logger == nil {
		cfg.Logger = s.log
	}
	cp, err := controlplane.New(cfg, s.Pool)
	if err != nil {
		return err
	}
	// The replica's life is the part's, not the start's: its pool watch
	// and River run under it.
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	if err := cp.Start(pctx); err != nil {
		cancel()
		return err
	}
	stopCP := func() error {
		sctx, scancel := context.WithTimeout(context.Background(), cmp.Or(s.opts.Drain, 10*time.Second))
		defer scancel()
		err := cp.Stop(sctx)
		cancel()
		return err
	}
	url, p, err := s.serve("control plane", cp.Handler(), ln, stopCP, func(ctx context.Context, ln net.Listener) error {
		return serve.Run(ctx, ln, cp.Handler(), serve.Options{Logger: s.log, ShutdownTimeout: s.opts.Drain})
	})
	if err != nil {
		stopCP() //nolint:errcheck // the listen's error is the news
		return fmt.Errorf("control plane: %w", err)
	}
	s.ControlPlane, s.ControlPlaneURL, s.cp = cp, url, p
	s.cpAddr = strings.TrimPrefix(url, "http://")
	return nil
}

// StopControlPlane kills the control plane: its serving ends, then the
// replica (its pool watch, River). The workers stay, asking a control
// plane that does not answer until StartControlPlane.
func (s *Stack) StopControlPlane() error {
	err := s.cp.stop()
	s.cp = nil
	return err
}

// StartControlPlane starts a control plane again after
// StopControlPlane, on the address the last one had (with
// Options.Serve, wherever it serves it).
func (s *Stack) StartControlPlane(ctx context.Context) error {
	if s.cp != nil {
		return errors.New("stack: the control plane is running")
	}
	var ln net.Listener
	if s.opts.Serve == nil {
		var err error
		if ln, err = net.Listen("tcp", s.cpAddr); err != nil {
			return fmt.Errorf("control plane: %w", err)
		}
	}
	return s.startControlPlane(ctx, ln)
}

func (s *Stack) startSim(cfg *sim.Config) error {
	s.Sim = sim.New(*cfg)
	url, p, err := s.serve("simulator", s.Sim, s.opts.SimListener, nil, func(ctx context.Context, ln net.Listener) error {
		return ServeSim(ctx, s.Sim, ln, s.log)
	})
	if err != nil {
		return fmt.Errorf("simulator: %w", err)
	}
	s.SimURL, s.sim = url, p
	return nil
}

// serve serves a part: through Options.Serve when set, else with run in
// its own goroutine on ln (nil: a fresh loopback port) until the part is
// stopped. after runs once its serving has ended.
func (s *Stack) serve(name string, h http.Handler, ln net.Listener, after func() error,
	run func(context.Context, net.Listener) error) (string, *part, error) {
	if after == nil {
		after = func() error { return nil }
	}
	named := func(err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	if s.opts.Serve != nil {
		url, closeFn, err := s.opts.Serve(name, h, ln)
		if err != nil {
			return "", nil, err
		}
		var once sync.Once
		var stopErr error
		return url, &part{name: name, end: func() error {
			once.Do(func() {
				closeFn()
				stopErr = named(after())
			})
			return stopErr
		}}, nil
	}
	ln, err := listenOr(ln)
	if err != nil {
		return "", nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() {
		defer close(done)
		runErr = errors.Join(run(ctx, ln), after())
		select {
		case <-s.stopping:
		case <-ctx.Done():
		default:
			if s.opts.Exited != nil {
				s.opts.Exited(name, runErr)
			}
		}
	}()
	return "http://" + ln.Addr().String(), &part{name: name, end: func() error {
		cancel()
		<-done
		return named(runErr)
	}}, nil
}

// StartWorker starts a data plane with cfg, served on ln (nil: a fresh
// loopback port). cfg's ControlPlaneURL, Token and Logger default to the
// stack's.
func (s *Stack) StartWorker(cfg dataplane.Config, ln net.Listener) (*Worker, error) {
	if cfg.ControlPlaneURL == "" {
		cfg.ControlPlaneURL = s.ControlPlaneURL
	}
	if cfg.Token == "" {
		cfg.Token = s.opts.ControlPlane.DataplaneToken
	}
	if cfg.Logger == nil {
		cfg.Logger = s.log
	}
	dp, err := dataplane.New(cfg)
	if err != nil {
		return nil, err
	}
	closeDP := func() error {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		dp.Close(cctx)
		return nil
	}
	url, p, err := s.serve("data plane", dp.Handler(), ln, closeDP, func(ctx context.Context, ln net.Listener) error {
		if s.opts.Drain > 0 {
			return serve.Run(ctx, ln, dp.Handler(), serve.Options{Logger: cfg.Logger,
				ShutdownTimeout: s.opts.Drain, ReadHeaderTimeout: cfg.ReadHeaderTimeout})
		}
		return dp.Serve(ctx, ln)
	})
	if err != nil {
		closeDP() //nolint:errcheck // nothing to say
		return nil, fmt.Errorf("data plane: %w", err)
	}
	w := &Worker{Server: dp, URL: url, part: p}
	s.mu.Lock()
	s.workers = append(s.workers, w)
	s.mu.Unlock()
	return w, nil
}

// Workers are the data planes, in start order.
func (s *Stack) Workers() []*Worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Worker(nil), s.workers...)
}

// watchCluster tells Options.Exited when the embedded Postgres exits
// before Stop.
func (s *Stack) watchCluster() {
	select {
	case <-s.Cluster.Done():
		if s.opts.Exited != nil {
			s.opts.Exited("postgres", errors.New("embedded postgres exited"))
		}
	case <-s.stopping:
	}
}

// stop ends p and waits for it; a part not running is nothing to stop.
func (p *part) stop() error {
	if p == nil {
		return nil
	}
	return p.end()
}

// Stop ends every part, workers first, then the simulator, the control
// plane and the database, and returns what the parts' serving returned.
// A second call returns nil at once.
func (s *Stack) Stop(ctx context.Context) error {
	first := false
	s.stopOnce.Do(func() { first = true; close(s.stopping) })
	if !first {
		return nil
	}
	var errs []error
	// Workers drain together: each one's requests release through the
	// control plane, which is still up.
	ws := s.Workers()
	werrs := make([]error, len(ws))
	var wg sync.WaitGroup
	for i, w := range ws {
		wg.Go(func() { werrs[i] = w.part.stop() })
	}
	wg.Wait()
	errs = append(errs, werrs...)
	errs = append(errs, s.sim.stop(), s.cp.stop())
	if s.ownPool && s.Pool != nil {
		s.Pool.Close()
	}
	if s.Cluster != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		if err := s.Cluster.Stop(sctx); err != nil {
			s.log.Error("stop postgres", "err", err)
		}
		cancel()
	}
	return errors.Join(errs...)
}

func listenOr(ln net.Listener) (net.Listener, error) {
	if ln != nil {
		return ln, nil
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// ServeSim serves the simulator over HTTP/1.1 only until ctx ends: its
// dropped connections must be dropped TCP connections, not HTTP/2 stream
// resets.
func ServeSim(ctx context.Context, s *sim.Server, ln net.Listener, log *slog.Logger) error {
	// A request still in flight at exit (a control plane's read its own
	// shutdown left unread) is nothing to wait on for a simulator: it goes
	// with the process after a short drain.
	return serve.Run(ctx, ln, s, serve.Options{ShutdownTimeout: 5 * time.Second, Logger: log,
		QuietErrors: true, HTTP1Only: true})
}
