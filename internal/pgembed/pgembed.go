// Package pgembed runs a private PostgreSQL cluster from the locally
// installed server binaries, so `weir dev` and the tests get a real Postgres
// without a system service, docker, or a shared database.
//
// The postmaster is our child process: we initialise the cluster on first
// use, start postgres directly (not through pg_ctl), hand out a loopback
// URL, and stop it ourselves. On Linux the kernel also stops it if we die
// first, so a killed weir leaves no orphan server behind.
//
// Authentication is trust: anyone who can reach 127.0.0.1:port on this
// machine can connect as the superuser. That is the point of a private,
// local development cluster; do not point it at data that matters.
//
// PostgreSQL refuses to run as root. When weir is root (containers, CI),
// initdb and postgres run as the postgres system user, or nobody; the
// cluster and socket directories are chowned to that user, and DataDir's
// root-owned ancestors that user cannot traverse get the other-execute
// bit (search only, not listing), which is logged. Ancestors owned by
// other users are never changed; Start reports them instead.
package pgembed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// superuser is the cluster's bootstrap role, independent of the OS user.
	superuser       = "weir"
	defaultDatabase = "weir"

	readyTimeout  = 60 * time.Second
	pollInterval  = 25 * time.Millisecond
	pingTimeout   = 2 * time.Second
	fastStopGrace = 10 * time.Second // fast shutdown before SIGQUIT
	quitGrace     = 5 * time.Second  // SIGQUIT before SIGKILL
	startAttempts = 5                // a free port can be taken before postgres binds it
	logTailLines  = 20
	logRotateSize = 16 << 20

	// maxSocketDirLen keeps dir + "/.s.PGSQL.65535" within sun_path: 108
	// bytes on Linux, 104 on macOS and the BSDs, both including the NUL.
	maxSocketDirLen = 104 - len("/.s.PGSQL.65535") - 1
)

// reservedSetting reports settings Start chooses itself; letting
// ExtraSettings override them would break URL() or the socket handling.
func reservedSetting(name string) bool {
	switch strings.ToLower(name) {
	case "port", "listen_addresses", "unix_socket_directories", "data_directory":
		return true
	}
	return false
}

// Config configures a private cluster.
type Config struct {
	// DataDir is the directory the cluster lives in: the cluster in
	// DataDir/pgdata, the server log in DataDir/postgres.log, the socket
	// directory in DataDir/run (or a short temporary directory when DataDir
	// is too long for a unix socket path). Required.
	DataDir string
	// Database is created on first start if missing. Default "weir".
	Database string
	// BinDir overrides where initdb and postgres are found. Default: search
	// (see FindBinaries).
	BinDir string
	// Logger receives start/stop lines. Default: discard.
	Logger *slog.Logger
	// ExtraSettings are passed as -c name=value to postgres (tests use
	// fsync=off etc.). port, listen_addresses, unix_socket_directories and
	// data_directory are reserved.
	ExtraSettings map[string]string
	// Port fixes the loopback TCP port, so that a cluster stopped and
	// started again keeps its URL. Default 0: a free port, picked anew on
	// each start.
	Port int
}

// Validate reports the first bad field.
func (c Config) Validate() error {
	if c.DataDir == "" {
		return errors.New("pgembed: DataDir is required")
	}
	// 63 bytes is NAMEDATALEN-1: longer names would be silently truncated.
	if c.Port < 0 || c.Port > 65535 {
		return fmt.Errorf("pgembed: Port %d is not a TCP port", c.Port)
	}
	if len(c.Database) > 63 || strings.ContainsRune(c.Database, 0) {
		return fmt.Errorf("pgembed: Database %q must be at most 63 bytes and contain no NUL", c.Database)
	}
	for name, value := range c.ExtraSettings {
		if name == "" || strings.ContainsAny(name, "= \t\r\n\x00") {
			return fmt.Errorf("pgembed: ExtraSettings: invalid setting name %q", name)
		}
		if reservedSetting(name) {
			return fmt.Errorf("pgembed: ExtraSettings: %s is chosen by pgembed and cannot be set", name)
		}
		if strings.ContainsRune(value, 0) {
			return fmt.Errorf("pgembed: ExtraSettings: value of %s contains NUL", name)
		}
	}
	return nil
}

// Cluster is a running private postmaster.
type Cluster struct {
	log      *slog.Logger
	database string
	pgdata   string
	logPath  string
	sockDir  string
	tempSock bool // sockDir is ours to remove on Stop
	port     int
	// fixedPort is Config.Port: 0 picks a free port per launch.
	fixedPort int
	pm        *postmaster

	ready    atomic.Bool // Start succeeded: an exit from now on is a crash
	stopping atomic.Bool
	stopOnce sync.Once
	stopErr  error
}

// Start initialises the cluster in cfg.DataDir if needed, starts postgres,
// waits until it accepts connections and creates cfg.Database. The caller
// must call Stop; cancelling ctx only aborts Start itself.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Database == "" {
		cfg.Database = defaultDatabase
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	binDir, err := FindBinaries(cfg.BinDir)
	if err != nil {
		return nil, err
	}
	acct, err := serverAccount()
	if err != nil {
		return nil, err
	}

	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("pgembed: data dir: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("pgembed: data dir: %w", err)
	}
	// Postgres gets the resolved path so the directories it traverses are
	// exactly the ones ensureSearchable checked.
	if dataDir, err = filepath.EvalSymlinks(dataDir); err != nil {
		return nil, fmt.Errorf("pgembed: data dir: %w", err)
	}
	if err := ensureSearchable(dataDir, acct, log); err != nil {
		return nil, err
	}

	c := &Cluster{
		log:       log,
		database:  cfg.Database,
		pgdata:    filepath.Join(dataDir, "pgdata"),
		logPath:   filepath.Join(dataDir, "postgres.log"),
		fixedPort: cfg.Port,
	}
	env := childEnv(binDir, c.pgdata, acct)
	version, err := serverVersion(ctx, binDir, env)
	if err != nil {
		return nil, err
	}
	logFile, err := openLog(c.logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the children hold their own descriptors

	if err := c.prepareDataDir(ctx, binDir, version, env, acct, cfg.ExtraSettings, logFile); err != nil {
		return nil, err
	}
	if err := c.makeSocketDir(dataDir, acct, log); err != nil {
		return nil, err
	}
	// From here on a failure must not leave a temporary socket dir behind.
	ok := false
	defer func() {
		if !ok {
			c.removeSocketDir()
		}
	}()

	for attempt := 1; ; attempt++ {
		c.pm, err = c.launch(ctx, binDir, env, acct, cfg.ExtraSettings, logFile)
		if !errors.Is(err, errPortTaken) || attempt == startAttempts || cfg.Port != 0 {
			break
		}
		log.Info("pgembed: port taken before postgres could bind it; retrying", slog.Int("port", c.port), slog.Int("attempt", attempt))
	}
	if err != nil {
		return nil, err
	}
	if err := c.ensureDatabase(ctx); err != nil {
		c.stopping.Store(true)
		_ = c.pm.stop(context.WithoutCancel(ctx), log)
		return nil, err
	}
	c.ready.Store(true)
	ok = true
	log.Info("pgembed: postgres ready", slog.String("data_dir", dataDir), slog.Int("port", c.port),
		slog.Int("pid", c.pm.proc.Pid), slog.String("version", version), slog.String("database", c.database))
	return c, nil
}

// URL returns the connection URL for the configured database over TCP
// loopback, which every client supports.
func (c *Cluster) URL() string { return c.URLFor(c.database) }

// Port is the TCP port the cluster listens on (127.0.0.1).
func (c *Cluster) Port() int { return c.port }

// URLFor returns the connection URL for another database in the cluster.
func (c *Cluster) URLFor(database string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(superuser),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// socketURL reaches the cluster through its private socket directory, so
// the readiness probe cannot be answered by whoever else might have grabbed
// our TCP port.
func (c *Cluster) socketURL(database string) string {
	q := url.Values{"host": {c.sockDir}, "port": {strconv.Itoa(c.port)}, "sslmode": {"disable"}}
	u := url.URL{Scheme: "postgres", User: url.User(superuser), Path: "/" + database, RawQuery: q.Encode()}
	return u.String()
}

// Pid is the postmaster's process id: its process tree is the cluster's
// (a load harness bills its CPU to the service using it).
func (c *Cluster) Pid() int { return c.pm.proc.Pid }

// Done is closed when the postmaster exits, whether by Stop or by a crash.
func (c *Cluster) Done() <-chan struct{} { return c.pm.done }

// Stop shuts the postmaster down: a fast shutdown (SIGINT), escalating to an
// immediate one (SIGQUIT) after 10 s or when ctx is done, and to SIGKILL if
// even that is ignored. It waits for the process to exit. Stop is safe to
// call more than once and after a crash; every call returns the first
// call's result, which is an error only if the postmaster had already
// failed on its own.
func (c *Cluster) Stop(ctx context.Context) error {
	c.stopOnce.Do(func() {
		c.stopping.Store(true)
		defer c.removeSocketDir()
		select {
		case <-c.pm.done:
			if c.pm.err != nil {
				c.stopErr = fmt.Errorf("pgembed: postgres had already exited: %w", c.pm.err)
			}
			return
		default:
		}
		c.stopErr = c.pm.stop(ctx, c.log)
		if c.stopErr == nil {
			c.log.Info("pgembed: postgres stopped", slog.Int("port", c.port))
		}
	})
	return c.stopErr
}

// postmaster is one run of the server process.
type postmaster struct {
	proc *os.Process
	done chan struct{}
	err  error // cmd.Wait's result, set before done is closed
}

// stop shuts the postmaster down and waits for it to exit, escalating
// from fast to immediate shutdown to SIGKILL.
func (p *postmaster) stop(ctx context.Context, log *slog.Logger) error {
	p.signal(sigFast, log)
	grace := time.NewTimer(fastStopGrace)
	defer grace.Stop()
	reason := "fast shutdown took too long"
	select {
	case <-p.done:
		return nil
	case <-grace.C:
	case <-ctx.Done():
		reason = "stop context done"
	}
	log.Warn("pgembed: requesting immediate shutdown", slog.Int("pid", p.proc.Pid), slog.String("reason", reason))
	p.signal(sigImmediate, log)
	quit := time.NewTimer(quitGrace)
	defer quit.Stop()
	select {
	case <-p.done:
		return nil
	case <-quit.C:
	}
	log.Warn("pgembed: postgres ignored immediate shutdown; killing it", slog.Int("pid", p.proc.Pid))
	p.signal(os.Kill, log)
	<-p.done // SIGKILL cannot be ignored
	return nil
}

func (p *postmaster) signal(sig os.Signal, log *slog.Logger) {
	// ErrProcessDone just means it exited between our check and now.
	if err := p.proc.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		log.Warn("pgembed: signalling postgres failed", slog.Int("pid", p.proc.Pid), slog.Any("err", err))
	}
}

// prepareDataDir runs initdb on first start and otherwise checks that the
// existing cluster matches the binaries and is not in use.
func (c *Cluster) prepareDataDir(ctx context.Context, binDir, version string, env []string, acct *account, extra map[string]string, logFile *os.File) error {
	existing, err := os.ReadFile(filepath.Join(c.pgdata, "PG_VERSION"))
	switch {
	case err == nil:
		if got := strings.TrimSpace(string(existing)); got != version {
			return fmt.Errorf("pgembed: %s was created by PostgreSQL %s but the server binaries in %s are PostgreSQL %s; set BinDir to PostgreSQL %s binaries, or move the directory away to start a fresh cluster (or pg_upgrade it)",
				c.pgdata, got, binDir, version, got)
		}
		if err := c.checkNotRunning(); err != nil {
			return err
		}
		return chownTree(c.pgdata, acct)
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("pgembed: read PG_VERSION: %w", err)
	}
	if entries, err := os.ReadDir(c.pgdata); err == nil && len(entries) > 0 {
		return fmt.Errorf("pgembed: %s exists but is not a PostgreSQL data directory (no PG_VERSION); move it away", c.pgdata)
	}
	return c.initdb(ctx, binDir, version, env, acct, extra, logFile)
}

// initdb creates the cluster in a scratch directory and renames it into
// place, so an interrupted initdb never leaves a half-made pgdata that a
// later start would mistake for a cluster (initdb writes PG_VERSION early).
func (c *Cluster) initdb(ctx context.Context, binDir, version string, env []string, acct *account, extra map[string]string, logFile *os.File) error {
	scratch := c.pgdata + ".initdb"
	if err := os.RemoveAll(scratch); err != nil {
		return fmt.Errorf("pgembed: initdb: %w", err)
	}
	if err := os.Mkdir(scratch, 0o700); err != nil {
		return fmt.Errorf("pgembed: initdb: %w", err)
	}
	if err := chownTree(scratch, acct); err != nil {
		return err
	}
	args := []string{
		"-D", scratch,
		"-U", superuser,
		// Trust is fine because the server only listens on loopback and a
		// private socket directory.
		"--auth=trust",
		"--encoding=UTF8",
		"--no-locale",
	}
	if majorNumber(version) >= 14 {
		args = append(args, "--no-instructions")
	}
	if strings.EqualFold(extra["fsync"], "off") {
		// A cluster that will run without fsync gains nothing from a synced initdb.
		args = append(args, "--no-sync")
	}
	c.log.Info("pgembed: initialising cluster", slog.String("dir", c.pgdata), slog.String("version", version))
	offset := logOffset(logFile)
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "initdb"), args...)
	cmd.Env = env
	cmd.Dir = scratch
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr(acct)
	waited, err := startChild(cmd)
	if err == nil {
		err = <-waited
	}
	if err != nil {
		_ = os.RemoveAll(scratch)
		return fmt.Errorf("pgembed: initdb: %w%s", err, c.logTail(offset))
	}
	if err := os.Rename(scratch, c.pgdata); err != nil {
		return fmt.Errorf("pgembed: initdb: %w", err)
	}
	return nil
}

// checkNotRunning refuses to start on a data directory a live postmaster
// still owns. A stale postmaster.pid from a killed run is left for postgres,
// which ignores it when the pid is dead; one whose pid now belongs to an
// unrelated process (or another cluster's postgres) is removed, because
// postgres would refuse it.
func (c *Cluster) checkNotRunning() error {
	pidFile := filepath.Join(c.pgdata, "postmaster.pid")
	data, err := os.ReadFile(pidFile)
	if err != nil {
		return nil
	}
	line, _, _ := strings.Cut(string(data), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 || !processAlive(pid) {
		return nil
	}
	comm, cwd, zombie, ok := processInfo(pid)
	notServer := !strings.HasPrefix(comm, "postgres") && !strings.HasPrefix(comm, "postmaster")
	if ok && (zombie || notServer || cwd != "" && cwd != c.pgdata) {
		c.log.Info("pgembed: removing stale postmaster.pid", slog.Int("pid", pid), slog.String("process", comm))
		if err := os.Remove(pidFile); err != nil {
			return fmt.Errorf("pgembed: remove stale postmaster.pid: %w", err)
		}
		return nil
	}
	return fmt.Errorf("pgembed: %s is in use by a running postgres (pid %d); stop that server or use another DataDir", c.pgdata, pid)
}

// makeSocketDir creates the unix socket directory: DataDir/run when that
// path is short enough, otherwise a short temporary directory removed on
// Stop. It is 0700 and owned by the server's user, so only that user (and
// root) can use the socket.
func (c *Cluster) makeSocketDir(dataDir string, acct *account, log *slog.Logger) error {
	dir := filepath.Join(dataDir, "run")
	if len(dir) <= maxSocketDirLen {
		// Nothing live uses it (checkNotRunning passed), so whatever is in
		// it is stale sockets and lock files from a killed run.
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("pgembed: socket dir: %w", err)
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			return fmt.Errorf("pgembed: socket dir: %w", err)
		}
	} else {
		root := os.TempDir()
		if len(root) > maxSocketDirLen-len("/wpg-1234567890") {
			root = "/tmp"
		}
		var err error
		if dir, err = os.MkdirTemp(root, "wpg-"); err != nil {
			return fmt.Errorf("pgembed: socket dir: %w", err)
		}
		c.tempSock = true
	}
	c.sockDir = dir
	if err := chownTree(dir, acct); err != nil {
		return err
	}
	return ensureSearchable(filepath.Dir(dir), acct, log)
}

func (c *Cluster) removeSocketDir() {
	if c.tempSock && c.sockDir != "" {
		_ = os.RemoveAll(c.sockDir)
	}
}

// errPortTaken marks a start that failed only because another process took
// the port we picked; Start retries those with a new port.
var errPortTaken = errors.New("pgembed: port already in use")

// launch starts the postmaster on a fresh port (or the fixed one) and waits until it accepts
// connections.
func (c *Cluster) launch(ctx context.Context, binDir string, env []string, acct *account, extra map[string]string, logFile *os.File) (*postmaster, error) {
	port := c.fixedPort
	if port == 0 {
		var err error
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	c.port = port
	args := []string{
		"-D", c.pgdata,
		"-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1",
		// Quoted because the value is a list: commas and spaces in the
		// path would otherwise split it.
		"-c", `unix_socket_directories="` + strings.ReplaceAll(c.sockDir, `"`, `""`) + `"`,
		"-c", "cluster_name=weir",
	}
	names := make([]string, 0, len(extra))
	for name := range extra {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		args = append(args, "-c", name+"="+extra[name])
	}

	offset := logOffset(logFile)
	cmd := exec.Command(filepath.Join(binDir, "postgres"), args...)
	cmd.Env = env
	cmd.Dir = c.pgdata
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr(acct)
	c.log.Info("pgembed: starting postgres", slog.String("dir", c.pgdata), slog.Int("port", port))
	waited, err := startChild(cmd)
	if err != nil {
		return nil, fmt.Errorf("pgembed: start postgres: %w", err)
	}
	pm := &postmaster{proc: cmd.Process, done: make(chan struct{})}
	go func() {
		pm.err = <-waited
		if c.ready.Load() && !c.stopping.Load() {
			c.log.Warn("pgembed: postgres exited unexpectedly", slog.Int("pid", pm.proc.Pid),
				slog.Any("err", pm.err), slog.String("log", c.logPath))
		}
		close(pm.done)
	}()

	if err := c.waitReady(ctx, pm); err != nil {
		_ = pm.stop(context.WithoutCancel(ctx), c.log)
		tail := c.logTail(offset)
		if strings.Contains(tail, "could not bind") || strings.Contains(tail, "Address already in use") ||
			strings.Contains(tail, "could not create any TCP/IP sockets") {
			return nil, fmt.Errorf("%w: %d", errPortTaken, port)
		}
		return nil, fmt.Errorf("%w%s", err, tail)
	}
	return pm, nil
}

// waitReady polls the server through its socket until it accepts a
// connection, it exits, ctx ends, or readyTimeout passes.
func (c *Cluster) waitReady(ctx context.Context, pm *postmaster) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	target := c.socketURL("postgres")
	var last error
	for {
		if last = ping(ctx, target); last == nil {
			return nil
		}
		select {
		case <-pm.done:
			return fmt.Errorf("pgembed: postgres exited during startup (%v)", pm.err)
		case <-ctx.Done():
			return fmt.Errorf("pgembed: postgres not accepting connections: %w (last attempt: %v)", ctx.Err(), last)
		case <-tick.C:
		}
	}
}

func ping(ctx context.Context, target string) error {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, target)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// ensureDatabase creates the configured database unless it exists.
func (c *Cluster) ensureDatabase(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.socketURL("postgres"))
	if err != nil {
		return fmt.Errorf("pgembed: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx)) //nolint:errcheck // a one-off connection; the server ends it either way
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", c.database).Scan(&exists); err != nil {
		return fmt.Errorf("pgembed: look up database: %w", err)
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{c.database}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: someone beat us to it
		err = nil
	}
	if err != nil {
		return fmt.Errorf("pgembed: create database: %w", err)
	}
	c.log.Info("pgembed: created database", slog.String("database", c.database))
	return nil
}

// startChild starts cmd from a goroutine locked to its OS thread and keeps
// that thread until the child exits. The parent-death signal is tied to the
// forking thread, and the Go runtime may retire threads, which would shut
// a healthy postmaster down (go.dev/issue/27505). The returned channel
// yields cmd.Wait's result.
func startChild(cmd *exec.Cmd) (<-chan error, error) {
	started := make(chan error, 1)
	waited := make(chan error, 1)
	go func() {
		// Never unlocked: when this goroutine ends, after the child is
		// gone, the runtime discards the thread instead of reusing it.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		waited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return waited, nil
}

// freePort asks the kernel for an unused loopback port. Someone else may
// take it before postgres binds it; launch's caller retries in that case.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgembed: pick port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// childEnv is the whole environment initdb and postgres see: enough to run,
// nothing of ours (no credentials, no PG* variables that would redirect
// them). TZ=UTC makes initdb set the cluster's timezone to UTC.
func childEnv(binDir, pgdata string, acct *account) []string {
	home := pgdata
	if acct != nil {
		if acct.home != "" {
			home = acct.home
		}
	} else if h, err := os.UserHomeDir(); err == nil {
		home = h
	}
	return []string{
		"PATH=" + binDir + string(os.PathListSeparator) + "/usr/bin" + string(os.PathListSeparator) + "/bin",
		"HOME=" + home,
		"PGDATA=" + pgdata,
		"LANG=C",
		"LC_ALL=C",
		"TZ=UTC",
	}
}

// openLog opens the server log for appending, first rotating it once it
// has grown large, since every start appends to it.
func openLog(path string) (*os.File, error) {
	if fi, err := os.Stat(path); err == nil && fi.Size() > logRotateSize {
		_ = os.Rename(path, path+".1")
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pgembed: open log: %w", err)
	}
	return f, nil
}

func logOffset(f *os.File) int64 {
	off, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return 0
	}
	return off
}

// logTail returns the last lines written to the server log since offset,
// formatted for appending to an error.
func (c *Cluster) logTail(offset int64) string {
	f, err := os.Open(c.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	const maxRead = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size()-offset > maxRead {
		offset = fi.Size() - maxRead
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	data, _ := io.ReadAll(f)
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > logTailLines {
		lines = lines[len(lines)-logTailLines:]
	}
	text := string(bytes.Join(lines, []byte("\n")))
	if strings.TrimSpace(text) == "" {
		return ""
	}
	return fmt.Sprintf("; last lines of %s:\n%s", c.logPath, text)
}
