package pgembed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// ErrNotInstalled means no directory holding both initdb and postgres was
// found. Its text names the fix because it is what a developer sees the
// first time they run `weir dev` or the tests on a fresh machine.
var ErrNotInstalled = errors.New("PostgreSQL server binaries (initdb, postgres) not found; " +
	"install them (Debian/Ubuntu: apt-get install postgresql; macOS: brew install postgresql@15) " +
	"or set WEIR_DATABASE_URL to use an existing server")

// FindBinaries returns the directory that holds initdb and postgres.
//
// A non-empty override is the only place looked at: a wrong explicit
// setting should fail loudly, not be papered over by another install.
// Otherwise it tries PATH (resolving symlinks, because Debian-style
// /usr/local/bin/initdb links point into the versioned directory that also
// holds postgres), then the usual install locations, newest version first.
func FindBinaries(override string) (string, error) {
	if override != "" {
		if hasServerBinaries(override) {
			return filepath.Abs(override)
		}
		return "", fmt.Errorf("pgembed: no initdb and postgres in BinDir %s: %w", override, ErrNotInstalled)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if resolved, err := filepath.EvalSymlinks(p); err == nil {
			if dir := filepath.Dir(resolved); hasServerBinaries(dir) {
				return filepath.Abs(dir)
			}
		}
		// Some installs put symlinks for both in one PATH directory.
		if dir := filepath.Dir(p); hasServerBinaries(dir) {
			return filepath.Abs(dir)
		}
	}
	for _, dir := range candidateDirs() {
		if hasServerBinaries(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("pgembed: searched PATH and the usual install locations: %w", ErrNotInstalled)
}

// candidateDirs lists the well-known install locations, versioned ones
// newest first so a machine with several majors gets the newest.
func candidateDirs() []string {
	var dirs []string
	dirs = append(dirs, newestFirst("/usr/lib/postgresql/*/bin")...) // Debian, Ubuntu
	dirs = append(dirs, newestFirst("/usr/pgsql-*/bin")...)          // RHEL/Fedora PGDG
	dirs = append(dirs, "/usr/local/pgsql/bin")                      // source builds
	dirs = append(dirs, newestFirst("/opt/homebrew/opt/postgresql@*/bin")...)
	dirs = append(dirs, "/opt/homebrew/opt/postgresql/bin", "/opt/homebrew/bin")
	dirs = append(dirs, newestFirst("/usr/local/opt/postgresql@*/bin")...) // Intel Homebrew
	dirs = append(dirs, "/usr/local/opt/postgresql/bin")
	dirs = append(dirs, "/Applications/Postgres.app/Contents/Versions/latest/bin")
	return dirs
}

// newestFirst globs pattern and orders the matches by the first number in
// the path, descending, so 15 sorts before 9.6.
func newestFirst(pattern string) []string {
	matches, _ := filepath.Glob(pattern)
	sort.SliceStable(matches, func(i, j int) bool {
		return leadingVersion(matches[i]) > leadingVersion(matches[j])
	})
	return matches
}

func leadingVersion(path string) int {
	start := strings.IndexAny(path, "0123456789")
	if start < 0 {
		return -1
	}
	end := start
	for end < len(path) && path[end] >= '0' && path[end] <= '9' {
		end++
	}
	n, _ := strconv.Atoi(path[start:end])
	return n
}

func hasServerBinaries(dir string) bool {
	return isExecutable(filepath.Join(dir, "initdb")) && isExecutable(filepath.Join(dir, "postgres"))
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// serverVersion asks the postgres binary for its version and returns the
// major version in PG_VERSION's format: "15" for 15.x, "9.6" for 9.6.x.
func serverVersion(ctx context.Context, binDir string, env []string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "postgres"), "--version")
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("pgembed: postgres --version: %w", err)
	}
	major, ok := parseMajor(string(out))
	if !ok {
		return "", fmt.Errorf("pgembed: postgres --version: unrecognised output %q", strings.TrimSpace(string(out)))
	}
	return major, nil
}

// parseMajor extracts the major version from "postgres (PostgreSQL) 15.18
// (Debian 15.18-0+deb12u1)". Since PostgreSQL 10 the major is one number;
// before that it was two ("9.6").
func parseMajor(out string) (string, bool) {
	_, rest, ok := strings.Cut(out, "(PostgreSQL) ")
	if !ok {
		return "", false
	}
	end := 0
	for end < len(rest) && (rest[end] == '.' || rest[end] >= '0' && rest[end] <= '9') {
		end++
	}
	parts := strings.Split(rest[:end], ".")
	first, err := strconv.Atoi(parts[0])
	if err != nil {
		return "", false
	}
	if first >= 10 || len(parts) < 2 || parts[1] == "" {
		return parts[0], true
	}
	return parts[0] + "." + parts[1], true
}

// majorNumber turns "15" into 15 and "9.6" into 9, for feature checks.
func majorNumber(major string) int {
	n, _ := strconv.Atoi(strings.SplitN(major, ".", 2)[0])
	return n
}
