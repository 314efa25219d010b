package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/weirhq/weir/bench"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/syncbuf"
)

// TestMain stops the shared test cluster that tests using pgtest start,
// and the shared weir dev (sharedDev).
func TestMain(m *testing.M) {
	bench.ServeChild() // the bench test re-executes this binary as its workers
	if os.Getenv(asWeirEnv) != "" {
		// The apart bench test runs `weir sim`, `weir dev`… from this binary.
		main()
		os.Exit(0)
	}
	code := pgtest.Run(m)
	if err := stopSharedDev(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// asWeirEnv, set, makes this test binary the weir binary: its main.
const asWeirEnv = "WEIR_TEST_AS_WEIR"

// syncBuffer is a command's output, written while a test reads it.
type syncBuffer = syncbuf.Buffer

// testEnv isolates a command from the developer's own WEIR_* settings,
// and from the user's own place for `weir dev`'s pointer (devPointerPath):
// each env has a runtime directory of its own unless vars names one.
func testEnv(vars map[string]string, stdin string) (env, *syncBuffer, *syncBuffer) {
	out, errOut := &syncBuffer{}, &syncBuffer{}
	if vars["XDG_RUNTIME_DIR"] == "" {
		dir, err := os.MkdirTemp("", "weir-test-runtime-")
		if err != nil {
			panic(err)
		}
		if vars == nil {
			vars = map[string]string{}
		}
		// In place: a test may change vars after, for the env to see.
		vars["XDG_RUNTIME_DIR"] = dir
	}
	return env{
		getenv: func(k string) string { return vars[k] },
		stdin:  strings.NewReader(stdin),
		stdout: out,
		stderr: errOut,
	}, out, errOut
}

func postMessage(t *testing.T, url, key, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/messages", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-api-key", key)
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

const hello = `{"model":"claude-sonnet-4-5","max_tokens":32,"messages":[{"role":"user","content":"hi"}]}`

// TestDevEndToEnd is the README's first command as a user runs it: weir dev
// with the simulator, an agent request, the operator commands, a clean stop,
// and a restart that keeps its state.
func TestDevEndToEnd(t *testing.T) {
	t.Parallel()
	// Its own stack: it counts the demo accounts, stops the stack and
	// starts it again on the same data directory.
	dataDir := t.TempDir()
	dev := startDev(t, dataDir)

	if dev.ClientKey == "" || dev.AdminToken == "" || dev.DataplaneToken == "" {
		t.Fatalf("dev.json incomplete: %+v", dev.devInfo)
	}
	st, err := os.Stat(filepath.Join(dataDir, "secret.key"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("secret.key: %v, mode %v; want 0600", err, st.Mode())
	}
	if st, err := os.Stat(filepath.Join(dataDir, "dev.json")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("dev.json must be 0600: %v", err)
	}

	resp, body := postMessage(t, dev.DataplaneURL, dev.ClientKey, hello)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"type":"message"`) {
		t.Fatalf("agent request: %d %s", resp.StatusCode, body)
	}

	admin := dev.adminIn

	out, err := admin("", "accounts", "list", "--json")
	if err != nil {
		t.Fatalf("accounts list: %v: %s", err, out)
	}
	var list struct {
		Accounts []struct {
			Label, CredentialHint, State string
		}
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("accounts list --json: %v: %s", err, out)
	}
	if len(list.Accounts) != len(demoAccounts) {
		t.Fatalf("want %d demo accounts, got %d", len(demoAccounts), len(list.Accounts))
	}
	for _, d := range demoAccounts {
		if strings.Contains(out, d.credential) {
			t.Fatal("accounts list shows a credential")
		}
	}
	for _, a := range list.Accounts {
		if !strings.Contains(a.CredentialHint, "…") || a.State != "ACCOUNT_STATE_ACTIVE" {
			t.Errorf("account %s: hint %q state %s", a.Label, a.CredentialHint, a.State)
		}
	}

	if out, err := admin("", "accounts", "list"); err != nil || !strings.Contains(out, "5H") || !strings.Contains(out, "7D") {
		t.Fatalf("accounts list: want 5H and 7D columns: %v: %s", err, out)
	}
	// An operator's usage read goes through the same budget as the poller:
	// whichever read first, the second within 150 s is refused.
	first, err := admin("", "accounts", "usage", "demo-max-1")
	if err != nil || !strings.Contains(first, "read now") && !strings.Contains(first, "not read") {
		t.Fatalf("accounts usage: %v: %s", err, first)
	}
	if out, err := admin("", "accounts", "usage", "demo-max-1"); err != nil || !strings.Contains(out, "not read: the next read is allowed at") {
		t.Fatalf("accounts usage again: want a refusal: %v: %s", err, out)
	} else if strings.Contains(first, "read now") && !strings.Contains(out, "five_hour") {
		t.Fatalf("accounts usage again: the first read's view is missing: %s", out)
	}
	if out, err := admin("", "accounts", "usage", "demo-api-key"); err == nil || !strings.Contains(err.Error(), "only OAuth") {
		t.Fatalf("accounts usage of an API key: %v: %s", err, out)
	}

	// A credential is never a flag value, and comes in on stdin.
	if out, err := admin("", "accounts", "add", "--label", "x", "sk-ant-api03-secret-on-the-command-line"); err == nil {
		t.Fatalf("accounts add accepted a positional credential: %s", out)
	}
	if out, err := admin("sk-ant-api03-from-stdin-123456\n", "accounts", "add", "--label", "piped", "--secret-stdin", "--base-url", dev.SimulatorURL); err != nil {
		t.Fatalf("accounts add --secret-stdin: %v: %s", err, out)
	} else if strings.Contains(out, "from-stdin") {
		t.Fatal("accounts add echoed the credential")
	}
	if out, err := admin("", "accounts", "pause", "piped"); err != nil || !strings.Contains(out, "paused") {
		t.Fatalf("accounts pause: %v: %s", err, out)
	}
	if out, err := admin("", "accounts", "rm", "piped"); err != nil {
		t.Fatalf("accounts rm: %v: %s", err, out)
	}
	if out, err := admin("", "accounts", "get", "piped"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("accounts get after rm: %v: %s", err, out)
	}

	// A second key works until revoked, and never after.
	out, err = admin("", "keys", "create", "second", "--json")
	if err != nil {
		t.Fatalf("keys create: %v: %s", err, out)
	}
	var created struct{ Secret string }
	if err := json.Unmarshal([]byte(out), &created); err != nil || !strings.HasPrefix(created.Secret, "weir_sk_") {
		t.Fatalf("keys create --json: %v: %s", err, out)
	}
	if resp, body := postMessage(t, dev.DataplaneURL, created.Secret, hello); resp.StatusCode != http.StatusOK {
		t.Fatalf("second key: %d %s", resp.StatusCode, body)
	}
	if out, err := admin("", "keys", "revoke", "second"); err != nil {
		t.Fatalf("keys revoke: %v: %s", err, out)
	}
	if resp, body := postMessage(t, dev.DataplaneURL, created.Secret, hello); resp.StatusCode != http.StatusUnauthorized ||
		!strings.Contains(string(body), "authentication_error") {
		t.Fatalf("revoked key: %d %s", resp.StatusCode, body)
	}
	if resp, _ := postMessage(t, dev.DataplaneURL, dev.ClientKey, hello); resp.StatusCode != http.StatusOK {
		t.Fatalf("first key after revoking the second: %d", resp.StatusCode)
	}
	if out, err := admin("", "routes", "--limit", "5"); err != nil || !strings.Contains(out, "claude-sonnet-4-5") {
		t.Fatalf("routes: %v: %s", err, out)
	}

	if err := dev.stop(); err != nil {
		t.Fatalf("weir dev did not stop cleanly: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "postgres", "pgdata", "postmaster.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("postgres still running after weir dev stopped (postmaster.pid: %v)", err)
	}

	// A restart keeps accounts, tokens and the client key.
	dev2 := startDev(t, dataDir)
	if dev2.ClientKey != dev.ClientKey || dev2.AdminToken != dev.AdminToken {
		t.Fatal("restart did not keep the client key and admin token")
	}
	if resp, body := postMessage(t, dev2.DataplaneURL, dev2.ClientKey, hello); resp.StatusCode != http.StatusOK {
		t.Fatalf("after restart: %d %s", resp.StatusCode, body)
	}
	out, err = admin("", "accounts", "list", "--json")
	if err != nil || strings.Count(out, `"label"`) != len(demoAccounts) {
		t.Fatalf("after restart: want %d accounts: %v: %s", len(demoAccounts), err, out)
	}
}

func TestCommandErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		vars map[string]string
		want string
	}{
		{"unknown command", []string{"frobnicate"}, nil, "unknown command"},
		{"controlplane without database", []string{"controlplane"}, nil, "WEIR_DATABASE_URL is required"},
		{"controlplane without secret key", []string{"controlplane"}, map[string]string{"WEIR_DATABASE_URL": "postgres://x@127.0.0.1:1/x"}, "WEIR_SECRET_KEY is required"},
		{"dataplane without control plane", []string{"dataplane", "--data-dir", "/nonexistent"}, nil, "ControlPlaneURL"},
		{"operator command without control plane", []string{"accounts", "list", "--data-dir", "/nonexistent"}, nil, "no control plane"},
		{"keys without subcommand", []string{"keys"}, nil, "weir keys create"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, out, errOut := testEnv(tc.vars, "")
			err := run(t.Context(), tc.args, e)
			if err == nil {
				t.Fatal("want an error")
			}
			if got := err.Error() + out.String() + errOut.String(); !strings.Contains(got, tc.want) {
				t.Fatalf("error %q does not say %q", got, tc.want)
			}
		})
	}
}

// TestErrorPrefixOnce: every command's error reads "weir COMMAND: …" once,
// whether the command names itself in its error or not.
func TestErrorPrefixOnce(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"settings", "set", "--data-dir", "/nonexistent", "capacity_hold=1s"},
		{"accounts", "list", "--data-dir", "/nonexistent"},
		{"status", "extra"},
		{"keys", "revoke", "--data-dir", "/nonexistent"},
		{"controlplane"},
		{"explain", "--data-dir", "/nonexistent", "weir_1"},
	} {
		e, _, _ := testEnv(nil, "")
		err := run(t.Context(), args, e)
		if err == nil {
			t.Fatalf("%v: want an error", args)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "weir "+args[0]) || strings.Count(msg, "weir "+args[0]+":")+strings.Count(msg, "weir "+args[0]+" ") > 1 ||
			strings.Contains(msg, ": weir ") || strings.HasPrefix(msg, "weir:") {
			t.Errorf("%v: %q; want one %q prefix", args, msg, "weir "+args[0])
		}
	}
}

// TestFindDevThroughPointer: a 'weir dev' started with its own data dir is
// found without --data-dir, through the pointer it leaves.
func TestFindDevThroughPointer(t *testing.T) {
	t.Parallel()
	run, dataDir := t.TempDir(), t.TempDir()
	e, _, _ := testEnv(map[string]string{"XDG_RUNTIME_DIR": run}, "")
	if err := writeDevInfo(dataDir, devInfo{ControlplaneURL: "http://127.0.0.1:7001", AdminToken: "admin-x"}); err != nil {
		t.Fatal(err)
	}
	if _, err := findDev(e, filepath.Join(run, "elsewhere")); err == nil {
		t.Fatal("found a dev without a pointer")
	}
	if err := writeDevPointer(e, devPointer{ControlplaneURL: "http://127.0.0.1:7001", DataDir: dataDir}); err != nil {
		t.Fatal(err)
	}
	d, err := findDev(e, filepath.Join(run, "elsewhere"))
	if err != nil || d.ControlplaneURL != "http://127.0.0.1:7001" || d.AdminToken != "admin-x" {
		t.Fatalf("findDev = %+v, %v", d, err)
	}
	b, _ := os.ReadFile(devPointerPath(e))
	if strings.Contains(string(b), "admin-x") {
		t.Errorf("the pointer holds the admin token: %s", b)
	}
}
