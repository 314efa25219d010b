package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestAccountsBankedResets: set turns banked resets on with an org, grants
// lists them (none here) and claim-grant goes through the manual claim.
func TestAccountsBankedResets(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	admin := dev.adminIn
	out, err := admin("sk-ant-oat01-banked-resets-00000000000000000000abcd", "accounts", "add", "--label", "banked", "--auth", "oauth", "--secret-stdin", "--base-url", dev.SimulatorURL)
	if err != nil {
		t.Fatalf("accounts add: %v: %s", err, out)
	}
	out, err = admin("", "accounts", "set", "banked", "--banked-resets=on", "--org", "org-1", "--json")
	if err != nil {
		t.Fatalf("accounts set: %v: %s", err, out)
	}
	var got struct {
		BankedResetsEnabled bool
		OrgId               string
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || !got.BankedResetsEnabled || got.OrgId != "org-1" {
		t.Fatalf("accounts set --json: %v: %s", err, out)
	}
	if out, err = admin("", "accounts", "set", "banked", "--banked-resets=maybe"); err == nil {
		t.Fatalf("--banked-resets=maybe accepted: %s", out)
	}
	out, err = admin("", "accounts", "claim-grant", "banked", "g1")
	if err != nil {
		t.Fatalf("accounts claim-grant: %v: %s", err, out)
	}
	if !strings.Contains(out, "not claimed: the grant is not available") {
		t.Errorf("claim-grant of an unknown grant:\n%s", out)
	}
	out, err = admin("", "accounts", "grants", "banked")
	if err != nil {
		t.Fatalf("accounts grants: %v: %s", err, out)
	}
	if !strings.Contains(out, "GRANT") {
		t.Errorf("accounts grants:\n%s", out)
	}
	if out, err = admin("", "accounts", "claim-grant", "banked"); err == nil {
		t.Fatalf("claim-grant without a grant accepted: %s", out)
	}
}
