package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weirhq/weir/controlplane"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/randid"
)

// TestEgressProxyCommands: the operator sets proxies with weir accounts
// add/set --proxy and weir settings set egress_proxy, and reads them by
// host in weir accounts get and weir settings get; a malformed one is
// refused naming the field. No password is ever printed.
func TestEgressProxyCommands(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), pgtest.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	admin := "admin-" + randid.Hex(12)
	cp, err := controlplane.New(controlplane.Config{AdminToken: admin, DataplaneToken: "dp-" + randid.Hex(12),
		SecretKey: []byte(randid.Hex(16)), DisableJobs: true}, pool)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(cp.Handler())
	ts.Config.Protocols = new(http.Protocols)
	ts.Config.Protocols.SetHTTP1(true)
	ts.Config.Protocols.SetUnencryptedHTTP2(true)
	ts.Start()
	t.Cleanup(ts.Close)

	ownPW, defPW, badPW := "own-"+randid.Hex(8), "def-"+randid.Hex(8), "bad-"+randid.Hex(8)
	weir := func(stdin string, args ...string) (string, error) {
		t.Helper()
		e, out, errOut := testEnv(map[string]string{"WEIR_CONTROLPLANE_URL": ts.URL, "WEIR_ADMIN_TOKEN": admin}, stdin)
		err := run(t.Context(), args, e)
		all := out.String() + errOut.String() + errString(err)
		for _, pw := range []string{ownPW, defPW, badPW} {
			if strings.Contains(all, pw) {
				t.Errorf("weir %s printed a proxy's password", strings.Join(args, " "))
			}
		}
		return out.String() + errOut.String(), err
	}

	key := "sk-ant-api03-" + randid.Hex(20)
	if out, err := weir(key, "accounts", "add", "--label", "own", "--secret-stdin", "--proxy", "socks5://u:"+ownPW+"@10.0.0.7:1080"); err != nil {
		t.Fatalf("add: %v\n%s", err, out)
	}
	out, err := weir("", "accounts", "get", "own")
	if err != nil || !strings.Contains(out, "egress: socks5://10.0.0.7:1080\n") {
		t.Fatalf("get: %v\n%s", err, out)
	}
	out, err = weir("", "settings", "set", "egress_proxy", "http://u:"+defPW+"@proxy.internal:3128")
	if err != nil || !strings.Contains(out, "egress_proxy") || !strings.Contains(out, "http://proxy.internal:3128") {
		t.Fatalf("settings set: %v\n%s", err, out)
	}
	if out, err = weir("", "accounts", "update", "own", "--proxy", ""); err != nil {
		t.Fatalf("update --proxy '': %v\n%s", err, out)
	}
	out, err = weir("", "accounts", "get", "own")
	if err != nil || !strings.Contains(out, "egress: http://proxy.internal:3128 (the default)\n") {
		t.Fatalf("get, following the default: %v\n%s", err, out)
	}
	if out, err = weir("", "accounts", "set", "own", "--proxy", "direct"); err != nil {
		t.Fatalf("set --proxy direct: %v\n%s", err, out)
	}
	out, err = weir("", "accounts", "get", "own")
	if err != nil || !strings.Contains(out, "egress: direct (bypasses the default)\n") {
		t.Fatalf("get, direct: %v\n%s", err, out)
	}
	out, err = weir("", "accounts", "set", "own", "--proxy", "ftp://u:"+badPW+"@host:21")
	if err == nil || !strings.Contains(out+err.Error(), "egress_proxy: the scheme must be http, https, socks5 or socks5h") {
		t.Errorf("a bad proxy: %v\n%s", err, out)
	}
	out, err = weir("", "settings", "history")
	if err != nil || !strings.Contains(out, "http://proxy.internal:3128") {
		t.Errorf("history: %v\n%s", err, out)
	}
	out, err = weir("", "accounts", "get", "own", "--json")
	var got struct {
		EgressProxy string `json:"egressProxy"`
	}
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || got.EgressProxy != "direct" {
		t.Errorf("get --json: %v\n%s", err, out)
	}
}
