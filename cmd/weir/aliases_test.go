package main

import (
	"strings"
	"testing"
)

// TestAliasesCommands runs `weir aliases` against a real `weir dev
// --simulate`: set, list, replace, remove.
func TestAliasesCommands(t *testing.T) {
	t.Parallel()
	admin := sharedDev(t).admin
	if out, err := admin("aliases", "set", "best", "claude-opus-4-1, claude-sonnet-4-5"); err != nil || !strings.Contains(out, "claude-opus-4-1, claude-sonnet-4-5") {
		t.Fatalf("aliases set: %v: %s", err, out)
	}
	if out, err := admin("aliases", "set", "fast", "claude-haiku-4-5"); err != nil {
		t.Fatalf("aliases set: %v: %s", err, out)
	}
	out, err := admin("aliases", "list")
	if err != nil || !strings.Contains(out, "best") || !strings.Contains(out, "fast") || strings.Index(out, "best") > strings.Index(out, "fast") {
		t.Fatalf("aliases list: %v: %s", err, out)
	}
	if out, err := admin("aliases", "rm", "best"); err != nil || !strings.Contains(out, "deleted best") {
		t.Fatalf("aliases rm: %v: %s", err, out)
	}
	if out, err := admin("aliases", "list", "--json"); err != nil || strings.Contains(out, `"best"`) || !strings.Contains(out, `"fast"`) {
		t.Fatalf("aliases list --json after rm: %v: %s", err, out)
	}
	// A key's own alias, translating: listed under the key, removed by it.
	if out, err := admin("keys", "create", "alias-owner"); err != nil {
		t.Fatalf("keys create: %v: %s", err, out)
	}
	if out, err := admin("aliases", "set", "fast", "claude-haiku-4-5,gpt-5-codex", "--translate", "--key", "alias-owner"); err != nil ||
		!strings.Contains(out, "alias-owner") || !strings.Contains(out, "yes") {
		t.Fatalf("aliases set --key: %v: %s", err, out)
	}
	out, err = admin("aliases", "list")
	if err != nil || !strings.Contains(out, "(every key)") || !strings.Contains(out, "alias-owner") {
		t.Fatalf("aliases list with a key's own: %v: %s", err, out)
	}
	if out, err := admin("aliases", "rm", "fast", "--key", "alias-owner"); err != nil || !strings.Contains(out, "deleted fast") {
		t.Fatalf("aliases rm --key: %v: %s", err, out)
	}
	if out, err := admin("aliases", "list", "--json"); err != nil || strings.Contains(out, "alias-owner") || !strings.Contains(out, `"fast"`) {
		t.Fatalf("aliases list after rm --key (the global fast stays): %v: %s", err, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"aliases", "set", "x", "m", "--key", "no-such-key"}, "not found"},
		{[]string{"aliases", "set", "x"}, "want 2 argument(s)"},
		{[]string{"aliases", "set", "x", "a,,b"}, "targets"},
		{[]string{"aliases", "rm", "nope"}, "not found"},
		{[]string{"aliases", "bogus"}, "unknown subcommand"},
	} {
		if out, err := admin(tc.args...); err == nil || !strings.Contains(strings.ToLower(out+err.Error()), tc.want) {
			t.Errorf("%v: %v: %s, want %q", tc.args, err, out, tc.want)
		}
	}
}
