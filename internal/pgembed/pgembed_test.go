package pgembed_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weirhq/weir/internal/pgembed"
)

// testSettings make the throwaway clusters start and stop quickly.
func testSettings() map[string]string {
	return map[string]string{"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
}

func startCluster(t *testing.T, dir string) *pgembed.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// Through t.Output, so the start/stop lines show up with -v or on failure.
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	c, err := pgembed.Start(ctx, pgembed.Config{DataDir: dir, Logger: log, ExtraSettings: testSettings()})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	// A failing test must not leave a server running; Stop is idempotent.
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	return c
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// postmasterPID reads the pid the server recorded in its data directory.
func postmasterPID(t *testing.T, dataDir string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dataDir, "pgdata", "postmaster.pid"))
	if err != nil {
		t.Fatalf("read postmaster.pid: %v", err)
	}
	line, _, _ := strings.Cut(string(data), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("parse postmaster.pid: %v", err)
	}
	return pid
}

func waitDone(t *testing.T, c *pgembed.Cluster) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("Done not closed after the postmaster exited")
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  pgembed.Config
		want string // substring of the error; "" means valid
	}{
		{"ok", pgembed.Config{DataDir: "/x"}, ""},
		{"no data dir", pgembed.Config{}, "DataDir is required"},
		{"long database", pgembed.Config{DataDir: "/x", Database: strings.Repeat("d", 64)}, "Database"},
		{"reserved setting", pgembed.Config{DataDir: "/x", ExtraSettings: map[string]string{"Port": "1"}}, "Port is chosen by pgembed"},
		{"bad setting name", pgembed.Config{DataDir: "/x", ExtraSettings: map[string]string{"a=b": "1"}}, "invalid setting name"},
	}
	for _, tc := range cases {
		err := tc.cfg.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: Validate() = %v, want nil", tc.name, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate() = %v, want error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestFindBinariesBogusOverride(t *testing.T) {
	t.Parallel()
	_, err := pgembed.FindBinaries(filepath.Join(t.TempDir(), "no-such-dir"))
	if !errors.Is(err, pgembed.ErrNotInstalled) {
		t.Fatalf("FindBinaries(bogus) = %v, want ErrNotInstalled", err)
	}
	for _, fix := range []string{"apt-get install postgresql", "brew install", "WEIR_DATABASE_URL", "BinDir"} {
		if !strings.Contains(err.Error(), fix) {
			t.Errorf("error %q does not mention %q", err, fix)
		}
	}
}

// TestFindBinariesFollowsPATHSymlink covers the /usr/local/bin/initdb ->
// /usr/lib/postgresql/15/bin/initdb layout: the PATH entry holds only a
// link, and postgres must be found next to its target. Not parallel: it
// sets PATH.
func TestFindBinariesFollowsPATHSymlink(t *testing.T) {
	real, err := pgembed.FindBinaries("")
	if err != nil {
		t.Fatalf("FindBinaries: %v", err)
	}
	linkDir := t.TempDir()
	if err := os.Symlink(filepath.Join(real, "initdb"), filepath.Join(linkDir, "initdb")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", linkDir)
	got, err := pgembed.FindBinaries("")
	if err != nil {
		t.Fatalf("FindBinaries via symlink: %v", err)
	}
	want, _ := filepath.EvalSymlinks(real)
	if got != want {
		t.Errorf("FindBinaries via symlink = %s, want %s", got, want)
	}
}

// TestLifecycle walks one data directory through everything a weir dev
// session sees: first start, a second weir refused, clean stop (twice),
// restart with data kept, a crash, and restart after the crash. It is one
// test because initdb dominates the cost. The DataDir is too long to hold a
// unix socket, so the short temporary socket directory is covered too; the
// orphan test covers the usual DataDir/run.
func TestLifecycle(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))

	// First start: initdb, database weir created, loopback URL.
	c := startCluster(t, dir)
	if !strings.HasPrefix(c.URL(), "postgres://weir@127.0.0.1:") || !strings.Contains(c.URL(), "/weir?") {
		t.Errorf("URL() = %q, want a loopback URL for database weir", c.URL())
	}
	conn := connect(t, c.URL())
	if _, err := conn.Exec(t.Context(), "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('persisted')"); err != nil {
		t.Fatalf("write: %v", err)
	}
	var db, sockDir string
	err := connect(t, c.URLFor("postgres")).QueryRow(t.Context(),
		"SELECT current_database(), current_setting('unix_socket_directories')").Scan(&db, &sockDir)
	if err != nil || db != "postgres" {
		t.Fatalf("URLFor(postgres): got %q, %v", db, err)
	}
	sockDir = strings.Trim(sockDir, `"`)
	if strings.HasPrefix(sockDir, dir) || len(sockDir) > 90 {
		t.Errorf("socket dir %q: want a short one outside the long DataDir", sockDir)
	}

	// A second Start on the same directory must name the live server.
	pid := postmasterPID(t, dir)
	if _, err := pgembed.Start(t.Context(), pgembed.Config{DataDir: dir}); err == nil ||
		!strings.Contains(err.Error(), "pid "+strconv.Itoa(pid)) {
		t.Fatalf("second Start on a live data dir = %v, want an error naming pid %d", err, pid)
	}
	if err := conn.Ping(t.Context()); err != nil {
		t.Fatalf("running cluster disturbed by the refused Start: %v", err)
	}
	_ = conn.Close(t.Context())

	// Clean stop, twice.
	if err := c.Stop(t.Context()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	waitDone(t, c)
	if err := c.Stop(t.Context()); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if _, err := os.Stat(sockDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary socket dir %s not removed by Stop: %v", sockDir, err)
	}

	// Restart: the data survived.
	c = startCluster(t, dir)
	var v string
	if err := connect(t, c.URL()).QueryRow(t.Context(), "SELECT v FROM kept").Scan(&v); err != nil || v != "persisted" {
		t.Fatalf("after restart: got %q, %v; want the row written before", v, err)
	}

	// Crash: Done notices, Stop reports it without hanging, every time.
	proc, err := os.FindProcess(postmasterPID(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := proc.Kill(); err != nil {
		t.Fatalf("kill postmaster: %v", err)
	}
	waitDone(t, c)
	err = c.Stop(t.Context())
	if err == nil || !strings.Contains(err.Error(), "already exited") {
		t.Errorf("Stop after crash = %v, want an error reporting the earlier exit", err)
	}
	if err2 := c.Stop(t.Context()); err2 == nil || err2.Error() != err.Error() {
		t.Errorf("second Stop after crash = %v, want the first result %v", err2, err)
	}

	// The stale postmaster.pid must not block the next start.
	c = startCluster(t, dir)
	if err := connect(t, c.URL()).QueryRow(t.Context(), "SELECT v FROM kept").Scan(&v); err != nil {
		t.Fatalf("restart after crash: %v", err)
	}
	// A Stop whose context is already done escalates straight to an
	// immediate shutdown, and still waits for the exit.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop with a done context: %v", err)
	}
	select {
	case <-c.Done():
	default:
		t.Fatal("Stop returned before the postmaster exited")
	}
}

func TestVersionMismatch(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "pgdata"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pgdata", "PG_VERSION"), []byte("9.6\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := pgembed.Start(t.Context(), pgembed.Config{DataDir: dir})
	if err == nil || !strings.Contains(err.Error(), "created by PostgreSQL 9.6") {
		t.Fatalf("Start on a 9.6 data dir = %v, want a version mismatch error", err)
	}
}
