package dataplane

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// oauthBeta is the anthropic-beta flag OAuth bearer tokens require.
const oauthBeta = "oauth-2025-04-20"

// hopHeaders are connection-scoped and never forwarded (RFC 9110 §7.6.1).
var hopHeaders = map[string]bool{
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// clientOnlyHeaders are the client's own credentials and framing: replaced
// by the account's, or recomputed.
var clientOnlyHeaders = map[string]bool{
	"X-Api-Key": true, "Authorization": true, "Host": true, "Content-Length": true,
	// The account's identity, never the client's: the lease supplies it.
	"Chatgpt-Account-Id": true, "Openai-Organization": true, "Openai-Project": true,
	// Cookies are the client's session with someone else.
	"Cookie": true,
	// Go's transport negotiates compression itself and decodes it, so the
	// worker can read what it relays.
	"Accept-Encoding": true,
}

// upstreamRequest builds the attempt's request: the client's body and
// headers unchanged, except its auth, replaced by the lease's, and the
// body's model when the lease resolved an alias. The body is a
// replayBody: the attempt releases it once its answer is committed.
//
// A translated request (sf the target's surface, body already the
// target's) carries none of the client's headers: they are the other
// wire's (anthropic-beta, a Codex session id), which the target does not
// read, and would tell it who the client is.
func upstreamRequest(ctx context.Context, in *http.Request, sf surface, body []byte, lease *weirv1.Lease, translated bool) (*http.Request, *replayBody, error) {
	path := sf.upstreamPath(in.URL.EscapedPath(), lease.Provider)
	if translated && sf.wire == wireAnthropic {
		path = "/v1/messages"
	}
	target := strings.TrimRight(lease.BaseUrl, "/") + path
	if in.URL.RawQuery != "" && !translated {
		target += "?" + in.URL.RawQuery
	}
	if lease.Model != "" && body != nil && !translated {
		// The client named an alias: the upstream gets the concrete model.
		var err error
		if body, err = withModel(body, lease.Model); err != nil {
			return nil, nil, err
		}
	}
	// Every reader the transport takes reads rb's one copy.
	rb := &replayBody{b: body, n: len(body)}
	var rd io.Reader
	if len(body) > 0 {
		rd, _ = rb.GetBody()
	}
	out, err := http.NewRequestWithContext(ctx, in.Method, target, rd)
	if err != nil {
		return nil, nil, err
	}
	if len(body) > 0 {
		// NewRequest knows the length of its own readers only.
		out.ContentLength, out.GetBody = int64(len(body)), rb.GetBody
	}
	if translated {
		out.Header.Set("Content-Type", "application/json")
		if ua := in.Header.Get("User-Agent"); ua != "" {
			out.Header.Set("User-Agent", ua)
		}
	} else {
		connHeaders := connectionListed(in.Header)
		for k, vs := range in.Header {
			if hopHeaders[k] || clientOnlyHeaders[k] || connHeaders[k] {
				continue
			}
			out.Header[k] = slices.Clip(vs) // shared, as in copyResponseHeaders
		}
	}
	switch lease.Provider {
	case weirv1.Provider_PROVIDER_OPENAI:
		out.Header.Set("Authorization", "Bearer "+lease.Credential)
		return out, rb, nil
	case weirv1.Provider_PROVIDER_CODEX:
		out.Header.Set("Authorization", "Bearer "+lease.Credential)
		out.Header.Set("Chatgpt-Account-Id", lease.UpstreamAccountId)
		return out, rb, nil
	}
	switch lease.AuthKind {
	case weirv1.AuthKind_AUTH_KIND_OAUTH:
		out.Header.Set("Authorization", "Bearer "+lease.Credential)
		out.Header.Set("Anthropic-Beta", withBeta(out.Header.Values("Anthropic-Beta"), oauthBeta))
	default:
		out.Header.Set("X-Api-Key", lease.Credential)
	}
	if out.Header.Get("Anthropic-Version") == "" {
		out.Header.Set("Anthropic-Version", "2023-06-01")
	}
	return out, rb, nil
}

// replayBody is an attempt's request body, shared by every reader the
// transport takes (GetBody, to resend on a fresh connection). A stream's
// answer runs for minutes and an agent's body (the whole conversation) is
// often hundreds of KiB: once the answer is committed to the client,
// nothing will resend it, and release lets the bytes go although the
// transport keeps the request until the stream ends.
type replayBody struct {
	mu       sync.Mutex
	b        []byte
	n        int // len(b), kept after release
	released bool
}

// errBodyReleased is what a read after release gets: only an upstream
// that answered before reading the request could see it.
var errBodyReleased = errors.New("request body already released")

// GetBody is http.Request.GetBody: a fresh reader from the start.
func (rb *replayBody) GetBody() (io.ReadCloser, error) {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if rb.released {
		return nil, errBodyReleased
	}
	return &replayReader{rb: rb}, nil
}

// release drops the bytes; a write in progress finishes first.
func (rb *replayBody) release() {
	if rb == nil {
		return
	}
	rb.mu.Lock()
	rb.b, rb.released = nil, true
	rb.mu.Unlock()
}

// replayReader is one pass over a replayBody.
type replayReader struct {
	rb  *replayBody
	off int
}

// Read reads on; a reader that reached the end reads io.EOF even after
// release: the transport reads once more past Content-Length to check
// that the body had no more, and that check may come after the answer was
// committed.
func (r *replayReader) Read(p []byte) (int, error) {
	r.rb.mu.Lock()
	defer r.rb.mu.Unlock()
	if r.off >= r.rb.n {
		return 0, io.EOF
	}
	if r.rb.released {
		return 0, errBodyReleased
	}
	n := copy(p, r.rb.b[r.off:])
	r.off += n
	return n, nil
}

// WriteTo writes the rest in one call, as bytes.Reader does, instead of
// in copy-buffer chunks.
func (r *replayReader) WriteTo(w io.Writer) (int64, error) {
	r.rb.mu.Lock()
	defer r.rb.mu.Unlock()
	if r.off >= r.rb.n {
		return 0, nil
	}
	if r.rb.released {
		return 0, errBodyReleased
	}
	n, err := w.Write(r.rb.b[r.off:])
	r.off += n
	return int64(n), err
}

func (r *replayReader) Close() error { return nil }

// withBeta joins comma-separated anthropic-beta values, adding flag once.
func withBeta(values []string, flag string) string {
	var flags []string
	seen := false
	for _, v := range values {
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			if f == "" {
				continue
			}
			seen = seen || f == flag
			flags = append(flags, f)
		}
	}
	if !seen {
		flags = append(flags, flag)
	}
	return strings.Join(flags, ",")
}

func connectionListed(h http.Header) map[string]bool {
	out := map[string]bool{}
	for _, v := range h.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				out[http.CanonicalHeaderKey(f)] = true
			}
		}
	}
	return out
}

// Response headers reach the client only when listed here: an upstream
// adds headers over time, and one that names the account (an organization
// or project id, a ChatGPT account id, a session cookie, whatever comes
// next) must not tell a pooled client which account served it. What is
// kept is what clients act on (docs/wire.md): the body's type and caching, the
// upstream's request id (support asks for it), the retry advice the SDKs
// and Claude Code read (retry-after, retry-after-ms, x-should-retry), the
// rate-limit headers of both providers (anthropic-ratelimit-*, including
// the unified ones Claude Code shows; OpenAI's x-ratelimit-*), and Codex's
// x-codex-* usage headers, which Codex shows. Hop-by-hop and framing
// headers are the worker's own to set. Weir's own (Weir-Request-Id) are
// set by the worker, not copied.
var responseHeaders = map[string]bool{
	"Content-Type": true, "Cache-Control": true,
	"Request-Id": true, "X-Request-Id": true,
	"Retry-After": true, "Retry-After-Ms": true, "X-Should-Retry": true,
	"Openai-Processing-Ms": true,
}

// responseHeaderPrefixes extend responseHeaders to families of headers.
var responseHeaderPrefixes = []string{"Anthropic-Ratelimit-", "X-Ratelimit-", "X-Codex-"}

// relayedResponseHeader says whether the client sees an upstream header.
// x-codex-* carry usage and plan, never the account's id; that id is
// Chatgpt-Account-Id, which no prefix admits.
func relayedResponseHeader(k string) bool {
	if responseHeaders[k] {
		return true
	}
	for _, p := range responseHeaderPrefixes {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

// copyResponseHeaders copies the upstream's response headers the client
// should see: never the account's own rate-limit standing
// (accountRateHeader), for the pool's is written in its place.
func copyResponseHeaders(dst, src http.Header) {
	connHeaders := connectionListed(src)
	for k, vs := range src {
		if !relayedResponseHeader(k) || connHeaders[k] || accountRateHeader(k) {
			continue
		}
		// Shared, not copied: a stream keeps both maps for as long as it
		// runs. Nothing writes a header value in place (Set and Del replace
		// a key's slice), and clipped, an Add on either side reallocates.
		dst[k] = slices.Clip(vs)
	}
}
