package main

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestAuditCommand: changes made with the CLI are in `weir audit` with the
// declared actor ($WEIR_ACTOR, else user@host), filtered by actor and
// call, as a table or JSON; `weir dev`'s own setup is there as "weir dev";
// reads are not.
func TestAuditCommand(t *testing.T) {
	t.Parallel()
	// Its own stack: it reads the whole audit log, newest row first.
	dev := startDev(t, t.TempDir())
	cli := func(vars map[string]string, args ...string) string {
		t.Helper()
		out, errOut, err := dev.command(vars, "", args...)
		if err != nil {
			t.Fatalf("weir %s: %v: %s%s", strings.Join(args, " "), err, out, errOut)
		}
		return out
	}
	alice := map[string]string{"WEIR_ACTOR": "alice@ops"}
	created := cli(alice, "keys", "create", "audited-key")
	cli(alice, "keys", "list")
	cli(map[string]string{}, "aliases", "set", "quick", "claude-haiku-4-5")

	out := cli(alice, "audit")
	if !regexp.MustCompile(`(?m)^WHEN\s+AT\s+ACTOR\s+CALL\s+TARGET\s+OUTCOME\s+PEER\s+REQUEST$`).MatchString(out) {
		t.Fatalf("audit: no header:\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")[1:]
	if !regexp.MustCompile(`^\S+ ago\s+\S+\s+\S+@\S+\s+SetAlias\s+quick\s+ok\s+127\.0\.0\.1:\d+\s+\{"fields"`).MatchString(lines[0]) {
		t.Errorf("newest row (no WEIR_ACTOR: user@host):\n%s", lines[0])
	}
	host, _ := os.Hostname()
	if !strings.Contains(lines[0], "@"+host) {
		t.Errorf("newest row does not name this host %q:\n%s", host, lines[0])
	}
	if !regexp.MustCompile(`^\S+ ago\s+\S+\s+alice@ops\s+CreateKey\s+\S+ \(audited-key\)\s+ok\s`).MatchString(lines[1]) {
		t.Errorf("CreateKey row:\n%s", lines[1])
	}
	if !strings.Contains(out, "weir dev") || strings.Contains(out, "ListKeys") {
		t.Errorf("audit: want weir dev's setup and no reads:\n%s", out)
	}
	secret := regexp.MustCompile(`weir_sk_\S+`).FindString(created)
	if secret == "" {
		t.Fatalf("keys create printed no secret:\n%s", created)
	}
	if strings.Contains(out, secret) {
		t.Error("weir audit prints the key's secret")
	}

	var got struct {
		Events []struct{ Actor, Procedure, Credential string }
	}
	if err := json.Unmarshal([]byte(cli(alice, "audit", "--actor", "alice@ops", "--json")), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Events) != 1 || got.Events[0].Procedure != "/weir.v1.KeyService/CreateKey" || got.Events[0].Credential != "admin_token" {
		t.Errorf("audit --actor alice@ops --json: %+v", got.Events)
	}
	out = cli(alice, "audit", "--procedure", "SetAlias", "--since", "1h")
	if n := len(strings.Split(strings.TrimSpace(out), "\n")); n != 2 {
		t.Errorf("audit --procedure SetAlias: %d lines, want the header and one row:\n%s", n, out)
	}
	out = cli(alice, "audit", "--target", "quick, audited-key")
	if n := len(strings.Split(strings.TrimSpace(out), "\n")); n != 3 || !strings.Contains(out, "SetAlias") || !strings.Contains(out, "CreateKey") {
		t.Errorf("audit --target quick,audited-key: want the header and the two calls that named them:\n%s", out)
	}
	out = cli(alice, "audit", "--limit", "1")
	tok := regexp.MustCompile(`older: the same command with --page (\S+)`).FindStringSubmatch(out)
	if tok == nil {
		t.Fatalf("audit --limit 1: no next page:\n%s", out)
	}
	if next := cli(alice, "audit", "--limit", "1", "--page", tok[1]); !strings.Contains(next, "CreateKey") {
		t.Errorf("audit --limit 1 --page: want the row before the newest:\n%s", next)
	}
}
