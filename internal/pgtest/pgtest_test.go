package pgtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weirhq/weir/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// requireSchema checks the clone carries both halves of the migration.
func requireSchema(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for _, table := range []string{"accounts", "river_job"} {
		var ok bool
		if err := pool.QueryRow(t.Context(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil || !ok {
			t.Errorf("table %s missing from the test database (err %v)", table, err)
		}
	}
}

func insertAccount(t *testing.T, pool *pgxpool.Pool, label string) {
	t.Helper()
	_, err := pool.Exec(t.Context(), `
		INSERT INTO accounts (provider, auth_kind, label, max_concurrency, credential_sealed, credential_hint, created_at, updated_at)
		VALUES ('anthropic', 'api_key', $1, 1, '\x00', 'x', now(), now())`, label)
	if err != nil {
		t.Fatalf("insert account %s: %v", label, err)
	}
}

func labels(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT label FROM accounts ORDER BY label")
	if err != nil {
		t.Fatalf("list accounts: %v", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("list accounts: %v", err)
	}
	return got
}

// TestParallelDatabases runs two parallel tests that each write to the
// same table; each must see only its own row.
func TestParallelDatabases(t *testing.T) {
	for _, name := range []string{"a", "b"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.NewPool(t)
			requireSchema(t, pool)
			insertAccount(t, pool, "only-"+name)
			if got := labels(t, pool); len(got) != 1 || got[0] != "only-"+name {
				t.Errorf("accounts = %v, want just only-%s", got, name)
			}
		})
	}
}

// TestIsolation checks both directions deterministically, whatever the
// scheduling of the parallel test above.
func TestIsolation(t *testing.T) {
	t.Parallel()
	a, b := pgtest.NewPool(t), pgtest.NewPool(t)
	insertAccount(t, a, "in-a")
	if got := labels(t, b); len(got) != 0 {
		t.Errorf("b sees %v written to a", got)
	}
	insertAccount(t, b, "in-b")
	if got := labels(t, a); len(got) != 1 || got[0] != "in-a" {
		t.Errorf("a = %v, want just in-a", got)
	}
}

// TestNewURLDroppedAtCleanup checks the database outlives nothing but its
// test.
func TestNewURLDroppedAtCleanup(t *testing.T) {
	t.Parallel()
	var (
		dbURL  string
		leaked *pgx.Conn
	)
	t.Run("inner", func(t *testing.T) {
		dbURL = pgtest.NewURL(t)
		var err error
		// Left open past the cleanup on purpose: the drop must force it off.
		if leaked, err = pgx.Connect(context.Background(), dbURL); err != nil {
			t.Fatalf("connect: %v", err)
		}
	})
	if leaked != nil {
		defer leaked.Close(context.Background())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err == nil {
		_ = conn.Close(ctx)
		t.Fatal("database still exists after its test's cleanup")
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		t.Fatalf("connect after cleanup: %v, want database does not exist", err)
	}
}
