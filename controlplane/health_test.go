package controlplane

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/pgtest"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// scrape returns the replica's /metrics text.
func scrape(t *testing.T, e *env) string {
	t.Helper()
	code, body := get(t, e.ts.URL+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	return body
}

func TestHealth(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := get(t, e.ts.URL+path); code != http.StatusOK || body != "ok\n" {
			t.Errorf("%s: %d %q", path, code, body)
		}
	}
	// Health needs no token, but it is GET only.
	resp, err := http.Post(e.ts.URL+"/healthz", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /healthz: %d", resp.StatusCode)
	}
}

// TestReadyzDatabaseDown: with the database gone, /readyz says so while
// /healthz (liveness) stays up.
func TestReadyzDatabaseDown(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), pgtest.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	clock := newClock()
	e := newEnv(t, pool, testConfig(clock), clock)
	if code, _ := get(t, e.ts.URL+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz with the database up: %d", code)
	}
	pool.Close()
	if code, body := get(t, e.ts.URL+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "database unavailable") {
		t.Errorf("/readyz with the database down: %d %q", code, body)
	}
	if code, _ := get(t, e.ts.URL+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with the database down: %d", code)
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if strings.Contains(scrape(t, e), "weir_controlplane_acquire_seconds_count") {
		t.Fatal("acquire histogram present before any Acquire")
	}
	_, keyHash := e.createKey("")
	e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED)
	e.createAccount(acct{})
	e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	body := scrape(t, e)
	for _, want := range []string{
		"# TYPE weir_controlplane_acquire_seconds histogram",
		`weir_controlplane_acquire_seconds_count{result="lease"} 1`,
		`weir_controlplane_acquire_seconds_count{result="none_configured"} 1`,
		"go_goroutines",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// Metrics are per replica registry: another replica starts at zero.
	r := e.replica()
	if strings.Contains(scrape(t, r), `weir_controlplane_acquire_seconds_count{result="lease"}`) {
		t.Error("a new replica shares the first one's counters")
	}
}

// TestMetricsDeployable: /metrics (whose series name accounts by label)
// can be kept from the RPC port and put behind a token: with MetricsApart
// the RPC port does not serve it, and with MetricsToken only a scrape
// with the token as a bearer gets it. Neither set: served openly, as
// before.
func TestMetricsDeployable(t *testing.T) {
	t.Parallel()
	clock := newClock()
	cfg := testConfig(clock)
	cfg.MetricsToken, cfg.MetricsApart = "metrics-token-0123456789", true
	e := newEnv(t, pgtest.NewPool(t), cfg, clock)
	if code, _ := get(t, e.ts.URL+"/metrics"); code != http.StatusNotFound {
		t.Errorf("RPC port /metrics with MetricsApart: %d, want 404", code)
	}
	apart := startH2C(t, e.srv.MetricsHandler())
	if code, body := get(t, apart.URL+"/metrics"); code != http.StatusUnauthorized || strings.Contains(body, "weir_controlplane_") {
		t.Errorf("/metrics without the token: %d %.80s", code, body)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, apart.URL+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+cfg.MetricsToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(b), "weir_controlplane_") {
		t.Errorf("/metrics with the token: %d %.80s", res.StatusCode, b)
	}
	// The default: open on the RPC port.
	if code, body := get(t, setup(t).ts.URL+"/metrics"); code != http.StatusOK || !strings.Contains(body, "weir_controlplane_") {
		t.Errorf("default /metrics: %d", code)
	}
}
