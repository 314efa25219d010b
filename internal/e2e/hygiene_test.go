package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// rawRequest writes req (headers, CRLF-terminated, and body) on a fresh
// TCP connection to the worker, as a client Go's own would refuse to be
// sends it, and reads the answer.
func (e *env) rawRequest(req string) response {
	e.t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.dpSrv.URL, "http://"))
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(waitFor)) //nolint:errcheck // a bound on the test, not the behaviour
	if _, err := io.WriteString(conn, req); err != nil {
		e.t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		e.t.Fatalf("no answer: %v", err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatalf("read answer: %v", err)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}
}

// chunked is body in the chunked framing, with a trailer.
func chunked(body string) string {
	return fmt.Sprintf("%x\r\n%s\r\n0\r\nX-Trailer-Secret: trailer-value\r\n\r\n", len(body), body)
}

// hopAndClientHeaders are what the client sends that no upstream may see:
// its own credentials and cookies, a proxy's credentials, and every
// hop-by-hop header, including one named only in Connection.
const hopAndClientHeaders = "Cookie: session=client-cookie-value\r\n" +
	"Proxy-Authorization: Basic cHJveHktdXNlcjpwcm94eS1wYXNz\r\n" +
	"Connection: keep-alive, X-Hop-Secret\r\n" +
	"X-Hop-Secret: hop-value\r\n" +
	"Keep-Alive: timeout=5\r\n" +
	"TE: trailers\r\n" +
	"Upgrade: example/1\r\n" +
	"Trailer: X-Trailer-Secret\r\n" +
	"Transfer-Encoding: chunked\r\n" +
	// A control: an ordinary header does pass.
	"X-Client-Visible: yes\r\n"

// neverUpstream are the headers of hopAndClientHeaders that must not
// reach the upstream; the client's weir key must not appear in any value.
var neverUpstream = []string{"Cookie", "Proxy-Authorization", "Connection", "X-Hop-Secret", "Keep-Alive", "Te",
	"Upgrade", "Trailer", "Transfer-Encoding", "X-Trailer-Secret"}

// accountHeaders name the account behind an answer (the simulator sends
// each of them); none may reach the client.
var accountHeaders = []string{"Set-Cookie", "Anthropic-Organization-Id", "Openai-Organization", "Openai-Project", "Chatgpt-Account-Id"}

// checkUpstreamRequest: the upstream got the account's credential, the
// control header, and nothing of the client's own.
func (e *env) checkUpstreamRequest(t *testing.T, x upstreamExchange, label string) {
	t.Helper()
	for _, h := range neverUpstream {
		if v, ok := x.reqHeader[h]; ok {
			t.Errorf("upstream got %s: %q", h, v)
		}
	}
	for k, vs := range x.reqHeader {
		for _, v := range vs {
			if strings.Contains(v, e.key) || strings.Contains(v, "client-cookie-value") || strings.Contains(v, "hop-value") {
				t.Errorf("upstream got the client's own value in %s", k)
			}
		}
	}
	if x.reqHeader.Get("X-Client-Visible") != "yes" {
		t.Errorf("the ordinary header did not pass: %v", headerNames(x.reqHeader))
	}
	cred := e.creds[label]
	if x.reqHeader.Get("X-Api-Key") != cred && x.reqHeader.Get("Authorization") != "Bearer "+cred {
		t.Errorf("upstream did not get %s's credential", label)
	}
}

// checkClientResponse: the upstream sent the account's headers (else the
// check proves nothing) and the client saw none of them, nor the label.
func checkClientResponse(t *testing.T, x upstreamExchange, r response, label string) {
	t.Helper()
	sent := 0
	for _, h := range accountHeaders {
		if x.header.Get(h) == "" {
			continue
		}
		sent++
		if v, ok := r.header[h]; ok {
			t.Errorf("client got %s: %q", h, v)
		}
	}
	// Set-Cookie and the organization id, or Set-Cookie and OpenAI's three.
	if x.header.Get("Set-Cookie") == "" || sent < 2 {
		t.Errorf("the upstream sent %d of the account's headers: the check is hollow", sent)
	}
	for k, vs := range r.header {
		for _, v := range vs {
			if strings.Contains(v, label) {
				t.Errorf("client header %s names the account: %q", k, v)
			}
		}
	}
}

// TestHeaderHygiene: on the Anthropic and the OpenAI surfaces, streamed
// and not, the client's auth, cookies, proxy credentials and hop-by-hop
// headers never reach the upstream, and the upstream's cookies and
// account-naming headers never reach the client; the same for the
// Responses WebSocket's handshake headers.
func TestHeaderHygiene(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "anthropic-acct-7"}, {label: "codex-acct-9", provider: "codex"}}})
	surfaces := []struct {
		path, body, label, auth string
	}{
		{"/v1/messages", messagesBody(false), "anthropic-acct-7", "X-Api-Key: " + e.key + "\r\nAnthropic-Version: 2023-06-01\r\nAuthorization: Bearer " + e.key + "\r\n"},
		{"/v1/messages", messagesBody(true), "anthropic-acct-7", "X-Api-Key: " + e.key + "\r\nAnthropic-Version: 2023-06-01\r\n"},
		{"/v1/responses", responsesBody(false), "codex-acct-9", "Authorization: Bearer " + e.key + "\r\nX-Api-Key: " + e.key + "\r\n"},
		{"/v1/responses", responsesBody(true), "codex-acct-9", "Authorization: Bearer " + e.key + "\r\n"},
	}
	for _, s := range surfaces {
		before := len(e.upstream.exchanges())
		r := e.rawRequest("POST " + s.path + " HTTP/1.1\r\nHost: weir\r\nContent-Type: application/json\r\n" + s.auth +
			hopAndClientHeaders + "\r\n" + chunked(s.body))
		if r.status != http.StatusOK {
			t.Fatalf("%s: status %d: %s", s.path, r.status, r.body)
		}
		xs := e.upstream.exchanges()
		if len(xs) != before+1 {
			t.Fatalf("%s: %d upstream requests, want 1", s.path, len(xs)-before)
		}
		e.checkUpstreamRequest(t, xs[before], s.label)
		checkClientResponse(t, xs[before], r, s.label)
	}

	// The Responses WebSocket forwards its handshake's headers to every
	// request it makes; the same rules hold for them.
	url := "ws" + strings.TrimPrefix(e.dpSrv.URL, "http") + "/v1/responses"
	c, resp, err := websocket.Dial(t.Context(), url, &websocket.DialOptions{HTTPHeader: http.Header{
		"Authorization": {"Bearer " + e.key}, "Openai-Beta": {"responses_websockets=2026-02-06"},
		"Cookie": {"session=client-cookie-value"}, "Proxy-Authorization": {"Basic cHJveHktdXNlcjpwcm94eS1wYXNz"},
		"X-Client-Visible": {"yes"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow() //nolint:errcheck // test
	for _, h := range accountHeaders {
		if v := resp.Header.Get(h); v != "" {
			t.Errorf("handshake answer has %s: %q", h, v)
		}
	}
	before := len(e.upstream.exchanges())
	sendCreate(t, c, "")
	if evs := readResponse(t, c); evs[len(evs)-1]["type"] != "response.completed" {
		t.Fatalf("websocket: %v", evs[len(evs)-1])
	}
	xs := e.upstream.exchanges()
	if len(xs) != before+1 {
		t.Fatalf("websocket: %d upstream requests, want 1", len(xs)-before)
	}
	e.checkUpstreamRequest(t, xs[before], "codex-acct-9")
}

// headerNames lists a header's names only: the values of an upstream
// request hold the account's credential, which test output must not.
func headerNames(h http.Header) []string {
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}
