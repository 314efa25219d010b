package migrate_test

import (
	"strings"
	"testing"

	"github.com/weirhq/weir/internal/migrate"
	"github.com/weirhq/weir/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestUpIsIdempotent: a migrated database migrates again to no effect, and
// every migration is recorded with its checksum.
func TestUpIsIdempotent(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	if err := migrate.Up(t.Context(), pool); err != nil {
		t.Fatalf("second Up: %v", err)
	}
	var n int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM weir_migrations WHERE length(checksum) = 64").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Fatalf("%d migrations recorded with checksums, want every one", n)
	}
}

// TestUpRefusesAnEditedMigration: a migration whose text changed after it
// was applied is an error naming it, not a silent drift.
func TestUpRefusesAnEditedMigration(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	if _, err := pool.Exec(t.Context(), "UPDATE weir_migrations SET checksum = 'x' WHERE version = 1"); err != nil {
		t.Fatal(err)
	}
	err := migrate.Up(t.Context(), pool)
	if err == nil || !strings.Contains(err.Error(), "0001_init.sql changed") {
		t.Fatalf("Up = %v, want an error naming the edited migration", err)
	}
}
