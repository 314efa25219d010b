package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weirhq/weir/controlplane"
	"github.com/weirhq/weir/controlplane/seal"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/rpcclient"
)

// sealedUnder creates accounts through a control plane holding key (hex),
// over the database at dbURL, and returns their ids and credentials.
func sealedUnder(t *testing.T, dbURL, key string, labels ...string) (ids, creds []string) {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	k, _ := seal.ParseSecretKey(key)
	admin := "admin-" + randid.Hex(12)
	cp, err := controlplane.New(controlplane.Config{AdminToken: admin, DataplaneToken: "dp-" + randid.Hex(12), SecretKey: k, DisableJobs: true}, pool)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(cp.Handler())
	ts.Config.Protocols = new(http.Protocols)
	ts.Config.Protocols.SetHTTP1(true)
	ts.Config.Protocols.SetUnencryptedHTTP2(true)
	ts.Start()
	defer ts.Close()
	hc := rpcclient.HTTPClient()
	defer hc.CloseIdleConnections()
	accounts := weirv1connect.NewAccountServiceClient(hc, ts.URL, connect.WithInterceptors(rpcclient.Token(admin)))
	for _, label := range labels {
		cred := "sk-ant-api03-" + randid.Hex(20)
		resp, err := accounts.CreateAccount(t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
			Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY, Label: label, Credential: cred,
		}))
		if err != nil {
			t.Fatalf("create %s: %v", label, err)
		}
		ids, creds = append(ids, resp.Msg.Account.Id), append(creds, cred)
	}
	return ids, creds
}

// TestSecretsRotateCommand: the rotation as an operator runs it, key A to
// key B: a dry run counts, the rotation re-seals and says how many, a
// second run says there is nothing to do, and a credential that opens
// with no key makes it exit non-zero naming the accounts (id and label)
// with nothing re-sealed. No key or credential is ever printed.
func TestSecretsRotateCommand(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	keyA, keyB := randid.Hex(32), randid.Hex(32)
	ids, creds := sealedUnder(t, dbURL, keyA, "one", "two")
	rawB, _ := seal.ParseSecretKey(keyB)
	idB := seal.KeyID(rawB)

	rotate := func(vars map[string]string, args ...string) (string, string, error) {
		t.Helper()
		if _, ok := vars["WEIR_DATABASE_URL"]; !ok {
			vars["WEIR_DATABASE_URL"] = dbURL
		}
		e, out, errOut := testEnv(vars, "")
		err := run(t.Context(), append([]string{"secrets", "rotate"}, args...), e)
		for _, s := range append([]string{keyA, keyB, dbURL}, creds...) {
			if strings.Contains(out.String()+errOut.String()+errString(err), s) {
				t.Errorf("a key, credential or the database URL was printed")
			}
		}
		return out.String(), errOut.String(), err
	}
	ab := map[string]string{"WEIR_SECRET_KEY": keyB, "WEIR_SECRET_KEY_PREVIOUS": keyA}
	with := func(m map[string]string) map[string]string {
		c := map[string]string{}
		for k, v := range m {
			c[k] = v
		}
		return c
	}

	out, errOut, err := rotate(with(ab), "--dry-run")
	if err != nil || out != "dry run: 2 of 2 account(s) would be re-sealed under key "+idB+"\n" {
		t.Fatalf("dry run: %v\n%s%s", err, out, errOut)
	}
	out, errOut, err = rotate(with(ab))
	if err != nil || !strings.HasPrefix(out, "re-sealed 2 of 2 account(s) under key "+idB+" (0 already were)\n") {
		t.Fatalf("rotate: %v\n%s%s", err, out, errOut)
	}
	out, errOut, err = rotate(with(ab))
	if err != nil || !strings.HasPrefix(out, "all 2 account(s) are sealed under the current key "+idB+": nothing to do\n") {
		t.Fatalf("second run: %v\n%s%s", err, out, errOut)
	}
	// Key B alone now opens everything.
	out, errOut, err = rotate(map[string]string{"WEIR_SECRET_KEY": keyB}, "--dry-run")
	if err != nil || !strings.Contains(out, "nothing to do") {
		t.Fatalf("key B alone: %v\n%s%s", err, out, errOut)
	}

	// Only key A known now: B's seals open with no key.
	out, errOut, err = rotate(map[string]string{"WEIR_SECRET_KEY": randid.Hex(32), "WEIR_SECRET_KEY_PREVIOUS": keyA})
	if err == nil || exitCode(err) != 1 || out != "" {
		t.Fatalf("unreadable: %v (exit %d)\n%s", err, exitCode(err), out)
	}
	for _, want := range []string{ids[0], ids[1], "one", "two", "open with none of the keys"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr does not name %q:\n%s", want, errOut)
		}
	}
	if !strings.Contains(err.Error(), "2 account(s) unreadable; nothing was re-sealed") {
		t.Errorf("error %q", err)
	}
	out, _, err = rotate(map[string]string{"WEIR_SECRET_KEY": keyB}, "--dry-run")
	if err != nil || !strings.Contains(out, "nothing to do") {
		t.Fatalf("a failed rotation changed rows: %v %s", err, out)
	}

	for name, tc := range map[string]struct {
		vars map[string]string
		want string
	}{
		"no database":  {map[string]string{"WEIR_DATABASE_URL": "", "WEIR_SECRET_KEY": keyB}, "WEIR_DATABASE_URL is required"},
		"no key":       {map[string]string{}, "WEIR_SECRET_KEY is required"},
		"bad previous": {map[string]string{"WEIR_SECRET_KEY": keyB, "WEIR_SECRET_KEY_PREVIOUS": keyA + ",not-a-key"}, "WEIR_SECRET_KEY_PREVIOUS: key 2: secret key must be 32 bytes"},
		"repeated key": {map[string]string{"WEIR_SECRET_KEY": keyB, "WEIR_SECRET_KEY_PREVIOUS": keyB}, "repeats the current one"},
	} {
		if _, _, err := rotate(tc.vars); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	e, _, errOut2 := testEnv(nil, "")
	if err := run(t.Context(), []string{"secrets"}, e); !errors.Is(err, errUsageShown) || !strings.Contains(errOut2.String(), "weir secrets rotate [--dry-run]") {
		t.Errorf("weir secrets: %v\n%s", err, errOut2.String())
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestPreviousSecretKeysConfig: WEIR_SECRET_KEY_PREVIOUS reaches the
// control plane's Config from `weir controlplane` and `weir dev` alike,
// comma-separated, and a bad entry is refused naming its place, not its
// value.
func TestPreviousSecretKeysConfig(t *testing.T) {
	t.Parallel()
	cur, p1, p2 := randid.Hex(32), randid.Hex(32), randid.Hex(32)
	vars := map[string]string{
		"WEIR_ADMIN_TOKEN": "admin-" + randid.Hex(12), "WEIR_DATAPLANE_TOKEN": "dp-" + randid.Hex(12),
		"WEIR_SECRET_KEY": cur, "WEIR_SECRET_KEY_PREVIOUS": p1 + ", " + p2 + ",",
	}
	e, _, _ := testEnv(vars, "")
	cfg, err := controlPlaneConfig(e, newLogger(e))
	if err != nil || len(cfg.PreviousSecretKeys) != 2 || seal.KeyID(cfg.PreviousSecretKeys[1]) != keyIDOf(p2) {
		t.Fatalf("controlplane: %d previous keys, %v", len(cfg.PreviousSecretKeys), err)
	}
	s, err := devSecrets(e, t.TempDir(), devInfo{})
	if err != nil || len(s.previous) != 2 || seal.KeyID(s.previous[0]) != keyIDOf(p1) {
		t.Fatalf("dev: %d previous keys, %v", len(s.previous), err)
	}
	vars["WEIR_SECRET_KEY_PREVIOUS"] = p1 + "," + p2[:20]
	for name, f := range map[string]func() error{
		"controlplane": func() error { _, err := controlPlaneConfig(e, newLogger(e)); return err },
		"dev":          func() error { _, err := devSecrets(e, t.TempDir(), devInfo{}); return err },
	} {
		err := f()
		if err == nil || !strings.Contains(err.Error(), "WEIR_SECRET_KEY_PREVIOUS: key 2") || strings.Contains(err.Error(), p2[:20]) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func keyIDOf(hexKey string) string {
	k, _ := seal.ParseSecretKey(hexKey)
	return seal.KeyID(k)
}

// TestControlPlaneStartChecksKey: `weir controlplane` and `weir dev` over
// an empty pool start with any key; over credentials sealed under another
// key they exit non-zero before serving, saying the key is not the one
// that sealed them and how to fix it; over a pool where some open and
// others do not, the control plane starts and `weir status` names the
// accounts it cannot open as broken. No key or credential is printed.
func TestControlPlaneStartChecksKey(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewURL(t)
	keyA, keyB, wrong := randid.Hex(32), randid.Hex(32), randid.Hex(32)
	admin := "admin-" + randid.Hex(12)
	vars := func(key string) map[string]string {
		return map[string]string{"WEIR_DATABASE_URL": dbURL, "WEIR_ADMIN_TOKEN": admin,
			"WEIR_DATAPLANE_TOKEN": "dp-" + randid.Hex(12), "WEIR_SECRET_KEY": key}
	}
	serve := func(key string) (context.CancelFunc, string) {
		ctx, cancel := context.WithCancel(t.Context())
		addr := "127.0.0.1:" + freePort(t)
		startService(t, ctx, "control plane", vars(key), "http://"+addr+"/readyz", "controlplane", "--listen", addr)
		return cancel, "http://" + addr
	}

	stop, _ := serve(wrong)
	stop()

	_, creds := sealedUnder(t, dbURL, keyA, "one", "two")
	secrets := append([]string{keyA, keyB, wrong}, creds...)
	for name, args := range map[string][]string{
		"controlplane": {"controlplane", "--listen", "127.0.0.1:0"},
		"dev":          {"dev", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--controlplane-listen", "127.0.0.1:0"},
	} {
		e, out, errOut := testEnv(vars(wrong), "")
		err := run(t.Context(), args, e)
		if err == nil || exitCode(err) != 1 {
			t.Fatalf("%s with the wrong key: %v (exit %d)\n%s", name, err, exitCode(err), errOut.String())
		}
		for _, want := range []string{"refusing to start", "WEIR_SECRET_KEY (key id " + keyIDOf(wrong) + ") is not the key these credentials were sealed with",
			"none of the 2 stored account credential(s)", "add it to WEIR_SECRET_KEY_PREVIOUS and run 'weir secrets rotate'"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %q does not say %q", name, err, want)
			}
		}
		if strings.Contains(errOut.String(), "listening") || strings.Contains(out.String(), "weir dev is running") {
			t.Errorf("%s served before refusing:\n%s%s", name, out, errOut)
		}
		for _, s := range secrets {
			if strings.Contains(out.String()+errOut.String()+err.Error(), s) {
				t.Errorf("%s: a key or credential was printed", name)
			}
		}
	}

	_, lost := sealedUnder(t, dbURL, keyB, "lost")
	stop, url := serve(keyA)
	defer stop()
	e, out, errOut := testEnv(map[string]string{"WEIR_CONTROLPLANE_URL": url, "WEIR_ADMIN_TOKEN": admin}, "")
	if err := run(t.Context(), []string{"status"}, e); err != nil {
		t.Fatalf("weir status: %v\n%s", err, errOut)
	}
	var line string
	for l := range strings.Lines(out.String()) {
		if strings.Contains(l, "lost") {
			line = l
		}
	}
	if !strings.Contains(line, "broken") || !strings.Contains(line, "unreadable_credential") {
		t.Errorf("weir status does not name lost as broken for an unreadable credential:\n%s", out)
	}
	if strings.Contains(out.String(), lost[0]) {
		t.Error("weir status printed a credential")
	}
}
