package main

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/weirhq/weir/internal/configdoc"
)

var updateReference = flag.Bool("update", false, "rewrite docs/configuration.md, the configuration reference")

// referencePath is the generated configuration reference.
const referencePath = "../../docs/configuration.md"

// reference is the configuration reference's table, in order. A variable
// with no meaning here takes its meaning from the doc comment of the
// Config field that names it ("Env: WEIR_X."): the struct is the source.
var reference = []configdoc.Var{
	{Name: "WEIR_DATA_DIR", UsedBy: "dev, operator commands", Meaning: "data directory (default `~/.local/share/weir`)"},
	{Name: "WEIR_DATABASE_URL", UsedBy: "controlplane, migrate, secrets rotate, dev", Meaning: "Postgres URL; `weir dev` without it runs an embedded cluster"},
	{Name: "WEIR_ADMIN_TOKEN", UsedBy: "controlplane, operator commands"},
	{Name: "WEIR_ACTOR", UsedBy: "operator commands", Meaning: "who the audit log records as making this command's changes (default `user@host`); self-declared, not verified: the admin token is the credential"},
	{Name: "WEIR_DATAPLANE_TOKEN", UsedBy: "controlplane, dataplane"},
	{Name: "WEIR_SECRET_KEY", UsedBy: "controlplane, secrets rotate"},
	{Name: "WEIR_SECRET_KEY_PREVIOUS", UsedBy: "controlplane, dev, secrets rotate"},
	{Name: "WEIR_OAUTH_TOKEN_URL", UsedBy: "controlplane, login"},
	{Name: "WEIR_OAUTH_AUTHORIZE_URL", UsedBy: "login", Meaning: "`weir login claude`'s authorization endpoint (default `https://claude.ai/oauth/authorize`)"},
	{Name: "WEIR_OAUTH_CLIENT_ID", UsedBy: "controlplane"},
	{Name: "WEIR_CODEX_TOKEN_URL", UsedBy: "controlplane, login"},
	{Name: "WEIR_CODEX_AUTHORIZE_URL", UsedBy: "login", Meaning: "`weir login codex`'s authorization endpoint (default `https://auth.openai.com/oauth/authorize`)"},
	{Name: "WEIR_CODEX_CLIENT_ID", UsedBy: "controlplane"},
	{Name: "WEIR_CONTROLPLANE_URL", UsedBy: "dataplane, operator commands"},
	{Name: "WEIR_CONTROLPLANE_LISTEN", UsedBy: "controlplane, dev", Meaning: "control-plane address (default `127.0.0.1:7481`)"},
	{Name: "WEIR_DATAPLANE_LISTEN", UsedBy: "dataplane, dev", Meaning: "data-plane address (default `127.0.0.1:7480`)"},
	{Name: "WEIR_CONTROLPLANE_TLS_CERT", UsedBy: "controlplane", Meaning: "PEM certificate (chain) the control plane serves TLS with, with `WEIR_CONTROLPLANE_TLS_KEY`; re-read when the files change (looked at every 5 s at most). Default: cleartext (h2c)"},
	{Name: "WEIR_CONTROLPLANE_TLS_KEY", UsedBy: "controlplane", Meaning: "PEM private key of `WEIR_CONTROLPLANE_TLS_CERT`"},
	{Name: "WEIR_CONTROLPLANE_CLIENT_CA", UsedBy: "controlplane", Meaning: "PEM CA file: LeaseService (the data planes' RPCs) then requires a client certificate it signed (mTLS, on top of the data-plane token); operator calls may come without one. Needs the control plane's TLS"},
	{Name: "WEIR_CONTROLPLANE_CA", UsedBy: "dataplane, operator commands", Meaning: "PEM CA file trusted for an `https` `WEIR_CONTROLPLANE_URL` (default: the system roots)"},
	{Name: "WEIR_DATAPLANE_CLIENT_CERT", UsedBy: "dataplane", Meaning: "PEM client certificate a data plane presents to an `https` control plane (mTLS), with `WEIR_DATAPLANE_CLIENT_KEY`; re-read when the files change"},
	{Name: "WEIR_DATAPLANE_CLIENT_KEY", UsedBy: "dataplane", Meaning: "PEM private key of `WEIR_DATAPLANE_CLIENT_CERT`"},
	{Name: "WEIR_DATAPLANE_TLS_CERT", UsedBy: "dataplane", Meaning: "PEM certificate (chain) the data plane serves agents TLS with, with `WEIR_DATAPLANE_TLS_KEY`; re-read when the files change. Default: cleartext"},
	{Name: "WEIR_DATAPLANE_TLS_KEY", UsedBy: "dataplane", Meaning: "PEM private key of `WEIR_DATAPLANE_TLS_CERT`"},
	{Name: "WEIR_CPU_PROFILE", UsedBy: "all", Meaning: "a file the process writes a Go CPU profile of itself to, from start until it exits (for `go tool pprof`); `%p` in it is the process id, for processes that share the variable; default: none"},
	{Name: "WEIR_GC_HEAP_FLOOR", UsedBy: "all", Meaning: "the heap below which Go's garbage collector does not run, as `64MiB` or bytes; `0`: the runtime's own pacing (GOGC). Above it the runtime's pacing stands. A process may hold about this much memory before its first collection; a data plane at a few hundred requests a second spends most of its collector's CPU without it. Ignored when `GOGC` is set. Default: `64MiB`"},
	{Name: "GODEBUG", UsedBy: "dev, controlplane, dataplane", Meaning: "the Go runtime's settings. Unless it names `schedtrace`, a serving command re-executes itself with `schedtrace=2147483647` added: that keeps the runtime's monitor thread at a steady 10 ms poll instead of polling every 20 µs through each burst of work after an idle spell, which was over a quarter of a busy control plane's CPU (docs/performance.md). The price: about 100 wake-ups a second in an idle process, and a runtime line on stderr (`SCHED …`) at start on a machine up for more than 24.8 days, and every 24.8 days. `GODEBUG=schedtrace=0`: the runtime's default"},
	{Name: "WEIR_LOG_LEVEL", UsedBy: "all", Meaning: "`debug`, `info` (default), `warn`, `error`"},
	{Name: "WEIR_DATAPLANE_METRICS_ADDR", UsedBy: "dataplane", Meaning: "an address of its own for the data plane's `/metrics` (e.g. `127.0.0.1:9480`, or a private interface's); when set, `/metrics` is served there only, never on the agents' port. Default: unset, `/metrics` on the agents' port, open to anyone who reaches it (see docs/deploy.md)"},
	{Name: "WEIR_CONTROLPLANE_METRICS_ADDR", UsedBy: "controlplane", Meaning: "an address of its own for the control plane's `/metrics`, whose series name accounts by label; when set, `/metrics` is served there only. Default: unset, `/metrics` on the RPC port, open"},
	{Name: "WEIR_METRICS_TOKEN", UsedBy: "controlplane, dataplane", Meaning: "when set, `/metrics` (wherever it is served) answers only a scrape with `Authorization: Bearer` and this token, else 401. `weir dev` reads neither this nor the metrics addresses"},
	{Name: "WEIR_OIDC_ISSUER", UsedBy: "controlplane"},
	{Name: "WEIR_OIDC_NAME", UsedBy: "controlplane"},
	{Name: "WEIR_OIDC_CLIENT_ID", UsedBy: "controlplane"},
	{Name: "WEIR_OIDC_CLIENT_SECRET", UsedBy: "controlplane"},
	{Name: "WEIR_OIDC_REDIRECT_URL", UsedBy: "controlplane"},
	{Name: "WEIR_OIDC_ROLES", UsedBy: "controlplane"},
	{Name: "WEIR_TRUSTED_PROXIES", UsedBy: "controlplane"},
	{Name: "WEIR_CAPACITY_HOLD", UsedBy: "controlplane, dev"},
	{Name: "WEIR_UNREACHABLE_HOLD", UsedBy: "controlplane, dev"},
	{Name: "WEIR_REQUEST_DEADLINE", UsedBy: "controlplane, dev"},
	{Name: "WEIR_BODY_BUFFER", UsedBy: "controlplane, dev"},
	{Name: "WEIR_BODY_BUFFER_PER_KEY", UsedBy: "controlplane, dev"},
	{Name: "WEIR_LEASE_REUSE", UsedBy: "controlplane, dev"},
	{Name: "WEIR_METRICS_ACCOUNT_LABELS_MAX", UsedBy: "controlplane, dev"},
}

// TestConfigurationReference keeps docs/configuration.md equal to what the
// code reads: every WEIR_* variable the binary reads is in the table,
// every Config field's variable takes its text from the field's doc
// comment, the file is exactly what configdoc.Document renders of that,
// and the README links it. Run with -update (go generate . does) to
// rewrite the file.
func TestConfigurationReference(t *testing.T) {
	structVars, err := configdoc.FromStructs("../../controlplane/config.go", "../../dataplane/config.go")
	if err != nil {
		t.Fatal(err)
	}
	fromStruct := map[string]string{}
	for _, v := range structVars {
		fromStruct[v.Name] = v.Meaning
	}
	var vars []configdoc.Var
	listed := map[string]bool{}
	for _, v := range reference {
		listed[v.Name] = true
		m, ok := fromStruct[v.Name]
		switch {
		case ok && v.Meaning != "":
			t.Errorf("%s: documented both here and on its Config field; keep the field's comment", v.Name)
		case ok:
			v.Meaning = m
		case v.Meaning == "":
			t.Errorf("%s: no meaning here and no Config field names it", v.Name)
		}
		vars = append(vars, v)
	}
	for name := range fromStruct {
		if !listed[name] {
			t.Errorf("%s: a Config field names it but the reference does not list it", name)
		}
	}
	sources, _ := filepath.Glob("*.go")
	sources = slices.DeleteFunc(sources, func(f string) bool { return filepath.Ext(f) != ".go" || len(f) > 8 && f[len(f)-8:] == "_test.go" })
	read, err := configdoc.Literals(sources...)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range read {
		if !listed[name] {
			t.Errorf("the binary reads %s but the reference does not list it", name)
		}
	}

	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "](docs/configuration.md") {
		t.Error("README.md does not link docs/configuration.md")
	}

	want := configdoc.Document(vars)
	if *updateReference {
		if err := os.WriteFile(referencePath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(referencePath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Error("docs/configuration.md is stale: run go generate . (or go test ./cmd/weir -run TestConfigurationReference -update)")
	}
}

// TestGCFloorSetting: WEIR_GC_HEAP_FLOOR's spellings, its default, a bad
// value refused, and GOGC taking precedence.
func TestGCFloorSetting(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want uint64
		bad  bool
	}{
		{env: nil, want: defaultGCFloor},
		{env: map[string]string{"WEIR_GC_HEAP_FLOOR": "128MiB"}, want: 128 << 20},
		{env: map[string]string{"WEIR_GC_HEAP_FLOOR": "0"}, want: 0},
		{env: map[string]string{"WEIR_GC_HEAP_FLOOR": "1000000"}, want: 1000000},
		{env: map[string]string{"WEIR_GC_HEAP_FLOOR": "lots"}, bad: true},
		{env: map[string]string{"WEIR_GC_HEAP_FLOOR": "-5"}, bad: true},
		{env: map[string]string{"GOGC": "200", "WEIR_GC_HEAP_FLOOR": "128MiB"}, want: 0},
	} {
		got, err := gcFloor(func(k string) string { return tc.env[k] })
		if tc.bad != (err != nil) || got != tc.want {
			t.Errorf("%v: %d, %v; want %d (error: %v)", tc.env, got, err, tc.want, tc.bad)
		}
	}
}
