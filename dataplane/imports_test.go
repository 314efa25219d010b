package dataplane

import (
	"strings"
	"testing"

	"github.com/weirhq/weir/internal/depcheck"
)

const module = depcheck.Module

// TestDataplaneImports: the data plane never touches the database, River or
// the control plane; it speaks to them only through gen/.
func TestDataplaneImports(t *testing.T) {
	t.Parallel()
	deps := depcheck.Deps(t, module+"/dataplane")
	if _, ok := deps[module+"/gen/weir/v1"]; !ok {
		t.Fatalf("go list output does not look right: %d packages, no gen/weir/v1", len(deps))
	}
	depcheck.Forbid(t, "dataplane", deps, []string{"github.com/jackc/pgx", "github.com/riverqueue/river", module + "/controlplane", module + "/jobs"})
	// The same check sees what the control plane imports, so a silent
	// go list cannot make it pass.
	if _, ok := depcheck.Deps(t, module+"/controlplane")["github.com/jackc/pgx/v5"]; !ok {
		t.Error("go list does not report pgx under the control plane: the check is blind")
	}
}

// TestGenImportsNothingOfOurs: generated code depends on no other package
// of this module, so every binary role can use it.
func TestGenImportsNothingOfOurs(t *testing.T) {
	t.Parallel()
	deps := depcheck.Deps(t, module+"/gen/...")
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
