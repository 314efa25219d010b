package dataplane

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/weirhq/weir"

// goListDeps returns the import paths of patterns and of everything they
// import (test files excluded), as `go list -deps` sees them.
func goListDeps(t *testing.T, patterns ...string) map[string][]string {
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

// TestDataplaneImports: the data plane never touches the database, River or
// the control plane; it speaks to them only through gen/.
func TestDataplaneImports(t *testing.T) {
	t.Parallel()
	deps := goListDeps(t, module+"/dataplane")
	if _, ok := deps[module+"/gen/weir/v1"]; !ok {
		t.Fatalf("go list output does not look right: %d packages, no gen/weir/v1", len(deps))
	}
	forbidden := []string{"github.com/jackc/pgx", "github.com/riverqueue/river", module + "/controlplane", module + "/jobs"}
	for path := range deps {
		for _, f := range forbidden {
			if path == f || strings.HasPrefix(path, f+"/") {
				// Name who pulls it in, to make the fix obvious.
				var by []string
				for p, imps := range deps {
					for _, i := range imps {
						if i == path {
							by = append(by, p)
						}
					}
				}
				t.Errorf("dataplane depends on %s (imported by %v)", path, by)
			}
		}
	}
	// The same check sees what the control plane imports, so a silent
	// go list cannot make it pass.
	if _, ok := goListDeps(t, module+"/controlplane")["github.com/jackc/pgx/v5"]; !ok {
		t.Error("go list does not report pgx under the control plane: the check is blind")
	}
}

// TestGenImportsNothingOfOurs: generated code depends on no other package
// of this module, so every binary role can use it.
func TestGenImportsNothingOfOurs(t *testing.T) {
	t.Parallel()
	deps := goListDeps(t, module+"/gen/...")
	if _, ok := deps[module+"/gen/weir/v1/weirv1connect"]; !ok {
		t.Fatalf("go list output does not look right: %d packages, no gen/weir/v1/weirv1connect", len(deps))
	}
	for path, imports := range deps {
		if strings.HasPrefix(path, module+"/") && !strings.HasPrefix(path, module+"/gen/") {
			t.Errorf("gen depends on %s", path)
		}
		for _, imp := range imports {
			if (imp == module || strings.HasPrefix(imp, module+"/")) && !strings.HasPrefix(imp, module+"/gen/") {
				t.Errorf("%s imports %s", path, imp)
			}
		}
	}
}
