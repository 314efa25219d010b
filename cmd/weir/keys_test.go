package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestKeysRestrictions runs `weir keys create|update|list` with the
// restriction flags against a real `weir dev --simulate`, and checks that
// the data plane applies what the commands set.
func TestKeysRestrictions(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	admin := dev.admin

	out, err := admin("keys", "create", "limited", "--models", "claude-haiku-*, gpt-5*", "--accounts", "demo-api-key", "--rate-limit", "60/m", "--json")
	if err != nil {
		t.Fatalf("keys create: %v: %s", err, out)
	}
	var created struct {
		Secret string
		Key    struct {
			AllowedModels      []string `json:"allowedModels"`
			Pinned             bool
			PinnedAccounts     []struct{ Label string }
			RateLimitPerMinute int32 `json:"rateLimitPerMinute"`
		}
	}
	if err := json.Unmarshal([]byte(out), &created); err != nil {
		t.Fatalf("keys create --json: %v: %s", err, out)
	}
	k := created.Key
	if strings.Join(k.AllowedModels, " ") != "claude-haiku-* gpt-5*" || !k.Pinned || len(k.PinnedAccounts) != 1 ||
		k.PinnedAccounts[0].Label != "demo-api-key" || k.RateLimitPerMinute != 60 {
		t.Fatalf("created key: %s", out)
	}
	// The allowlist applies at once: the demo's sonnet model is refused.
	resp, body := postMessage(t, dev.DataplaneURL, created.Secret, hello)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "permission_error") ||
		!strings.Contains(string(body), `model \"claude-sonnet-4-5\" is not allowed`) {
		t.Fatalf("disallowed model: %d %s", resp.StatusCode, body)
	}

	out, err = admin("keys", "create", "plain")
	if err != nil || strings.Contains(out, "Restricted") {
		t.Fatalf("keys create without restrictions: %v: %s", err, out)
	}
	out, err = admin("keys", "list")
	if err != nil {
		t.Fatalf("keys list: %v: %s", err, out)
	}
	for _, want := range []string{"MODELS", "ACCOUNTS", "RATE", "claude-haiku-*,gpt-5*", "demo-api-key", "60/m"} {
		if !strings.Contains(out, want) {
			t.Errorf("keys list lacks %q: %s", want, out)
		}
	}
	line := func(out, name string) string {
		for l := range strings.SplitSeq(out, "\n") {
			if strings.HasPrefix(l, name+" ") {
				return l
			}
		}
		t.Fatalf("no line for %s: %s", name, out)
		return ""
	}
	if l := line(out, "plain"); strings.Count(l, " any ") != 2 || !strings.Contains(l, " - ") {
		t.Errorf("an unrestricted key's line: %q", l)
	}

	// update changes only what it names; "any" and "none" lift.
	if out, err := admin("keys", "update", "limited", "--models", "any", "--rate-limit", "none"); err != nil {
		t.Fatalf("keys update: %v: %s", err, out)
	} else if l := line(out, "limited"); !strings.Contains(l, "any") || !strings.Contains(l, "demo-api-key") || strings.Contains(l, "60/m") {
		t.Errorf("after lifting models and rate: %q", l)
	}
	resp, body = postMessage(t, dev.DataplaneURL, created.Secret, hello)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after lifting the allowlist: %d %s", resp.StatusCode, body)
	}
	// --metered: the key's own metered_accounts, shown in the list;
	// "default" follows the global setting again.
	if out, err := admin("keys", "update", "limited", "--metered", "never"); err != nil {
		t.Fatalf("keys update --metered never: %v: %s", err, out)
	} else if l := line(out, "limited"); !strings.Contains(l, " never ") {
		t.Errorf("after --metered never: %q", l)
	}
	if out, err := admin("keys", "update", "limited", "--metered", "default"); err != nil {
		t.Fatalf("keys update --metered default: %v: %s", err, out)
	} else if l := line(out, "limited"); !strings.Contains(l, " default ") {
		t.Errorf("after --metered default: %q", l)
	}
	if out, err := admin("keys", "create", "lastly", "--metered", "last_resort"); err != nil || !strings.Contains(out, "metered accounts last_resort") {
		t.Errorf("keys create --metered last_resort: %v: %s", err, out)
	}
	if out, err := admin("keys", "update", "limited", "--accounts", "demo-max-1,demo-api-key", "--rate-limit", "5/min"); err != nil {
		t.Fatalf("keys update: %v: %s", err, out)
	} else if l := line(out, "limited"); !strings.Contains(l, "demo-api-key,demo-max-1") || !strings.Contains(l, "5/m") {
		t.Errorf("after pinning two accounts: %q", l)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"keys", "create", "x", "--rate-limit", "0/m"}, "at least 1"},
		{[]string{"keys", "create", "x", "--rate-limit", "-3/m"}, "at least 1"},
		{[]string{"keys", "create", "x", "--rate-limit", "60/h"}, "n/m"},
		{[]string{"keys", "create", "x", "--rate-limit", "60"}, "n/m"},
		{[]string{"keys", "create", "x", "--models", "claude-*-sonnet"}, "only a trailing *"},
		{[]string{"keys", "create", "x", "--accounts", "demo-api-key,nope"}, `no account "nope"`},
		{[]string{"keys", "update", "limited"}, "name something to change"},
		{[]string{"keys", "create", "x", "--metered", "sometimes"}, "want normal, last_resort, never or default"},
		{[]string{"keys", "update", "nope", "--models", "any"}, "not found"},
	} {
		if out, err := admin(tc.args...); err == nil || !strings.Contains(strings.ToLower(out+err.Error()), strings.ToLower(tc.want)) {
			t.Errorf("%v: %v: %s, want %q", tc.args, err, out, tc.want)
		}
	}
	if out, err := admin("keys", "list"); err != nil || strings.Contains(out, "\nx ") {
		t.Errorf("a refused create left a key: %v: %s", err, out)
	}
}
