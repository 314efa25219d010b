// Package pgtest gives each test its own freshly migrated Postgres
// database, so tests can run in parallel against real Postgres without
// seeing each other's rows.
//
// The first use in a test process starts a private cluster (package
// pgembed) in a temporary directory, or uses the server named by
// WEIR_TEST_DATABASE_URL, and migrates a template database once. Every
// NewPool or NewURL then clones that template, which takes milliseconds,
// and drops the clone when the test ends. Packages using it must hand
// their TestMain to Main so the cluster is stopped afterwards:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weirhq/weir/internal/migrate"
	"github.com/weirhq/weir/internal/pgembed"
	"github.com/weirhq/weir/internal/pgxuuid"
	"github.com/weirhq/weir/internal/randid"
)

// externalURLEnv names an existing server to use instead of a private
// cluster. Its user must be allowed to create databases.
const externalURLEnv = "WEIR_TEST_DATABASE_URL"

const (
	setupTimeout = 2 * time.Minute
	opTimeout    = time.Minute
)

// server is the per-process state: one cluster (or external server), one
// admin pool for CREATE/DROP DATABASE, and one migrated template.
type server struct {
	cluster  *pgembed.Cluster // nil when using an external server
	tmpDir   string
	adminURL string
	admin    *pgxpool.Pool
	template string
	version  int // server_version_num
	err      error
}

// state is the once-state: set up on first use, torn down by Main.
var state struct {
	once sync.Once
	srv  *server
}

func shared() *server {
	state.once.Do(func() { state.srv = setup() })
	return state.srv
}

// Main runs the package's tests and then stops the shared cluster. Use:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run is Main for a TestMain with more to stop after the tests: it runs
// them, stops the shared cluster and returns the exit code instead of
// exiting.
func Run(m *testing.M) int {
	code := m.Run()
	// Marks the once done if no test used a database, so teardown never
	// races a late setup and has nothing to do.
	state.once.Do(func() {})
	if err := state.srv.teardown(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// NewPool returns a pgxpool connected to a fresh database created from the
// migrated template; the pool is closed and the database dropped in
// t.Cleanup.
func NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dbURL := NewURL(t)
	cfg, err := pgxuuid.ParseConfig(dbURL)
	if err != nil {
		t.Fatalf("pgtest: pool config: %v", err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: open pool: %v", err)
	}
	// Cleanups run last-in first-out: the pool closes before the drop.
	t.Cleanup(pool.Close)
	return pool
}

// NewURL is NewPool without the pool: the URL of a fresh migrated database,
// dropped at cleanup. Close every connection to it before the test ends;
// the drop forces them off anyway.
func NewURL(t testing.TB) string {
	t.Helper()
	srv := shared()
	if srv.err != nil {
		// Fatal, not Skip: a missing Postgres must not make tests pass.
		t.Fatalf("pgtest: %v", srv.err)
	}
	name := "t_" + randid.Hex(8)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	stmt := "CREATE DATABASE " + ident(name) + " TEMPLATE " + ident(srv.template)
	if srv.version >= 150000 {
		// For a database this small, copying files beats WAL-logging
		// every page (the PG15+ default).
		stmt += " STRATEGY FILE_COPY"
	}
	if _, err := srv.admin.Exec(ctx, stmt); err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := srv.drop(ctx, name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return withDatabase(srv.adminURL, name)
}

func setup() *server {
	srv := &server{}
	if err := srv.start(); err != nil {
		if terr := srv.teardown(); terr != nil {
			err = fmt.Errorf("%w (cleanup: %v)", err, terr)
		}
		return &server{err: err}
	}
	return srv
}

func (s *server) start() error {
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()

	s.adminURL = os.Getenv(externalURLEnv)
	if s.adminURL == "" {
		dir, err := os.MkdirTemp("", "weir-pgtest-")
		if err != nil {
			return fmt.Errorf("temp dir: %w", err)
		}
		s.tmpDir = dir
		s.cluster, err = pgembed.Start(ctx, pgembed.Config{
			DataDir:  dir,
			Database: "postgres", // always exists; test databases are made per test
			// Durability is worthless for throwaway data; these make the
			// per-test CREATE DATABASE checkpoints nearly free.
			ExtraSettings: map[string]string{
				"fsync":              "off",
				"synchronous_commit": "off",
				"full_page_writes":   "off",
				"max_connections":    "200",
			},
		})
		if err != nil {
			return err
		}
		s.adminURL = s.cluster.URLFor("postgres")
	}

	cfg, err := pgxpool.ParseConfig(s.adminURL)
	if err != nil {
		return fmt.Errorf("parse %s: %w", externalURLEnv, err)
	}
	cfg.MaxConns = 4
	if s.admin, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if err := s.admin.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&s.version); err != nil {
		return fmt.Errorf("connect: %w", err)
	}

	// Random as well as the pid: pids repeat across containers and hosts
	// sharing one WEIR_TEST_DATABASE_URL server.
	name := fmt.Sprintf("weir_template_%d_%s", os.Getpid(), randid.Hex(4))
	if _, err := s.admin.Exec(ctx, "CREATE DATABASE "+ident(name)); err != nil {
		return fmt.Errorf("create template: %w", err)
	}
	s.template = name
	pool, err := pgxpool.New(ctx, withDatabase(s.adminURL, name))
	if err != nil {
		return fmt.Errorf("connect to template: %w", err)
	}
	err = migrate.Up(ctx, pool)
	// A template must have no sessions when it is cloned; Close waits for
	// them to end.
	pool.Close()
	if err != nil {
		return fmt.Errorf("migrate template: %w", err)
	}
	return nil
}

// teardown drops the template (which matters only on an external server),
// stops the cluster and removes its directory. It tolerates a partial setup.
func (s *server) teardown() error {
	if s == nil {
		return nil
	}
	var errs []string
	if s.admin != nil {
		if s.template != "" && s.cluster == nil {
			ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			if err := s.drop(ctx, s.template); err != nil {
				errs = append(errs, err.Error())
			}
			cancel()
		}
		s.admin.Close()
	}
	if s.cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		if err := s.cluster.Stop(ctx); err != nil {
			errs = append(errs, err.Error())
		}
		cancel()
	}
	if s.tmpDir != "" {
		if err := os.RemoveAll(s.tmpDir); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("pgtest: teardown: %s", strings.Join(errs, "; "))
	}
	return nil
}

func (s *server) drop(ctx context.Context, name string) error {
	stmt := "DROP DATABASE IF EXISTS " + ident(name)
	if s.version >= 130000 {
		// Connections a test leaked must not keep its database alive.
		stmt += " WITH (FORCE)"
	}
	if _, err := s.admin.Exec(ctx, stmt); err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	return nil
}

// withDatabase points a connection string, URL or keyword/value form, at
// another database on the same server.
func withDatabase(connString, database string) string {
	if strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://") {
		if u, err := url.Parse(connString); err == nil {
			u.Path, u.RawPath = "/"+database, ""
			return u.String()
		}
	}
	// In keyword/value form a later dbname overrides an earlier one.
	return connString + " dbname='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(database) + "'"
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }
