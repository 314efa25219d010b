// Package migrate brings a database up to weir's schema: weir's own
// migrations from sql/migrations, then the functions in sql/functions, then
// River's job tables.
package migrate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/weirhq/weir/sql/functions"
	"github.com/weirhq/weir/sql/migrations"
)

// lockID serialises concurrent migrators (several control planes starting
// at once) on one Postgres advisory lock.
const lockID = 0x77656972 // "weir"

// Up applies every pending migration, weir's and River's. It is safe to
// call from several processes at once.
func Up(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrate: acquire connection: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", lockID); err != nil {
		return fmt.Errorf("migrate: lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", lockID) //nolint:errcheck // the session ends with the connection anyway

	all, fns, err := load()
	if err != nil {
		return err
	}
	if err := applyOwn(ctx, conn.Conn(), all); err != nil {
		return err
	}
	if err := applyFunctions(ctx, conn.Conn(), fns); err != nil {
		return err
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return fmt.Errorf("migrate: river: %w", err)
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate: river: %w", err)
	}
	return nil
}

type migration struct {
	version int
	name    string
	sql     string
}

// checksum identifies a migration's text: one edited after it was applied
// would leave databases that ran the old text silently different.
func (m migration) checksum() string {
	sum := sha256.Sum256([]byte(m.sql))
	return hex.EncodeToString(sum[:])
}

// load reads the embedded migrations and functions, and checks them
// against each other.
func load() ([]migration, []function, error) {
	entries, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		return nil, nil, err
	}
	out := make([]migration, 0, len(entries))
	for _, name := range entries {
		prefix, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(prefix)
		if !ok || err != nil {
			return nil, nil, fmt.Errorf("migrate: %s: name must start with a version number", name)
		}
		body, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, migration{version: v, name: name, sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	versions := make([]int, len(out))
	for i, m := range out {
		versions[i] = m.version
	}
	if err := checkSequence(versions, retired); err != nil {
		return nil, nil, err
	}
	fns, err := loadFunctions()
	if err != nil {
		return nil, nil, err
	}
	if err := checkNotRedefined(out, fns); err != nil {
		return nil, nil, err
	}
	return out, fns, nil
}

// retired are version numbers given up before any release used them:
// nothing is ever applied under them.
var retired = map[int]bool{17: true}

// checkSequence refuses versions (sorted) that do not run 1, 2, 3, …
// without a gap or a repeat, skipping only the retired numbers: a gap is a
// migration lost in a merge, a repeat two branches' migrations under one
// number, and either would apply differently on different databases.
func checkSequence(versions []int, retired map[int]bool) error {
	next := 1
	for _, v := range versions {
		for retired[next] {
			next++
		}
		switch {
		case v < next:
			return fmt.Errorf("migrate: version %04d appears twice", v)
		case v > next:
			return fmt.Errorf("migrate: version %04d is missing (the next after %04d is %04d); a retired number goes in migrate.retired", next, next-1, v)
		}
		next++
	}
	return nil
}

func applyOwn(ctx context.Context, conn *pgx.Conn, all []migration) error {
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS weir_migrations (
		version integer PRIMARY KEY,
		name text NOT NULL,
		checksum text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("migrate: create version table: %w", err)
	}
	applied := map[int]string{}
	rows, err := conn.Query(ctx, "SELECT version, checksum FROM weir_migrations")
	if err != nil {
		return fmt.Errorf("migrate: read versions: %w", err)
	}
	for rows.Next() {
		var v int
		var sum string
		if err := rows.Scan(&v, &sum); err != nil {
			return fmt.Errorf("migrate: read versions: %w", err)
		}
		applied[v] = sum
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("migrate: read versions: %w", err)
	}
	for _, m := range all {
		if sum, ok := applied[m.version]; ok {
			if sum != m.checksum() {
				return fmt.Errorf("migrate: %s changed after this database applied it; restore it and add a new migration instead", m.name)
			}
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO weir_migrations (version, name, checksum) VALUES ($1, $2, $3)", m.version, m.name, m.checksum())
			return err
		})
		if err != nil {
			return fmt.Errorf("migrate: apply %s: %w", m.name, err)
		}
	}
	return nil
}

// function is one file of sql/functions: the whole current definition of
// the function it is named after.
type function struct {
	name string // the function's, the file's name without .sql
	sql  string
}

func (f function) checksum() string {
	sum := sha256.Sum256([]byte(f.sql))
	return hex.EncodeToString(sum[:])
}

func loadFunctions() ([]function, error) {
	entries, err := fs.Glob(functions.FS, "*.sql")
	if err != nil {
		return nil, err
	}
	out := make([]function, 0, len(entries))
	for _, file := range entries {
		body, err := fs.ReadFile(functions.FS, file)
		if err != nil {
			return nil, err
		}
		out = append(out, function{name: strings.TrimSuffix(file, ".sql"), sql: string(body)})
	}
	return out, nil
}

// handedOver is the last migration that may define a function of
// sql/functions: the migrations up to it are history (they ran, and their
// checksums are checked), and from then on the function's file is its one
// definition.
const handedOver = 21

// checkNotRedefined refuses a migration after handedOver that defines a
// function living in sql/functions: its file, applied after every
// migration, would silently replace the migration's text, or the other way
// round on databases that applied them in another order.
func checkNotRedefined(ms []migration, fns []function) error {
	for _, m := range ms {
		if m.version <= handedOver {
			continue
		}
		text := strings.ToLower(m.sql)
		for _, f := range fns {
			if strings.Contains(text, "function "+f.name+"(") || strings.Contains(text, "function "+f.name+" (") {
				return fmt.Errorf("migrate: %s defines %s, whose one definition is sql/functions/%s.sql; edit that file instead", m.name, f.name, f.name)
			}
		}
	}
	return nil
}

// applyFunctions runs each function file whose text differs from the one
// this database last ran, each in a transaction with its record.
func applyFunctions(ctx context.Context, conn *pgx.Conn, fns []function) error {
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS weir_functions (
		name text PRIMARY KEY,
		checksum text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("migrate: create function table: %w", err)
	}
	for _, f := range fns {
		var sum string
		err := conn.QueryRow(ctx, "SELECT checksum FROM weir_functions WHERE name = $1", f.name).Scan(&sum)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("migrate: read function %s: %w", f.name, err)
		}
		if sum == f.checksum() {
			continue
		}
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, f.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO weir_functions (name, checksum) VALUES ($1, $2)
				ON CONFLICT (name) DO UPDATE SET checksum = EXCLUDED.checksum, applied_at = now()`, f.name, f.checksum())
			return err
		})
		if err != nil {
			return fmt.Errorf("migrate: apply sql/functions/%s.sql: %w", f.name, err)
		}
	}
	return nil
}
