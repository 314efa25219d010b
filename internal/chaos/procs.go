package chaos

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weirhq/weir/controlplane"
	"github.com/weirhq/weir/dataplane"
	"github.com/weirhq/weir/internal/childproc"
	"github.com/weirhq/weir/internal/pgxuuid"
	"github.com/weirhq/weir/internal/sim"
	"github.com/weirhq/weir/internal/stack"
)

// Every process of a run but the harness and Postgres is this binary
// re-executed in a child role (weir, or the test binary), as bench/child.go
// does: it prints its URL on its first line of stdout and serves until its
// stdin closes (the harness ended) or it is killed.

// childEnv names a chaos child's role; the other WEIR_CHAOS_* variables
// carry its configuration.
const childEnv = "WEIR_CHAOS_CHILD"

const (
	roleControlPlane = "controlplane"
	roleDataPlane    = "dataplane"
	roleSim          = "sim"
)

// ServeChild makes this process a chaos child when the environment asks
// for one, and exits when it is done. A binary that runs the harness calls
// it first thing (cmd/weir's main, the package's TestMain).
func ServeChild() {
	if role := os.Getenv(childEnv); role != "" {
		code := 0
		if err := serveChild(role); err != nil {
			fmt.Fprintln(os.Stderr, "weir chaos child:", err)
			code = 1
		}
		os.Exit(code)
	}
}

func serveChild(role string) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		io.Copy(io.Discard, os.Stdin) //nolint:errcheck // returns when the harness closes stdin or exits
		cancel()
	}()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	switch role {
	case roleControlPlane:
		return serveControlPlane(ctx, ln, log)
	case roleDataPlane:
		dp, err := dataplane.New(dataplane.Config{
			ControlPlaneURL: os.Getenv("WEIR_CHAOS_CONTROLPLANE_URL"), Token: os.Getenv("WEIR_CHAOS_DATAPLANE_TOKEN"), Logger: log,
		})
		if err != nil {
			return err
		}
		announce(ln)
		err = dp.Serve(ctx, ln)
		cctx, ccancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer ccancel()
		dp.Close(cctx)
		return err
	case roleSim:
		var sc sim.Script
		if err := json.Unmarshal([]byte(os.Getenv("WEIR_CHAOS_SIM_SCRIPT")), &sc); err != nil {
			return fmt.Errorf("script: %w", err)
		}
		s := sim.New(sim.Config{Script: sc, DeltaDelay: simDeltaDelay, Deltas: simDeltas})
		srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			<-ctx.Done()
			srv.Close() //nolint:errcheck // ending
		}()
		announce(ln)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	}
	return fmt.Errorf("unknown role %q", role)
}

// The simulator's stream shape: 10 deltas 30 ms apart, so a stream is in
// flight long enough for the caps to matter.
const (
	simDeltaDelay = 30 * time.Millisecond
	simDeltas     = 10
)

func announce(ln net.Listener) { fmt.Printf("http://%s\n", ln.Addr()) }

func serveControlPlane(ctx context.Context, ln net.Listener, log *slog.Logger) error {
	key, err := hex.DecodeString(os.Getenv("WEIR_CHAOS_SECRET_KEY"))
	if err != nil {
		return errors.New("WEIR_CHAOS_SECRET_KEY is not hex")
	}
	durations := map[string]time.Duration{}
	for _, name := range []string{"WEIR_CHAOS_LEASE_TTL", "WEIR_CHAOS_CAPACITY_HOLD", "WEIR_CHAOS_UNREACHABLE_HOLD"} {
		if durations[name], err = time.ParseDuration(os.Getenv(name)); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	pctx, pcancel := context.WithTimeout(ctx, 3*time.Second)
	defer pcancel()
	pcfg, err := pgxuuid.ParseConfig(os.Getenv("WEIR_CHAOS_DATABASE_URL"))
	if err != nil {
		return errors.New("the database URL is not valid") // it may hold a password: never echoed
	}
	pool, err := pgxpool.NewWithConfig(pctx, pcfg)
	if err != nil {
		return errors.New("connect to postgres failed")
	}
	defer pool.Close()
	if err := pool.Ping(pctx); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	// The replica alone: the harness migrated the database, and the
	// simulator and workers are children of their own. A short drain:
	// the harness kills a child that does not end within 5 s.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	st, err := stack.Start(ctx, stack.Options{
		Logger: log, Pool: pool, Migrated: true, ControlPlaneListener: ln, Drain: 2 * time.Second,
		ControlPlane: controlplane.Config{
			AdminToken: os.Getenv("WEIR_CHAOS_ADMIN_TOKEN"), DataplaneToken: os.Getenv("WEIR_CHAOS_DATAPLANE_TOKEN"),
			SecretKey: key, Logger: log, LeaseTTL: durations["WEIR_CHAOS_LEASE_TTL"],
			CapacityHold: durations["WEIR_CHAOS_CAPACITY_HOLD"], UnreachableHold: durations["WEIR_CHAOS_UNREACHABLE_HOLD"],
		},
		Exited: func(_ string, err error) { cancel(cmp.Or(err, errors.New("control plane stopped"))) },
	})
	if err != nil {
		return err
	}
	announce(ln)
	<-ctx.Done()
	err = st.Stop(context.WithoutCancel(ctx))
	if cause := context.Cause(ctx); err == nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return err
}

// proc is one running child.
type proc struct{ *childproc.Child }

// startProc starts a child in role with env, its stderr appended to logw.
func startProc(ctx context.Context, role string, env []string, logw io.Writer) (*proc, error) {
	c, err := childproc.Start(ctx, append([]string{childEnv + "=" + role}, env...), logw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", role, err)
	}
	return &proc{c}, nil
}

func (p *proc) addr() string { return p.Addr() }
func (p *proc) kill()        { p.Kill() }
func (p *proc) stop()        { p.Stop(5 * time.Second) }

// pause and resume SIGSTOP and SIGCONT it.
func (p *proc) pause()  { p.Cmd.Process.Signal(syscall.SIGSTOP) } //nolint:errcheck // best effort
func (p *proc) resume() { p.Cmd.Process.Signal(syscall.SIGCONT) } //nolint:errcheck // best effort

// slot is one component that can be killed and restarted: the current
// process (nil while down) and how to start another.
type slot struct {
	mu    sync.Mutex
	p     *proc
	gen   int // incarnation: bumped at every start
	start func(ctx context.Context) (*proc, error)
	// up is called with the new process once it serves.
	up func(*proc)
}

// current is the running process and its incarnation, nil while down.
func (s *slot) current() (*proc, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.p, s.gen
}

// launch starts a process, retrying every 300 ms until ctx ends (a
// control plane cannot start while Postgres is down, as under a process
// supervisor it would try again).
func (s *slot) launch(ctx context.Context) error {
	for {
		p, err := s.start(ctx)
		if err == nil {
			s.mu.Lock()
			s.p = p
			s.gen++
			s.mu.Unlock()
			if s.up != nil {
				s.up(p)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// kill SIGKILLs the current process, if any; stop ends it gently.
func (s *slot) kill() { s.take(func(p *proc) { p.kill() }) }
func (s *slot) stop() { s.take(func(p *proc) { p.stop() }) }

// take marks the slot down and ends its process, if any, with end.
func (s *slot) take(end func(*proc)) {
	s.mu.Lock()
	p := s.p
	s.p = nil
	s.mu.Unlock()
	if p != nil {
		end(p)
	}
}
