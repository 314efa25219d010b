package dataplane

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// newTestServer builds a worker whose control plane is a closed port: the
// paths tested here must answer without it, or fail cleanly.
func newTestServer(t testing.TB) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s, err := New(Config{ControlPlaneURL: "http://" + addr, Token: "dp-token-0123456789", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(t.Context()) })
	return s
}

func serveOnce(t *testing.T, h http.Handler, r *http.Request) (*http.Response, []byte) {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	res := w.Result()
	body, _ := io.ReadAll(res.Body)
	return res, body
}

func TestHandlerLocalAnswers(t *testing.T) {
	t.Parallel()
	s := newTestServer(t)
	h := s.Handler()
	tests := []struct {
		name   string
		req    func() *http.Request
		status int
		typ    string
		allow  string
	}{
		{"unknown path", func() *http.Request { return httptest.NewRequest("POST", "/v1/complete", strings.NewReader("{}")) }, 404, "not_found_error", ""},
		{"root", func() *http.Request { return httptest.NewRequest("GET", "/", nil) }, 404, "not_found_error", ""},
		{"GET messages", func() *http.Request { return httptest.NewRequest("GET", "/v1/messages", nil) }, 405, "invalid_request_error", "POST"},
		{"PUT count_tokens", func() *http.Request { return httptest.NewRequest("PUT", "/v1/messages/count_tokens", nil) }, 405, "invalid_request_error", "POST"},
		{"POST models", func() *http.Request { return httptest.NewRequest("POST", "/v1/models", nil) }, 405, "invalid_request_error", "GET"},
		{"no key", func() *http.Request {
			return httptest.NewRequest("POST", "/v1/messages", strings.NewReader(`{"model":"m"}`))
		}, 401, "authentication_error", ""},
		{"basic auth is not a key", func() *http.Request {
			r := httptest.NewRequest("POST", "/v1/messages", strings.NewReader(`{"model":"m"}`))
			r.Header.Set("Authorization", "Basic dXNlcjpwYXNz")
			return r
		}, 401, "authentication_error", ""},
		{"blank key", func() *http.Request {
			r := httptest.NewRequest("POST", "/v1/messages", strings.NewReader(`{"model":"m"}`))
			r.Header.Set("X-Api-Key", "   ")
			return r
		}, 401, "authentication_error", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res, body := serveOnce(t, h, tt.req())
			if res.StatusCode != tt.status {
				t.Fatalf("status = %d, want %d: %s", res.StatusCode, tt.status, body)
			}
			e := decodeAPIError(t, body)
			if e.Error.Type != tt.typ {
				t.Errorf("error type = %q, want %q", e.Error.Type, tt.typ)
			}
			if got := res.Header.Get("Allow"); got != tt.allow {
				t.Errorf("Allow = %q, want %q", got, tt.allow)
			}
			if res.Header.Get("X-Should-Retry") != "false" {
				t.Errorf("X-Should-Retry = %q, want false", res.Header.Get("X-Should-Retry"))
			}
			if res.Header.Get("Content-Type") != "application/json" {
				t.Errorf("Content-Type = %q", res.Header.Get("Content-Type"))
			}
		})
	}
}

// TestHandlerControlPlaneUnreachable: with nothing listening at the control
// plane, an authenticated request gets a retryable 503, not a hang or a panic.
func TestHandlerControlPlaneUnreachable(t *testing.T) {
	t.Parallel()
	s := newTestServer(t)
	r := httptest.NewRequest("POST", "/v1/messages", strings.NewReader(`{"model":"m"}`))
	r.Header.Set("Authorization", "Bearer "+testClientKey)
	res, body := serveOnce(t, s.Handler(), r)
	if res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status = %d: %s", res.StatusCode, body)
	}
	if e := decodeAPIError(t, body); e.Error.Type != "api_error" || e.RequestID != res.Header.Get("Weir-Request-Id") {
		t.Errorf("body = %+v, Weir-Request-Id %q", e, res.Header.Get("Weir-Request-Id"))
	}
	if res.Header.Get("Retry-After") != "2" || res.Header.Get("X-Should-Retry") != "true" {
		t.Errorf("Retry-After %q X-Should-Retry %q", res.Header.Get("Retry-After"), res.Header.Get("X-Should-Retry"))
	}
}

func TestHealthz(t *testing.T) {
	t.Parallel()
	res, body := serveOnce(t, newTestServer(t).Handler(), httptest.NewRequest("GET", "/healthz", nil))
	if res.StatusCode != 200 || string(body) != "ok\n" {
		t.Errorf("healthz = %d %q", res.StatusCode, body)
	}
}

func TestClientKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		apiKey, auth, want string
	}{
		{"k1", "", "k1"},
		{"  k1 ", "", "k1"},
		{"", "Bearer k2", "k2"},
		{"", "Bearer  k2 ", "k2"},
		{"k1", "Bearer k2", "k1"},
		{"", "Basic k3", ""},
		{"", "", ""},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("POST", "/v1/messages", nil)
		if tt.apiKey != "" {
			r.Header.Set("X-Api-Key", tt.apiKey)
		}
		if tt.auth != "" {
			r.Header.Set("Authorization", tt.auth)
		}
		if got := clientKey(r); got != tt.want {
			t.Errorf("clientKey(x-api-key %q, authorization %q) = %q, want %q", tt.apiKey, tt.auth, got, tt.want)
		}
	}
	if hashKey("abc") != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Error("hashKey is not hex SHA-256")
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := Config{ControlPlaneURL: "http://127.0.0.1:7481", Token: "t"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	tests := []struct {
		field string
		edit  func(*Config)
	}{
		{"ControlPlaneURL", func(c *Config) { c.ControlPlaneURL = "" }},
		{"ControlPlaneURL", func(c *Config) { c.ControlPlaneURL = "127.0.0.1:7481" }},
		{"ControlPlaneURL", func(c *Config) { c.ControlPlaneURL = "ftp://h" }},
		{"Token", func(c *Config) { c.Token = "" }},
		{"MaxBodyBytes", func(c *Config) { c.MaxBodyBytes = -1 }},
		{"MaxAttempts", func(c *Config) { c.MaxAttempts = -1 }},
		{"KeyCacheTTL", func(c *Config) { c.KeyCacheTTL = -time.Second }},
	}
	for _, tt := range tests {
		c := ok
		tt.edit(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("Validate() = %v, want an error naming %s", err, tt.field)
		}
		if _, err := New(c); err == nil {
			t.Errorf("New accepted an invalid config (%s)", tt.field)
		}
	}
}

// TestMetricsDeployable: with MetricsApart the agents' port answers
// /metrics as a path weir does not serve (404 in the Anthropic format);
// with MetricsToken, MetricsHandler answers only a bearer with the token.
// Neither set: served openly on the agents' port, as before.
func TestMetricsDeployable(t *testing.T) {
	t.Parallel()
	open := newTestServer(t)
	if res, body := serveOnce(t, open.Handler(), httptest.NewRequest("GET", "/metrics", nil)); res.StatusCode != 200 || !strings.Contains(string(body), "weir_dataplane_") {
		t.Errorf("default /metrics: %d", res.StatusCode)
	}
	s := newTestServer(t)
	s.cfg.MetricsApart, s.cfg.MetricsToken = true, "metrics-token-0123456789"
	if res, body := serveOnce(t, s.Handler(), httptest.NewRequest("GET", "/metrics", nil)); res.StatusCode != 404 || !strings.Contains(string(body), `"not_found_error"`) {
		t.Errorf("agents' port /metrics with MetricsApart: %d %s", res.StatusCode, body)
	}
	for _, auth := range []string{"", "Bearer wrong", "metrics-token-0123456789", "Bearer " + s.cfg.MetricsToken} {
		r := httptest.NewRequest("GET", "/metrics", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		res, body := serveOnce(t, s.MetricsHandler(), r)
		ok := auth == "Bearer "+s.cfg.MetricsToken
		if ok != (res.StatusCode == 200) || ok != strings.Contains(string(body), "weir_dataplane_") || !ok && res.StatusCode != 401 {
			t.Errorf("Authorization %q: %d", auth, res.StatusCode)
		}
	}
}

// TestControlCharacterHeaders: a header value with a control character
// never reaches the handler over the wire today (net/http answers its own
// plain 400 first: internal/e2e TestHeaderInjection pins that). Should
// one arrive (a future Go, another server in front), the worker refuses
// it in the client's format before the key is even used.
func TestControlCharacterHeaders(t *testing.T) {
	t.Parallel()
	h := newTestServer(t).Handler()
	for _, tc := range []struct {
		path, header, value string
		openAI              bool
	}{
		{"/v1/messages", "X-Claude-Code-Session-Id", "abc\x00def", false},
		{"/v1/messages", "Anthropic-Beta", "a\rX-Injected: 1", false},
		{"/v1/responses", "Session_id", "s\x01", true},
		{"/v1/chat/completions", "X-Request-Id", "r\x7f", true},
	} {
		r := httptest.NewRequest("POST", tc.path, strings.NewReader(`{"model":"m"}`))
		r.Header.Set("X-Api-Key", "weir_sk_test")
		r.Header.Set("Authorization", "Bearer weir_sk_test")
		r.Header[tc.header] = []string{tc.value}
		res, body := serveOnce(t, h, r)
		want := `"type":"error"`
		if tc.openAI {
			want = `"param":null`
		}
		if res.StatusCode != 400 || !strings.Contains(string(body), want) || !strings.Contains(string(body), "holds a control character") {
			t.Errorf("%s %s: %d %s", tc.path, tc.header, res.StatusCode, body)
		}
	}
}
