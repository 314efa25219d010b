package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/jackc/pgx/v5"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/weirhq/weir/internal/pgembed"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/sysmon"
)

// proc is one process the apart mode started, its stdout and stderr in a
// log file of its own.
type proc struct {
	name    string
	cmd     *exec.Cmd
	stdin   io.Closer
	logPath string
	done    chan struct{}
}

// startProc runs exe with args and exactly env, its output to
// logDir/<name>.log.
func startProc(name, exe string, args, env []string, logDir string) (*proc, error) {
	logPath := filepath.Join(logDir, strings.ReplaceAll(name, " ", "-")+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	stdin, err := cmd.StdinPipe()
	if err != nil {
		f.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, stdin: stdin, logPath: logPath, done: make(chan struct{})}
	go func() {
		cmd.Wait() //nolint:errcheck // an exit before stop shows in the log tail
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// stop asks the process to end (stdin closed, SIGTERM: weir stops its
// Postgres cleanly on it), and kills it after 20 s.
func (p *proc) stop() {
	p.stdin.Close()                       //nolint:errcheck // a bench child ends on EOF
	p.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // it may be gone
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill() //nolint:errcheck // it may be gone
		<-p.done
	}
}

// failed is err with the end of the process's log, which says why.
func (p *proc) failed(err error) error {
	b, _ := os.ReadFile(p.logPath)
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return fmt.Errorf("%s: %w; its log ends:\n%s", p.name, err, bytes.TrimSpace(b))
}

// waitHTTP polls url until it answers (200 when ok200, else anything), the
// process exits, or a minute passes.
func waitHTTP(ctx context.Context, p *proc, url string, ok200 bool) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			io.Copy(io.Discard, res.Body) //nolint:errcheck // only the status matters
			res.Body.Close()
			if !ok200 || res.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(res.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return p.failed(fmt.Errorf("%s did not answer: %v", url, last))
		case <-p.done:
			return p.failed(errors.New("exited before it answered"))
		case <-tick.C:
		}
	}
}

// freeAddr is a loopback address free a moment ago, for a process whose
// address must be known before it starts.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// weirEnv is the environment of the weir processes: this one's without
// its WEIR_ settings (a database URL or data dir of the user's must not
// leak into the measured stack) but the log level and WEIR_CPU_PROFILE
// (each measured process profiles itself, `%p` telling them apart), plus
// extra.
func weirEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "WEIR_") && !strings.HasPrefix(kv, "WEIR_LOG_LEVEL=") && !strings.HasPrefix(kv, "WEIR_CPU_PROFILE=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// cpuPart is one share of a target's CPU (the control plane, Postgres…):
// its ticks in a reading of the process table.
type cpuPart struct {
	name  string
	ticks func(procTable) int64
}

func treePart(name string, root int) cpuPart {
	return cpuPart{name, func(t procTable) int64 { return t.tree(root) }}
}

// apartTarget is one target of the apart mode: how the load reaches it,
// where its CPU is read, and how it stops.
type apartTarget struct {
	target
	parts []cpuPart
	stops []func()
	// db is its Postgres, when the harness started it: the step reads
	// what the target wrote there (pgWritesAt).
	db string
}

// pgWrites is how far a database's writes have come: its transaction ids
// (one per transaction that wrote) and its WAL position in bytes. Both
// are current the moment they are read, unlike the statistics views.
type pgWrites struct {
	xacts, wal int64
}

// pgWritesAt reads them; the reading itself is one more write transaction
// (pg_current_xact_id assigns an id), which the caller subtracts.
func pgWritesAt(ctx context.Context, url string) (pgWrites, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return pgWrites{}, errors.New("connect to the target's postgres failed")
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // a one-off connection
	var w pgWrites
	err = conn.QueryRow(ctx, `SELECT pg_current_xact_id()::text::bigint, (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint`).Scan(&w.xacts, &w.wal)
	return w, err
}

func (t *apartTarget) stop() {
	// Last started, first stopped: the data plane before its control
	// plane, the control plane before Postgres.
	for i := len(t.stops) - 1; i >= 0; i-- {
		t.stops[i]()
	}
}

// apartEnv is what starting the targets needs.
type apartEnv struct {
	cfg    ApartConfig
	simURL string
	dir    string // logs and data directories
}

func (a apartEnv) env(extra ...string) []string {
	return weirEnv(append(append([]string{}, a.cfg.Env...), extra...)...)
}

// startSim starts `weir sim`, the one upstream of every target.
func startSim(ctx context.Context, cfg ApartConfig, dir string) (*proc, string, error) {
	addr := cfg.SimAddr
	if addr == "" {
		var err error
		if addr, err = freeAddr(); err != nil {
			return nil, "", err
		}
	}
	// Warnings only: a record per attempt would be the simulator's work,
	// not the targets'.
	p, err := startProc("sim", cfg.Binary, []string{"sim", "--listen", addr},
		weirEnv(append(append([]string{}, cfg.Env...), "WEIR_LOG_LEVEL=warn")...), dir)
	if err != nil {
		return nil, "", err
	}
	url := "http://" + addr
	if err := waitHTTP(ctx, p, url+"/", false); err != nil {
		p.stop()
		return nil, "", err
	}
	return p, url, nil
}

// startBare starts the bare proxy: this binary re-executed as a bench
// child (bench/child.go).
func startBare(ctx context.Context, a apartEnv) (*apartTarget, error) {
	return startBareAs(ctx, a, targetBare)
}

// startBareSteady starts the bare proxy with Go's monitor thread at the
// steady poll weir's serving commands run with (internal/sysmon): the
// reference like for like, since any Go proxy gains from the setting.
// The setting goes last (sysmon.With), so a schedtrace in the harness's
// own environment does not win.
func startBareSteady(ctx context.Context, a apartEnv) (*apartTarget, error) {
	return startBareAs(ctx, a, targetBareSteady, "GODEBUG="+sysmon.With(os.Getenv("GODEBUG")))
}

func startBareAs(ctx context.Context, a apartEnv, name string, env ...string) (*apartTarget, error) {
	c, err := startChild(ctx, "bare", append([]string{"WEIR_BENCH_UPSTREAM=" + a.simURL}, env...)...)
	if err != nil {
		return nil, err
	}
	return &apartTarget{target: target{name: name, url: c.URL, key: "sk-ant-api03-bench-direct"},
		parts: []cpuPart{treePart("proxy", c.Cmd.Process.Pid)}, stops: []func(){c.stop}}, nil
}

// startWeirDev starts `weir dev` on a data directory of its own (its
// embedded Postgres is its child), then adds the accounts and a key with
// the CLI, as a user would.
func startWeirDev(ctx context.Context, a apartEnv) (_ *apartTarget, err error) {
	dataDir := filepath.Join(a.dir, "weir-dev")
	// Its pointer file goes in a runtime directory of its own, not the
	// user's, where it would name this stack to the user's commands.
	env := a.env("XDG_RUNTIME_DIR=" + filepath.Join(dataDir, "run"))
	p, err := startProc("weir-dev", a.cfg.Binary, []string{"dev", "--data-dir", dataDir,
		"--listen", "127.0.0.1:0", "--controlplane-listen", "127.0.0.1:0"}, env, a.dir)
	if err != nil {
		return nil, err
	}
	t := &apartTarget{target: target{name: "weir-dev"}, stops: []func(){p.stop}}
	defer func() {
		if err != nil {
			t.stop()
		}
	}()
	var info struct {
		DataplaneURL string `json:"dataplane_url"`
	}
	for info.DataplaneURL == "" {
		if b, err := os.ReadFile(filepath.Join(dataDir, "dev.json")); err == nil {
			json.Unmarshal(b, &info) //nolint:errcheck // written by rename: whole or absent
		}
		if info.DataplaneURL != "" {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-p.done:
			return nil, p.failed(errors.New("exited before it wrote dev.json"))
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := waitHTTP(ctx, p, info.DataplaneURL+"/healthz", true); err != nil {
		return nil, err
	}
	if t.key, err = seedByCLI(ctx, a, env, []string{"--data-dir", dataDir}); err != nil {
		return nil, err
	}
	t.url = info.DataplaneURL
	pid := p.pid()
	t.parts = []cpuPart{
		{"weir", func(t procTable) int64 { return t.ticks[pid] }},
		{"postgres", func(t procTable) int64 { return t.tree(pid) - t.ticks[pid] }},
	}
	return t, nil
}

// startWeirSplit starts an embedded Postgres, `weir controlplane` and
// `weir dataplane` as processes of their own, and seeds them with the
// CLI. Postgres is this process's child; its tree is billed to the target.
func startWeirSplit(ctx context.Context, a apartEnv) (_ *apartTarget, err error) {
	t := &apartTarget{target: target{name: "weir-split"}}
	defer func() {
		if err != nil {
			t.stop()
		}
	}()
	cluster, err := pgembed.Start(ctx, pgembed.Config{DataDir: filepath.Join(a.dir, "weir-split-postgres"), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, fmt.Errorf("embedded postgres: %w", err)
	}
	t.stops = append(t.stops, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		cluster.Stop(sctx) //nolint:errcheck // teardown of a temporary cluster
	})
	cpAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	dpAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	admin, dpToken := "weir_admin_"+randid.Hex(16), "weir_dp_"+randid.Hex(16)
	cp, err := startProc("weir-split-controlplane", a.cfg.Binary, []string{"controlplane", "--listen", cpAddr},
		a.env("WEIR_DATABASE_URL="+cluster.URL(), "WEIR_SECRET_KEY="+randid.Hex(32), "WEIR_ADMIN_TOKEN="+admin, "WEIR_DATAPLANE_TOKEN="+dpToken), a.dir)
	if err != nil {
		return nil, err
	}
	t.stops = append(t.stops, cp.stop)
	cpURL := "http://" + cpAddr
	if err := waitHTTP(ctx, cp, cpURL+"/readyz", true); err != nil {
		return nil, err
	}
	dp, err := startProc("weir-split-dataplane", a.cfg.Binary, []string{"dataplane", "--listen", dpAddr, "--controlplane", cpURL,
		"--data-dir", filepath.Join(a.dir, "weir-split-no-dev")}, a.env("WEIR_DATAPLANE_TOKEN="+dpToken), a.dir)
	if err != nil {
		return nil, err
	}
	t.stops = append(t.stops, dp.stop)
	t.url = "http://" + dpAddr
	if err := waitHTTP(ctx, dp, t.url+"/healthz", true); err != nil {
		return nil, err
	}
	if t.key, err = seedByCLI(ctx, a, a.env("WEIR_ADMIN_TOKEN="+admin), []string{"--controlplane", cpURL}); err != nil {
		return nil, err
	}
	t.parts = []cpuPart{treePart("dataplane", dp.pid()), treePart("controlplane", cp.pid()), treePart("postgres", cluster.Pid())}
	t.db = cluster.URL()
	return t, nil
}

// seedByCLI adds the API-key accounts, pointed at the simulator, and a
// client key through the weir CLI (where: how it finds the control
// plane), and returns the key.
func seedByCLI(ctx context.Context, a apartEnv, env, where []string) (string, error) {
	for i := range a.cfg.Accounts {
		args := append([]string{"accounts", "add", "--label", accountName(i), "--provider", "anthropic", "--auth", "api_key",
			"--secret-stdin", "--base-url", a.simURL, "--max-concurrency", fmt.Sprint(accountCap)}, where...)
		if _, err := runCLI(ctx, a.cfg.Binary, env, "sk-ant-api03-bench-"+randid.Hex(12)+"\n", args...); err != nil {
			return "", err
		}
	}
	out, err := runCLI(ctx, a.cfg.Binary, env, "", append([]string{"keys", "create", "bench", "--json"}, where...)...)
	if err != nil {
		return "", err
	}
	var k struct{ Secret string }
	if err := json.Unmarshal(out, &k); err != nil || k.Secret == "" {
		return "", errors.New("weir keys create --json printed no secret")
	}
	return k.Secret, nil
}

// runCLI runs one weir command with stdin and returns its stdout.
func runCLI(ctx context.Context, exe string, env []string, stdin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = env
	cmd.Stdin = strings.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("weir %s %s: %w: %s", args[0], args[1], err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// startPeer starts another gateway from its command line ({sim} in it
// becomes the simulator's URL, also in WEIR_BENCH_SIM_URL) and waits for
// its URL to answer.
func startPeer(ctx context.Context, a apartEnv, pr Peer) (*apartTarget, error) {
	args := make([]string, len(pr.Cmd))
	for i, s := range pr.Cmd {
		args[i] = strings.ReplaceAll(s, "{sim}", a.simURL)
	}
	p, err := startProc("peer-"+pr.Name, args[0], args[1:], append(os.Environ(), "WEIR_BENCH_SIM_URL="+a.simURL), a.dir)
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, p, pr.URL, false); err != nil {
		p.stop()
		return nil, err
	}
	return &apartTarget{target: target{name: pr.Name, url: strings.TrimSuffix(pr.URL, "/"), header: pr.Header, key: "sk-ant-api03-bench-direct"},
		parts: []cpuPart{treePart("peer", p.pid())}, stops: []func(){p.stop}}, nil
}
