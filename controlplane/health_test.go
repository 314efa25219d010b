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
