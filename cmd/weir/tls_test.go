package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/weirhq/weir/controlplane"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/certs"
	"github.com/weirhq/weir/internal/certs/certtest"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/internal/sim"
)

// startService runs a weir command in-process until the test ends and
// waits until `weir health healthURL` passes. It returns the command's
// stderr (its log).
func startService(t *testing.T, ctx context.Context, name string, vars map[string]string, healthURL string, args ...string) *syncBuffer {
	t.Helper()
	e, _, errOut := testEnv(vars, "")
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, e) }()
	t.Cleanup(func() {
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Errorf("%s did not stop", name)
		}
	})
	deadline := time.After(60 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		he, _, _ := testEnv(nil, "")
		if run(ctx, []string{"health", healthURL}, he) == nil {
			return errOut
		}
		select {
		case err := <-done:
			t.Fatalf("%s exited: %v\n%s", name, err, errOut.String())
		case <-deadline:
			t.Fatalf("%s not healthy at %s after 60s\n%s", name, healthURL, errOut.String())
		case <-tick.C:
		}
	}
}

// protoRecorder remembers the HTTP version of the last response.
type protoRecorder struct {
	next  http.RoundTripper
	major atomic.Int32
}

func (p *protoRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := p.next.RoundTrip(r)
	if err == nil {
		p.major.Store(int32(resp.ProtoMajor))
	}
	return resp, err
}

// TestTLSEndToEnd runs `weir controlplane` over TLS requiring client
// certificates for LeaseService, and `weir dataplane` serving agents over
// TLS and reaching the control plane with its client certificate (mTLS),
// certificates from throwaway CAs made here. An operator command reaches
// the control plane with no client certificate; an agent's request over
// HTTPS (HTTP/2) is served end to end by the simulator (plain HTTP). A
// LeaseService caller with no client certificate, or one from another
// CA, is refused; with the data planes' certificate its calls, and the
// WatchPool stream over HTTP/2, work. No key appears in any output.
func TestTLSEndToEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	serverCA, clientCA, otherCA := certtest.NewCA(t, "servers"), certtest.NewCA(t, "data planes"), certtest.NewCA(t, "elsewhere")
	cpCert, cpKey := serverCA.Server(t, "controlplane").Write(t, dir, "controlplane")
	dpCert, dpKey := serverCA.Server(t, "dataplane").Write(t, dir, "dataplane")
	worker := clientCA.Client(t, "worker")
	workerCert, workerKey := worker.Write(t, dir, "worker")
	rogueCert, rogueKey := otherCA.Client(t, "rogue").Write(t, dir, "rogue")
	serverCAFile, clientCAFile := serverCA.Write(t, dir, "servers-ca"), clientCA.Write(t, dir, "clients-ca")

	upstream := httptest.NewServer(sim.New(sim.Config{Script: sim.Script{AcceptUnknown: true}}))
	t.Cleanup(upstream.Close)

	secrets := map[string]string{
		"WEIR_ADMIN_TOKEN":     "tls-admin-" + randid.Hex(12),
		"WEIR_DATAPLANE_TOKEN": "tls-dp-" + randid.Hex(12),
		"WEIR_SECRET_KEY":      randid.Hex(32),
	}
	cpAddr, dpAddr := "127.0.0.1:"+freePort(t), "127.0.0.1:"+freePort(t)
	cpURL, dpURL := "https://"+cpAddr, "https://"+dpAddr
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)

	cpLog := startService(t, ctx, "control plane", map[string]string{
		"WEIR_DATABASE_URL":           pgtest.NewURL(t),
		"WEIR_ADMIN_TOKEN":            secrets["WEIR_ADMIN_TOKEN"],
		"WEIR_DATAPLANE_TOKEN":        secrets["WEIR_DATAPLANE_TOKEN"],
		"WEIR_SECRET_KEY":             secrets["WEIR_SECRET_KEY"],
		"WEIR_CONTROLPLANE_TLS_CERT":  cpCert,
		"WEIR_CONTROLPLANE_TLS_KEY":   cpKey,
		"WEIR_CONTROLPLANE_CLIENT_CA": clientCAFile,
		"WEIR_LOG_LEVEL":              "debug",
	}, cpURL+"/readyz", "controlplane", "--listen", cpAddr)
	dpLog := startService(t, ctx, "data plane", map[string]string{
		"WEIR_CONTROLPLANE_URL":      cpURL,
		"WEIR_DATAPLANE_TOKEN":       secrets["WEIR_DATAPLANE_TOKEN"],
		"WEIR_CONTROLPLANE_CA":       serverCAFile,
		"WEIR_DATAPLANE_CLIENT_CERT": workerCert,
		"WEIR_DATAPLANE_CLIENT_KEY":  workerKey,
		"WEIR_DATAPLANE_TLS_CERT":    dpCert,
		"WEIR_DATAPLANE_TLS_KEY":     dpKey,
		"WEIR_LOG_LEVEL":             "debug",
	}, dpURL+"/healthz", "dataplane", "--listen", dpAddr)

	// An operator, with the CA but no client certificate.
	operator := map[string]string{"WEIR_CONTROLPLANE_URL": cpURL, "WEIR_ADMIN_TOKEN": secrets["WEIR_ADMIN_TOKEN"],
		"WEIR_CONTROLPLANE_CA": serverCAFile, "WEIR_DATA_DIR": dir}
	credential := "sk-ant-api03-tls-" + randid.Hex(8)
	e, _, errOut := testEnv(operator, credential)
	if err := run(ctx, []string{"accounts", "add", "--label", "tls", "--secret-stdin", "--base-url", upstream.URL}, e); err != nil {
		t.Fatalf("accounts add over TLS without a client certificate: %v\n%s", err, errOut.String())
	}
	e, out, errOut := testEnv(operator, "")
	if err := run(ctx, []string{"keys", "create", "tls-agent", "--json"}, e); err != nil {
		t.Fatalf("keys create: %v\n%s", err, errOut.String())
	}
	var created struct{ Secret string }
	json.Unmarshal([]byte(out.String()), &created) //nolint:errcheck // checked below
	if created.Secret == "" {
		t.Fatalf("no key in %s", out.String())
	}
	// Without the CA the operator's command does not trust the server.
	noCA := map[string]string{"WEIR_CONTROLPLANE_URL": cpURL, "WEIR_ADMIN_TOKEN": secrets["WEIR_ADMIN_TOKEN"], "WEIR_DATA_DIR": dir}
	e, _, _ = testEnv(noCA, "")
	if err := run(ctx, []string{"keys", "list"}, e); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("keys list without WEIR_CONTROLPLANE_CA: %v, want a certificate error", err)
	}

	// An agent over HTTPS, HTTP/2, trusting the servers' CA.
	agent := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: serverCA.Pool()}, ForceAttemptHTTP2: true}}
	t.Cleanup(agent.CloseIdleConnections)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, dpURL+"/v1/messages", strings.NewReader(hello))
	req.Header.Set("x-api-key", created.Secret)
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("content-type", "application/json")
	resp, err := agent.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := new(strings.Builder)
	_, _ = io.Copy(body, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(body.String(), "weir upstream simulator") || resp.ProtoMajor != 2 {
		t.Fatalf("agent request: %s %d %s", resp.Proto, resp.StatusCode, body)
	}

	// LeaseService callers, each with the data-plane token.
	lease := func(kp *certs.Keypair) (weirv1connect.LeaseServiceClient, *protoRecorder) {
		hc := rpcclient.TLSHTTPClient(certs.ClientConfig(serverCA.Pool(), kp))
		t.Cleanup(hc.CloseIdleConnections)
		rec := &protoRecorder{next: hc.Transport}
		hc.Transport = rec
		return weirv1connect.NewLeaseServiceClient(hc, cpURL, connect.WithInterceptors(rpcclient.Token(secrets["WEIR_DATAPLANE_TOKEN"]))), rec
	}
	load := func(cert, key string) *certs.Keypair {
		kp, err := certs.Load(cert, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	verify := &weirv1.VerifyKeyRequest{KeyHash: controlplane.HashKey(created.Secret)}

	noCert, _ := lease(nil)
	_, err = noCert.VerifyKey(ctx, connect.NewRequest(verify))
	if connect.CodeOf(err) != connect.CodeUnauthenticated || !strings.Contains(err.Error(), "client certificate") {
		t.Errorf("LeaseService without a client certificate: %v, want unauthenticated", err)
	}
	rogue, _ := lease(load(rogueCert, rogueKey))
	if _, err := rogue.VerifyKey(ctx, connect.NewRequest(verify)); err == nil {
		t.Error("LeaseService took a client certificate from another CA")
	}
	good, rec := lease(load(workerCert, workerKey))
	if _, err := good.VerifyKey(ctx, connect.NewRequest(verify)); err != nil {
		t.Fatalf("LeaseService with the data planes' certificate: %v", err)
	}
	if rec.major.Load() != 2 {
		t.Errorf("LeaseService over HTTP/%d, want 2", rec.major.Load())
	}
	sctx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	stream, err := good.WatchPool(sctx, connect.NewRequest(&weirv1.WatchPoolRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || !stream.Msg().Ready {
		t.Fatalf("WatchPool over TLS: %v", stream.Err())
	}
	stop()
	stream.Close() //nolint:errcheck // ended above

	// An admin RPC without a client certificate still works.
	hc := rpcclient.TLSHTTPClient(certs.ClientConfig(serverCA.Pool(), nil))
	t.Cleanup(hc.CloseIdleConnections)
	accounts := weirv1connect.NewAccountServiceClient(hc, cpURL, connect.WithInterceptors(rpcclient.Token(secrets["WEIR_ADMIN_TOKEN"])))
	if _, err := accounts.ListAccounts(ctx, connect.NewRequest(&weirv1.ListAccountsRequest{})); err != nil {
		t.Errorf("admin call without a client certificate: %v", err)
	}

	cancel()
	logs := cpLog.String() + dpLog.String()
	for _, l := range []string{string(worker.KeyPEM[40:80]), secrets["WEIR_SECRET_KEY"], credential, created.Secret} {
		if strings.Contains(logs, l) {
			t.Error("a key, credential or client key appeared in a server log")
		}
	}
}
