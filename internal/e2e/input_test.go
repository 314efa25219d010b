package e2e

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestBadInput: weir answers malformed, oversized, unauthenticated and
// misrouted requests itself, in the Anthropic error shape, and none of
// them reaches the upstream.
func TestBadInput(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "api-1"}}, maxBodyBytes: 1 << 10})
	big := `{"model":"` + model + `","max_tokens":8,"messages":[{"role":"user","content":"` + strings.Repeat("a", 2<<10) + `"}]}`
	tests := []struct {
		name         string
		method, path string
		body         string
		edit         func(*http.Request)
		status       int
		typ          string
	}{
		{name: "body not JSON", method: "POST", path: "/v1/messages", body: "model=claude", status: 400, typ: "invalid_request_error"},
		{name: "body truncated JSON", method: "POST", path: "/v1/messages", body: `{"model":"` + model + `",`, status: 400, typ: "invalid_request_error"},
		{name: "body a JSON array", method: "POST", path: "/v1/messages", body: `[1,2]`, status: 400, typ: "invalid_request_error"},
		{name: "model missing", method: "POST", path: "/v1/messages", body: `{"max_tokens":8,"messages":[]}`, status: 400, typ: "invalid_request_error"},
		{name: "model empty", method: "POST", path: "/v1/messages", body: `{"model":"","messages":[]}`, status: 400, typ: "invalid_request_error"},
		{name: "model not a string", method: "POST", path: "/v1/messages", body: `{"model":42}`, status: 400, typ: "invalid_request_error"},
		{name: "empty body", method: "POST", path: "/v1/messages", body: "", status: 400, typ: "invalid_request_error"},
		{name: "body not UTF-8", method: "POST", path: "/v1/messages", body: `{"model":"` + model + `","max_tokens":8,"messages":[{"role":"user","content":"caf` + "\xe9" + `"}]}`, status: 400, typ: "invalid_request_error"},
		{name: "count_tokens without model", method: "POST", path: "/v1/messages/count_tokens", body: `{}`, status: 400, typ: "invalid_request_error"},
		{name: "body over the limit", method: "POST", path: "/v1/messages", body: big, status: 413, typ: "request_too_large"},
		{name: "body over the limit, chunked", method: "POST", path: "/v1/messages", body: big, edit: func(r *http.Request) {
			// Hide the length: the body arrives chunked.
			r.Body, r.ContentLength = io.NopCloser(io.MultiReader(strings.NewReader(big))), -1
		}, status: 413, typ: "request_too_large"},
		{name: "no key", method: "POST", path: "/v1/messages", body: messagesBody(false), edit: func(r *http.Request) { r.Header.Del("X-Api-Key") }, status: 401, typ: "authentication_error"},
		{name: "unknown key", method: "POST", path: "/v1/messages", body: messagesBody(false), edit: func(r *http.Request) { r.Header.Set("X-Api-Key", "weir_sk_"+randHex(32)) }, status: 401, typ: "authentication_error"},
		{name: "unknown bearer", method: "POST", path: "/v1/messages", body: messagesBody(false), edit: func(r *http.Request) {
			r.Header.Del("X-Api-Key")
			r.Header.Set("Authorization", "Bearer weir_sk_"+randHex(32))
		}, status: 401, typ: "authentication_error"},
		{name: "account credential is not a client key", method: "POST", path: "/v1/messages", body: messagesBody(false), edit: func(r *http.Request) { r.Header.Set("X-Api-Key", e.creds["api-1"]) }, status: 401, typ: "authentication_error"},
		{name: "GET messages", method: "GET", path: "/v1/messages", status: 405, typ: "invalid_request_error"},
		{name: "DELETE models", method: "DELETE", path: "/v1/models", status: 405, typ: "invalid_request_error"},
		{name: "unknown path", method: "POST", path: "/v1/complete", body: messagesBody(false), status: 404, typ: "not_found_error"},
		{name: "unknown path without key", method: "GET", path: "/v2/messages", edit: func(r *http.Request) { r.Header.Del("X-Api-Key") }, status: 404, typ: "not_found_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := e.do(tt.method, tt.path, tt.body, tt.edit)
			apiErr := weirError(t, r, tt.status, tt.typ)
			if !strings.HasPrefix(apiErr.RequestID, "weir_") {
				t.Errorf("request_id = %q, want weir's own", apiErr.RequestID)
			}
			if r.header.Get("X-Should-Retry") != "false" {
				t.Errorf("X-Should-Retry = %q, want false", r.header.Get("X-Should-Retry"))
			}
			if tt.status == 405 && r.header.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
		})
	}
	t.Cleanup(func() {
		// Runs after every subtest: nothing went upstream.
		if n := len(e.sim.Attempts()); n != 0 {
			t.Errorf("simulator saw %d attempts: %v", n, e.attempts())
		}
	})
}

// TestRevokedKeyRejectedDespiteCache: a key revoked while a worker still
// trusts it from its cache gets no lease, because Acquire checks again.
func TestRevokedKeyRejectedDespiteCache(t *testing.T) {
	t.Parallel()
	dpReg := prometheus.NewRegistry()
	e := setup(t, options{accounts: []account{{label: "api-1"}}, keyCacheTTL: time.Hour, dpRegistry: dpReg})
	poolReady(t, dpReg)
	if r := e.post(false); r.status != http.StatusOK {
		t.Fatalf("before revocation: status %d: %s", r.status, r.body)
	}
	// The worker now holds a reusable lease for this key, and the key's
	// verification for an hour: the revocation must end both.
	before := metricValue(t, dpReg, "weir_dataplane_lease_pool_invalidations_total", map[string]string{"scope": "all"})
	if _, err := e.keys.RevokeKey(t.Context(), connect.NewRequest(&weirv1.RevokeKeyRequest{Id: e.keyID})); err != nil {
		t.Fatal(err)
	}
	// It reaches the worker through the pool watch, milliseconds later.
	eventually(t, "the revocation to reach the worker", func() bool {
		return metricValue(t, dpReg, "weir_dataplane_lease_pool_invalidations_total", map[string]string{"scope": "all"}) > before
	})
	for _, stream := range []bool{false, true} {
		r := e.post(stream)
		weirError(t, r, http.StatusUnauthorized, "authentication_error")
		if r.header.Get("X-Should-Retry") != "false" {
			t.Errorf("X-Should-Retry = %q", r.header.Get("X-Should-Retry"))
		}
	}
	if got := e.attempts(); len(got) != 1 {
		t.Errorf("simulator attempts = %v, want only the one before revocation", got)
	}
	e.leasesReleased()
}

// TestStalledBodyTimesOut: a client that sends its headers and part of
// its body, then nothing (a slow-loris client, or one that hung), gets a
// 408 in its own format once BodyReadTimeout passes, and nothing was
// leased for it: the worker holds no handler and no slot for it.
func TestStalledBodyTimesOut(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	cpReg := prometheus.NewRegistry()
	e := setup(t, options{cpRegistry: cpReg, bodyReadTimeout: timeout, accounts: []account{{label: "api-1"}}})
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.dpSrv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"` + model + `","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`
	head := "POST /v1/messages HTTP/1.1\r\nHost: weir\r\nContent-Type: application/json\r\nX-Api-Key: " + e.key +
		"\r\nAnthropic-Version: 2023-06-01\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
	if _, err := io.WriteString(conn, head+body[:10]); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	conn.SetReadDeadline(time.Now().Add(30 * time.Second)) //nolint:errcheck // a bound on the test, not the behaviour
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v", err)
	}
	waited := time.Since(start)
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), `"type":"request_timeout"`) {
		t.Errorf("stalled body: %d %s, want 408 request_timeout in the Anthropic error shape", res.StatusCode, b)
	}
	if waited < timeout/2 {
		t.Errorf("answered after %v, before the %v body timeout", waited, timeout)
	}
	if n := metricValue(t, cpReg, "weir_controlplane_acquire_seconds", nil); n != 0 {
		t.Errorf("%v Acquires for a request whose body never came", n)
	}
}
