package migrate

import (
	"strings"
	"testing"
)

// TestFunctionsNotRedefined: a migration after the hand-over that defines a
// function of sql/functions is refused, naming the file to edit; the
// embedded migrations pass.
func TestFunctionsNotRedefined(t *testing.T) {
	t.Parallel()
	if _, _, err := load(); err != nil {
		t.Fatalf("the embedded migrations: %v", err)
	}
	fns := []function{{name: "weir_claim_lease"}}
	for _, tc := range []struct {
		name string
		m    migration
		want string
	}{
		{"history may", migration{version: handedOver, name: "0021_x.sql", sql: "CREATE OR REPLACE FUNCTION weir_claim_lease(p uuid)"}, ""},
		{"a later one may not", migration{version: handedOver + 1, name: "0022_x.sql", sql: "create or replace function WEIR_CLAIM_LEASE (p uuid)"}, "0022_x.sql defines weir_claim_lease, whose one definition is sql/functions/weir_claim_lease.sql"},
		{"a later one may call it", migration{version: handedOver + 1, name: "0022_x.sql", sql: "SELECT weir_claim_lease(NULL)"}, ""},
	} {
		err := checkNotRedefined([]migration{tc.m}, fns)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}
