package policy

import (
	"testing"

	"github.com/weirhq/weir/internal/depcheck"
)

// TestPolicyImports: the policy is pure. It never touches the database
// (controlplane/db, pgx), River, Connect or HTTP, and never the control
// plane that calls it: its inputs are its own types.
func TestPolicyImports(t *testing.T) {
	t.Parallel()
	const self = depcheck.Module + "/controlplane/policy"
	deps := depcheck.Deps(t, self)
	if _, ok := deps[depcheck.Module+"/gen/weir/v1"]; !ok {
		t.Fatalf("go list output does not look right: %d packages, no gen/weir/v1", len(deps))
	}
	depcheck.Forbid(t, "controlplane/policy", deps, []string{
		depcheck.Module + "/controlplane", // controlplane/db and the control plane itself
		"github.com/jackc/pgx",
		"github.com/riverqueue/river",
		"connectrpc.com/connect",
		"net/http",
	}, self)
	// The same check sees what the control plane imports, so a silent
	// go list cannot make it pass.
	cp := depcheck.Deps(t, depcheck.Module+"/controlplane")
	for _, want := range []string{"github.com/jackc/pgx/v5", "connectrpc.com/connect", "net/http", depcheck.Module + "/controlplane/db"} {
		if _, ok := cp[want]; !ok {
			t.Errorf("go list does not report %s under the control plane: the check is blind", want)
		}
	}
}
