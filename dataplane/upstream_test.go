package dataplane

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

const (
	testAPIKey     = "sk-ant-api03-account-credential-0001"
	testOAuthToken = "sk-ant-oat01-account-credential-0002"
	testClientKey  = "weir_sk_client-secret-that-must-not-leak"
)

// agentRequest is an inbound request the way Claude Code sends it, with
// every header a proxy must not forward mixed in.
func agentRequest(t *testing.T, target string, body string) *http.Request {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	h := r.Header
	h.Set("X-Api-Key", testClientKey)
	h.Set("Authorization", "Bearer "+testClientKey)
	h.Set("Host", "weir.internal:7480")
	h.Set("Content-Length", "999")
	h.Set("Accept-Encoding", "br, gzip")
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "claude-cli/2.1.33 (external, cli)")
	h.Set("X-App", "cli")
	h.Set("X-Claude-Code-Session-Id", "6f1d2c1e-session")
	h.Set("X-Stainless-Lang", "js")
	h.Add("X-Stainless-Retry-Count", "0")
	// Hop-by-hop, plus two headers the Connection header names.
	h.Set("Connection", "keep-alive, X-Hop-Custom")
	h.Add("Connection", "x-other-hop")
	h.Set("X-Hop-Custom", "1")
	h.Set("X-Other-Hop", "2")
	h.Set("Keep-Alive", "timeout=5")
	h.Set("Proxy-Connection", "keep-alive")
	h.Set("Proxy-Authorization", "Basic c2VjcmV0")
	h.Set("Proxy-Authenticate", "Basic")
	h.Set("Te", "trailers")
	h.Set("Trailer", "X-Trailer")
	h.Set("Transfer-Encoding", "chunked")
	h.Set("Upgrade", "h2c")
	return r
}

func TestUpstreamRequestHeaders(t *testing.T) {
	t.Parallel()
	body := `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`
	in := agentRequest(t, "http://weir.internal:7480/v1/messages?beta=true", body)
	in.Header.Set("Anthropic-Version", "2023-06-01")
	in.Header.Set("Anthropic-Beta", "interleaved-thinking-2025-05-14")
	lease := &weirv1.Lease{BaseUrl: "http://upstream.test:8080/", AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY, Credential: testAPIKey}

	out, _, err := upstreamRequest(t.Context(), in, surfaceMessages, []byte(body), lease, false)
	if err != nil {
		t.Fatal(err)
	}
	if out.Method != http.MethodPost {
		t.Errorf("method = %s", out.Method)
	}
	if got := out.URL.String(); got != "http://upstream.test:8080/v1/messages?beta=true" {
		t.Errorf("URL = %s", got)
	}
	if out.Host != "" && out.Host != "upstream.test:8080" {
		t.Errorf("Host = %q, want the upstream's", out.Host)
	}
	for _, k := range []string{
		"Authorization", "Host", "Content-Length", "Accept-Encoding", "Connection", "X-Hop-Custom", "X-Other-Hop",
		"Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "Proxy-Authenticate", "Te", "Trailer",
		"Transfer-Encoding", "Upgrade",
	} {
		if v, ok := out.Header[k]; ok {
			t.Errorf("header %s forwarded: %q", k, v)
		}
	}
	if got := out.Header.Values("X-Api-Key"); !slices.Equal(got, []string{testAPIKey}) {
		t.Errorf("X-Api-Key = %q, want the account's credential only", got)
	}
	for k, vs := range out.Header {
		for _, v := range vs {
			if strings.Contains(v, testClientKey) {
				t.Errorf("header %s carries the client's key", k)
			}
		}
	}
	want := map[string]string{
		"Content-Type":             "application/json",
		"User-Agent":               "claude-cli/2.1.33 (external, cli)",
		"X-App":                    "cli",
		"X-Claude-Code-Session-Id": "6f1d2c1e-session",
		"X-Stainless-Lang":         "js",
		"X-Stainless-Retry-Count":  "0",
		"Anthropic-Version":        "2023-06-01",
		"Anthropic-Beta":           "interleaved-thinking-2025-05-14",
	}
	for k, v := range want {
		if got := out.Header.Values(k); !slices.Equal(got, []string{v}) {
			t.Errorf("header %s = %q, want [%q]", k, got, v)
		}
	}
	if out.ContentLength != int64(len(body)) {
		t.Errorf("ContentLength = %d, want %d", out.ContentLength, len(body))
	}
	got, err := io.ReadAll(out.Body)
	if err != nil || string(got) != body {
		t.Errorf("body = %q (%v), want %q", got, err, body)
	}
	// The body can be replayed for a retry on the same connection.
	if out.GetBody == nil {
		t.Error("GetBody is nil: the transport cannot replay the body")
	}
	// The inbound request is not modified.
	if in.Header.Get("X-Api-Key") != testClientKey {
		t.Error("the inbound request's headers were changed")
	}
}

func TestUpstreamRequestOAuth(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		beta []string // client's anthropic-beta values
		want string
	}{
		{"no beta", nil, "oauth-2025-04-20"},
		{"other betas", []string{"prompt-caching-2024-07-31, interleaved-thinking-2025-05-14"}, "prompt-caching-2024-07-31,interleaved-thinking-2025-05-14,oauth-2025-04-20"},
		{"several header lines", []string{"a-1", "b-2,c-3"}, "a-1,b-2,c-3,oauth-2025-04-20"},
		{"already there", []string{"claude-code-20250219,oauth-2025-04-20,fine-grained-tool-streaming-2025-05-14"}, "claude-code-20250219,oauth-2025-04-20,fine-grained-tool-streaming-2025-05-14"},
		{"already there with spaces", []string{" oauth-2025-04-20 , x-1"}, "oauth-2025-04-20,x-1"},
		{"empty entries dropped", []string{",, x-1 ,"}, "x-1,oauth-2025-04-20"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := agentRequest(t, "http://weir.internal/v1/messages", "{}")
			for _, b := range tt.beta {
				in.Header.Add("Anthropic-Beta", b)
			}
			lease := &weirv1.Lease{BaseUrl: "https://api.anthropic.com", AuthKind: weirv1.AuthKind_AUTH_KIND_OAUTH, Credential: testOAuthToken}
			out, _, err := upstreamRequest(t.Context(), in, surfaceMessages, []byte("{}"), lease, false)
			if err != nil {
				t.Fatal(err)
			}
			if got := out.Header.Values("Authorization"); !slices.Equal(got, []string{"Bearer " + testOAuthToken}) {
				t.Errorf("Authorization = %q", got)
			}
			if v, ok := out.Header["X-Api-Key"]; ok {
				t.Errorf("X-Api-Key forwarded on an OAuth lease: %q", v)
			}
			got := out.Header.Values("Anthropic-Beta")
			if !slices.Equal(got, []string{tt.want}) {
				t.Errorf("Anthropic-Beta = %q, want [%q]", got, tt.want)
			}
			if n := strings.Count(strings.Join(got, ","), oauthBeta); n != 1 {
				t.Errorf("oauth beta appears %d times", n)
			}
		})
	}
}

func TestUpstreamRequestDefaults(t *testing.T) {
	t.Parallel()
	t.Run("anthropic-version defaulted", func(t *testing.T) {
		t.Parallel()
		in := agentRequest(t, "http://weir.internal/v1/messages/count_tokens", "{}")
		out, _, err := upstreamRequest(t.Context(), in, surfaceMessages, []byte("{}"), &weirv1.Lease{BaseUrl: "http://u.test", Credential: testAPIKey}, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := out.Header.Get("Anthropic-Version"); got != "2023-06-01" {
			t.Errorf("Anthropic-Version = %q", got)
		}
		// An unspecified auth kind is treated as an API key.
		if got := out.Header.Get("X-Api-Key"); got != testAPIKey {
			t.Errorf("X-Api-Key = %q", got)
		}
		if got := out.URL.String(); got != "http://u.test/v1/messages/count_tokens" {
			t.Errorf("URL = %s", got)
		}
	})
	t.Run("client's anthropic-version kept", func(t *testing.T) {
		t.Parallel()
		in := agentRequest(t, "http://weir.internal/v1/messages", "{}")
		in.Header.Set("Anthropic-Version", "2023-01-01")
		out, _, err := upstreamRequest(t.Context(), in, surfaceMessages, []byte("{}"), &weirv1.Lease{BaseUrl: "http://u.test", Credential: testAPIKey}, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := out.Header.Values("Anthropic-Version"); !slices.Equal(got, []string{"2023-01-01"}) {
			t.Errorf("Anthropic-Version = %q", got)
		}
	})
	t.Run("query string and escaped path preserved", func(t *testing.T) {
		t.Parallel()
		in := agentRequest(t, "http://weir.internal/v1/models/claude%2Fx?beta=true&after_id=a%20b&limit=5", "")
		in.Method = http.MethodGet
		out, _, err := upstreamRequest(t.Context(), in, surfaceMessages, nil, &weirv1.Lease{BaseUrl: "https://proxy.test/anthropic/", Credential: testAPIKey}, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := out.URL.String(); got != "https://proxy.test/anthropic/v1/models/claude%2Fx?beta=true&after_id=a%20b&limit=5" {
			t.Errorf("URL = %s", got)
		}
		if out.Method != http.MethodGet || (out.Body != nil && out.Body != http.NoBody) || out.ContentLength != 0 {
			t.Errorf("GET has a body: method %s, ContentLength %d", out.Method, out.ContentLength)
		}
	})
	t.Run("invalid base URL", func(t *testing.T) {
		t.Parallel()
		in := agentRequest(t, "http://weir.internal/v1/messages", "{}")
		if _, _, err := upstreamRequest(t.Context(), in, surfaceMessages, []byte("{}"), &weirv1.Lease{BaseUrl: "http://bad host\x7f", Credential: testAPIKey}, false); err == nil {
			t.Error("no error for an invalid base URL")
		}
	})
}

func TestCopyResponseHeaders(t *testing.T) {
	t.Parallel()
	src := http.Header{}
	src.Set("Content-Type", "text/event-stream; charset=utf-8")
	src.Set("Request-Id", "req_011CUp")
	src.Set("Retry-After", "12")
	src.Set("X-Should-Retry", "true")
	src.Set("Anthropic-Ratelimit-Requests-Remaining", "3999")
	src.Set("Cache-Control", "no-cache")
	src.Set("X-Ratelimit-Remaining-Requests", "499")
	src.Set("X-Codex-Plan-Type", "plus")
	src.Set("Retry-After-Ms", "1200")
	// Spare capacity, as a parsed header's values may have.
	src["X-Request-Id"] = append(make([]string, 0, 4), "1.1 a", "1.1 b")
	// Dropped: identity, hop-by-hop, Connection-listed, framing, and
	// anything not listed.
	src.Set("Anthropic-Organization-Id", "a1b2c3d4-org")
	src.Set("Openai-Organization", "org-123")
	src.Set("Openai-Project", "proj_123")
	src.Set("Chatgpt-Account-Id", "acct-123")
	src.Set("Set-Cookie", "__cf_bm=abc; Path=/")
	src.Set("X-Upstream-Account-Label", "max-alice")
	src.Set("Via", "1.1 upstream")
	// Dropped: the serving account's own rate-limit standing (the pool's
	// is written in its place, poolHeaders).
	src.Set("Anthropic-Ratelimit-Unified-Status", "allowed")
	src.Set("Anthropic-Ratelimit-Unified-5h-Utilization", "0.42")
	src.Set("Anthropic-Ratelimit-Unified-Overage-Disabled-Reason", "org_level_disabled")
	src.Set("X-Codex-Primary-Used-Percent", "12")
	src.Set("X-Codex-Secondary-Reset-At", "1893679200")
	src.Set("X-Codex-Bengalfox-Primary-Used-Percent", "80")
	src.Set("X-Codex-Bengalfox-Limit-Name", "gpt-5.2-codex-sonic")
	src.Set("X-Codex-Credits-Balance", "12.5")
	src.Set("X-Codex-Active-Limit", "codex")
	src.Set("Server", "cloudflare")
	src.Set("Connection", "keep-alive, X-Upstream-Hop")
	src.Set("X-Upstream-Hop", "1")
	src.Set("Keep-Alive", "timeout=5")
	src.Set("Transfer-Encoding", "chunked")
	src.Set("Trailer", "X-Checksum")
	src.Set("Upgrade", "h2c")
	src.Set("Proxy-Authenticate", "Basic")
	src.Set("Content-Length", "1234")
	src.Set("Content-Encoding", "gzip")

	dst := http.Header{}
	dst.Set("Weir-Request-Id", "weir_1")
	copyResponseHeaders(dst, src)

	want := map[string][]string{
		"Weir-Request-Id":                        {"weir_1"},
		"Content-Type":                           {"text/event-stream; charset=utf-8"},
		"Request-Id":                             {"req_011CUp"},
		"Retry-After":                            {"12"},
		"X-Should-Retry":                         {"true"},
		"Anthropic-Ratelimit-Requests-Remaining": {"3999"},
		"Cache-Control":                          {"no-cache"},
		"X-Ratelimit-Remaining-Requests":         {"499"},
		"X-Codex-Plan-Type":                      {"plus"},
		"Retry-After-Ms":                         {"1200"},
		"X-Request-Id":                           {"1.1 a", "1.1 b"},
	}
	if len(dst) != len(want) {
		t.Errorf("copied %d headers, want %d: %v", len(dst), len(want), dst)
	}
	for k, v := range want {
		if !slices.Equal(dst[k], v) {
			t.Errorf("%s = %q, want %q", k, dst[k], v)
		}
	}
	// The values are shared but clipped: adding to one side never
	// writes into the other's.
	dst.Add("X-Request-Id", "1.1 dst")
	src.Add("X-Request-Id", "1.1 src")
	if got := dst.Values("X-Request-Id"); !slices.Equal(got, []string{"1.1 a", "1.1 b", "1.1 dst"}) {
		t.Errorf("dst X-Request-Id = %q after both sides added one", got)
	}
	if got := src.Values("X-Request-Id"); !slices.Equal(got, []string{"1.1 a", "1.1 b", "1.1 src"}) {
		t.Errorf("src X-Request-Id = %q after both sides added one", got)
	}
}

func TestWithBeta(t *testing.T) {
	t.Parallel()
	if got := withBeta(nil, "f"); got != "f" {
		t.Errorf("withBeta(nil) = %q", got)
	}
	if got := withBeta([]string{"a, f", "b"}, "f"); got != "a,f,b" {
		t.Errorf("withBeta = %q", got)
	}
	// A flag that merely contains the wanted one is not it.
	if got := withBeta([]string{"f-extended"}, "f"); got != "f-extended,f" {
		t.Errorf("withBeta = %q", got)
	}
}
