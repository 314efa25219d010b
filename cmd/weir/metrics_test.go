package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// freeAddr is a loopback address nothing listens on (for a moment).
func freeAddr(t *testing.T) string { return "127.0.0.1:" + freePort(t) }

// TestDataPlaneMetricsApart: `weir dataplane` with
// WEIR_DATAPLANE_METRICS_ADDR serves /metrics there only, and with
// WEIR_METRICS_TOKEN only to a bearer with the token; the agents' port
// answers /metrics as a path weir does not serve.
func TestDataPlaneMetricsApart(t *testing.T) {
	t.Parallel()
	agents, metrics := freeAddr(t), freeAddr(t)
	const token = "metrics-token-0123456789"
	e, _, _ := testEnv(map[string]string{
		"WEIR_CONTROLPLANE_URL": "http://" + freeAddr(t), "WEIR_DATAPLANE_TOKEN": strings.Repeat("d", 16),
		"WEIR_DATAPLANE_LISTEN": agents, "WEIR_DATAPLANE_METRICS_ADDR": metrics, "WEIR_METRICS_TOKEN": token,
	}, "")
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"dataplane"}, e) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("weir dataplane: %v", err)
		}
	}()
	get := func(url, auth string) (int, string) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	// The server starts in its goroutine: ask until it answers.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for tries := 0; ; tries++ {
		if code, _ := get("http://"+agents+"/healthz", ""); code == http.StatusOK {
			break
		}
		if tries == 500 {
			t.Fatal("weir dataplane did not start")
		}
		<-tick.C
	}
	if code, body := get("http://"+agents+"/metrics", ""); code != http.StatusNotFound || strings.Contains(body, "weir_dataplane_") {
		t.Errorf("agents' port /metrics: %d %.80s", code, body)
	}
	if code, _ := get("http://"+metrics+"/metrics", ""); code != http.StatusUnauthorized {
		t.Errorf("metrics address without the token: %d", code)
	}
	if code, body := get("http://"+metrics+"/metrics", "Bearer "+token); code != http.StatusOK || !strings.Contains(body, "weir_dataplane_request_body_buffer_bytes") {
		t.Errorf("metrics address with the token: %d %.80s", code, body)
	}
}
