package stack

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/weirhq/weir/controlplane"
	"github.com/weirhq/weir/dataplane"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/internal/sim"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestStackServesARequest starts a stack over a test database, sends one
// request through its worker to the simulator, and stops it: every part
// is gone afterwards, and Stop reports no error.
func TestStackServesARequest(t *testing.T) {
	t.Parallel()
	admin, cred := "admin-"+randid.Hex(8), "sk-ant-api03-stack-"+randid.Hex(8)
	exited := make(chan string, 4)
	st, err := Start(t.Context(), Options{
		Pool: pgtest.NewPool(t), Migrated: true,
		ControlPlane: controlplane.Config{AdminToken: admin, DataplaneToken: "dp-" + randid.Hex(8),
			SecretKey: randid.Bytes(32), DisableJobs: true},
		Sim:    &sim.Config{Script: sim.Script{Accounts: []sim.AccountScript{{Name: "a", Kind: sim.KindAPIKey, Credential: cred}}}},
		Exited: func(part string, _ error) { exited <- part },
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	opt := connect.WithInterceptors(rpcclient.Token(admin))
	hc := rpcclient.HTTPClient()
	if _, err := weirv1connect.NewAccountServiceClient(hc, st.ControlPlaneURL, opt).CreateAccount(t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY,
		Label: "a", Credential: cred, BaseUrl: st.SimURL, MaxConcurrency: 2,
	})); err != nil {
		t.Fatalf("create account: %v", err)
	}
	key, err := weirv1connect.NewKeyServiceClient(hc, st.ControlPlaneURL, opt).CreateKey(t.Context(), connect.NewRequest(&weirv1.CreateKeyRequest{Name: "k"}))
	if err != nil {
		t.Fatalf("create key: %v", err)
	}
	w, err := st.StartWorker(dataplane.Config{}, nil)
	if err != nil {
		t.Fatalf("StartWorker: %v", err)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, w.URL+"/v1/messages",
		strings.NewReader(`{"model":"claude-sonnet-4-5-20250929","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("X-Api-Key", key.Msg.Secret)
	req.Header.Set("Anthropic-Version", "2023-06-01")
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", res.StatusCode, body)
	}
	http.DefaultClient.CloseIdleConnections()

	if err := st.Stop(context.Background()); err != nil {
		t.Errorf("Stop: %v", err)
	}
	for _, u := range []string{w.URL, st.SimURL, st.ControlPlaneURL} {
		if c, err := net.DialTimeout("tcp", strings.TrimPrefix(u, "http://"), time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after Stop", u)
		}
	}
	select {
	case p := <-exited:
		t.Errorf("Exited heard of %s, which Stop ended", p)
	default:
	}
	if err := st.Stop(context.Background()); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// TestStackReportsAnEarlyExit: a part that stops on its own (here the
// worker, its listener closed under it) is reported to Options.Exited,
// so the caller can end the rest.
func TestStackReportsAnEarlyExit(t *testing.T) {
	t.Parallel()
	exited := make(chan string, 4)
	st, err := Start(t.Context(), Options{
		Pool: pgtest.NewPool(t), Migrated: true,
		ControlPlane: controlplane.Config{AdminToken: "admin-" + randid.Hex(8), DataplaneToken: "dp-" + randid.Hex(8),
			SecretKey: randid.Bytes(32), DisableJobs: true},
		Exited: func(part string, _ error) { exited <- part },
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer st.Stop(context.Background()) //nolint:errcheck // the worker's serve error is expected
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.StartWorker(dataplane.Config{}, ln); err != nil {
		t.Fatalf("StartWorker: %v", err)
	}
	ln.Close()
	select {
	case p := <-exited:
		if p != "data plane" {
			t.Errorf("Exited heard of %q, want the data plane", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the worker's exit was not reported")
	}
}

// TestStackRestartsTheControlPlane: a control plane stopped alone comes
// back on the address the workers know.
func TestStackRestartsTheControlPlane(t *testing.T) {
	t.Parallel()
	st, err := Start(t.Context(), Options{
		Pool: pgtest.NewPool(t), Migrated: true,
		ControlPlane: controlplane.Config{AdminToken: "admin-" + randid.Hex(8), DataplaneToken: "dp-" + randid.Hex(8),
			SecretKey: randid.Bytes(32), DisableJobs: true},
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	defer st.Stop(context.Background()) //nolint:errcheck // checked in TestStackServesARequest
	url := st.ControlPlaneURL
	if err := st.StopControlPlane(); err != nil {
		t.Fatalf("StopControlPlane: %v", err)
	}
	if c, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "http://"), time.Second); err == nil {
		c.Close()
		t.Fatal("the stopped control plane still accepts connections")
	}
	if err := st.StartControlPlane(t.Context()); err != nil {
		t.Fatalf("StartControlPlane: %v", err)
	}
	if st.ControlPlaneURL != url {
		t.Errorf("restarted at %s, want %s", st.ControlPlaneURL, url)
	}
	res, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatalf("readyz: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("readyz: %d", res.StatusCode)
	}
	if err := st.StartControlPlane(t.Context()); err == nil {
		t.Error("a second StartControlPlane while one runs succeeded")
	}
}
