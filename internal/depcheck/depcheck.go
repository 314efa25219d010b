// Package depcheck is what the import tests share: the dependency graph as
// `go list -deps` sees it, and the check that a package reaches none of a
// list of forbidden ones.
package depcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Module is this repository's module path.
const Module = "github.com/weirhq/weir"

// Deps returns the import paths of patterns and of everything they
// import (test files excluded), each with its own imports, as
// `go list -deps` sees them.
func Deps(t testing.TB, patterns ...string) map[string][]string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go binary on PATH: %v", err)
	}
	cmd := exec.Command(goBin, append([]string{"list", "-deps", "-json=ImportPath,Imports"}, patterns...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", patterns, err, stderr.String())
	}
	pkgs := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs[p.ImportPath] = p.Imports
	}
	return pkgs
}

// Forbid fails t for every package in deps (what name depends on) that is
// one of forbidden or under one, but for those exempt, naming who pulls
// it in to make the fix obvious.
func Forbid(t testing.TB, name string, deps map[string][]string, forbidden []string, exempt ...string) {
	t.Helper()
	for path := range deps {
		for _, f := range forbidden {
			if (path == f || strings.HasPrefix(path, f+"/")) && !slices.Contains(exempt, path) {
				var by []string
				for p, imps := range deps {
					if slices.Contains(imps, path) {
						by = append(by, p)
					}
				}
				t.Errorf("%s depends on %s (imported by %v)", name, path, by)
			}
		}
	}
}
