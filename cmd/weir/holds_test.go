package main

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestHolds runs `weir holds` end to end against a weir dev --simulate of
// its own (the scenarios fault its accounts and change their priority),
// with its three Anthropic accounts and short storms: every row meets its fault (each
// faulted account attempted and failed), measures something, and every
// turn but the mixed pool's is served; afterwards the priorities are back
// and the spent account is active again.
func TestHolds(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs every hold scenario in real time")
	}
	dev := startDev(t, t.TempDir())
	out, errOut, err := dev.command(nil, "", "holds", "--agents", "2", "--turns", "2", "--storm", "8s", "--recovery", "4s")
	if err != nil {
		t.Fatalf("weir holds: %v\n%s%s", err, out, errOut)
	}
	t.Logf("report:\n%s", out)
	rows := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| scenario") || strings.HasPrefix(line, "| ---") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) != 7 {
			t.Fatalf("row %q has %d cells, want 7", line, len(cells))
		}
		rows[cells[0]] = cells
	}
	want := []string{
		"only demo-api-key overloaded (529 x5), tried first",
		"only demo-max-1 overloaded (529 x5), tried first",
		"only demo-max-2 overloaded (529 x5), tried first",
		"a blip on every account (529 for 6s from its first attempt)",
		"a 8s storm on every account",
		"mixed pool: demo-max-1 spent (5-hour window), a 8s storm on the others",
		"partial recovery: every account overloaded, demo-max-2 recovers after 4s",
	}
	if len(rows) != len(want) {
		t.Errorf("%d rows, want %d:\n%s", len(rows), len(want), out)
	}
	waiting := regexp.MustCompile(`^ended ≤ [0-9.]+m?s after (the storm ended|demo-max-2 recovered) \(([0-9]+) turns waiting, ([0-9]+) served\)$`)
	met := regexp.MustCompile(`^([0-9]+) turns met the fault, the slowest [0-9.]+m?s$`)
	for _, name := range want {
		r, ok := rows[name]
		if !ok {
			t.Errorf("no row %q", name)
			continue
		}
		if !strings.HasPrefix(r[1], "yes: ") || strings.Contains(r[1], " 0/") {
			t.Errorf("%s: fault met %q, want every faulted account failed at least once", name, r[1])
		}
		if !strings.HasPrefix(name, "mixed pool") && r[2] != "4/4" {
			t.Errorf("%s: %s turns served, want 4/4", name, r[2])
		}
		switch m := waiting.FindStringSubmatch(r[5]); {
		case m != nil:
			if n, _ := strconv.Atoi(m[2]); n < 1 {
				t.Errorf("%s: measured %q, want turns waiting", name, r[5])
			}
		case met.MatchString(r[5]):
		default:
			t.Errorf("%s: measured %q, want the turns that met the fault or waited", name, r[5])
		}
	}
	if strings.Contains(out, "—") {
		t.Errorf("a cell measures nothing:\n%s", out)
	}

	list, err := dev.admin("accounts", "list", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var accounts struct {
		Accounts []struct {
			Label    string `json:"label"`
			State    string `json:"state"`
			Priority int    `json:"priority"`
		} `json:"accounts"`
	}
	if err := json.Unmarshal([]byte(list), &accounts); err != nil || len(accounts.Accounts) == 0 {
		t.Fatalf("accounts list --json: %v\n%s", err, list)
	}
	for _, a := range accounts.Accounts {
		if a.Priority != 0 || (a.Label == "demo-max-1" && a.State != "ACCOUNT_STATE_ACTIVE") {
			t.Errorf("after weir holds: %s priority %d, state %s; want 0 and the spent account active", a.Label, a.Priority, a.State)
		}
	}
}
