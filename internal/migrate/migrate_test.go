package migrate_test

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"strings"
	"testing"

	"github.com/weirhq/weir/internal/migrate"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/sql/functions"
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

// TestFunctionFileApplied: a database whose function is not the file's —
// one that ran only the numbered migrations (no weir_functions record), or
// one that ran an older file (a stale checksum) — gets the file's
// definition from Up, and the record of it.
func TestFunctionFileApplied(t *testing.T) {
	t.Parallel()
	files, err := fs.Glob(functions.FS, "*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("sql/functions: %d files, %v", len(files), err)
	}
	type function struct{ name, checksum string }
	var fns []function
	for _, file := range files {
		body, err := fs.ReadFile(functions.FS, file)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(body)
		fns = append(fns, function{strings.TrimSuffix(file, ".sql"), hex.EncodeToString(sum[:])})
	}
	for _, tc := range []struct{ name, forget string }{
		{"numbered migrations only", "DROP TABLE weir_functions"},
		{"an older file", "UPDATE weir_functions SET checksum = 'older'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := pgtest.NewPool(t)
			def := func(name string) string {
				var s string
				if err := pool.QueryRow(ctx, "SELECT pg_get_functiondef($1::regproc)", name).Scan(&s); err != nil {
					t.Fatalf("definition of %s: %v", name, err)
				}
				return s
			}
			want := map[string]string{}
			for _, f := range fns {
				want[f.name] = def(f.name)
				// A comment at the body's start: a definition that differs
				// from the file's, in a function of any language.
				stale := strings.Replace(want[f.name], "AS $function$", "AS $function$\n-- stale", 1)
				if stale == want[f.name] {
					t.Fatalf("%s has no body to mark", f.name)
				}
				if _, err := pool.Exec(ctx, stale); err != nil {
					t.Fatalf("replace %s: %v", f.name, err)
				}
			}
			if _, err := pool.Exec(ctx, tc.forget); err != nil {
				t.Fatal(err)
			}
			if err := migrate.Up(ctx, pool); err != nil {
				t.Fatalf("Up: %v", err)
			}
			for _, f := range fns {
				if got := def(f.name); got != want[f.name] {
					t.Errorf("%s after Up:\n%s\nwant the file's:\n%s", f.name, got, want[f.name])
				}
				var sum string
				if err := pool.QueryRow(ctx, "SELECT checksum FROM weir_functions WHERE name = $1", f.name).Scan(&sum); err != nil || sum != f.checksum {
					t.Errorf("%s recorded as %q (%v), want %q", f.name, sum, err, f.checksum)
				}
			}
		})
	}
}
