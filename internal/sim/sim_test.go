package sim

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

const (
	keyA    = "sk-ant-api03-aaaaaaaaaaaaaaaaaaaaWXYZ"
	keyB    = "sk-ant-api03-bbbbbbbbbbbbbbbbbbbbbbbb"
	tokO    = "sk-ant-oat01-oooooooooooooooooooo1234"
	tokGone = "sk-ant-oat01-rrrrrrrrrrrrrrrrrrrrrrrr"
	keyGone = "sk-ant-api03-revokedrevokedrevoked00"

	sonnet = "claude-sonnet-4-5-20250929"
	opus   = "claude-opus-4-1-20250805"
)

// testNow is the pinned clock of every test server.
var testNow = time.Date(2026, 3, 4, 10, 30, 15, 0, time.UTC)

// testScript has an API key, a subscription near its weekly limit, and a
// revoked account of each kind.
func testScript() Script {
	return Script{Accounts: []AccountScript{
		{Name: "key-a", Credential: keyA, Kind: KindAPIKey},
		{Name: "key-b", Credential: keyB, Kind: KindAPIKey},
		{Name: "sub-o", Credential: tokO, Kind: KindOAuth, FiveHourUtilization: 0.3, SevenDayUtilization: 0.85},
		{Name: "sub-gone", Credential: tokGone, Kind: KindOAuth, Revoked: true},
		{Name: "key-gone", Credential: keyGone, Revoked: true},
	}}
}

// bundle is a running simulator with a real client.
type bundle struct {
	sim      *Server
	ts       *httptest.Server
	attempts chan Attempt // every attempt, as it is logged
}

func setup(t *testing.T, cfg Config) *bundle {
	t.Helper()
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return testNow }
	}
	if cfg.Script.Accounts == nil {
		cfg.Script = testScript()
	}
	s := New(cfg)
	b := &bundle{sim: s, attempts: make(chan Attempt, 1000)}
	s.onAttempt = func(a Attempt) { b.attempts <- a }
	b.ts = httptest.NewServer(s)
	t.Cleanup(b.ts.Close)
	return b
}

// nextAttempt waits for the next logged attempt.
func (b *bundle) nextAttempt(t *testing.T) Attempt {
	t.Helper()
	select {
	case a := <-b.attempts:
		return a
	case <-t.Context().Done():
		t.Fatal("no attempt logged")
		return Attempt{}
	}
}

func apiKeyHeaders(key string) http.Header {
	h := http.Header{}
	h.Set("x-api-key", key)
	h.Set("anthropic-version", "2023-06-01")
	h.Set("content-type", "application/json")
	return h
}

func oauthHeaders(tok string) http.Header {
	h := http.Header{}
	h.Set("Authorization", "Bearer "+tok)
	h.Set("anthropic-beta", "claude-code-20250219, oauth-2025-04-20")
	h.Set("anthropic-version", "2023-06-01")
	h.Set("content-type", "application/json")
	return h
}

func messagesBody(model string, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":1024,"stream":%t,"messages":[{"role":"user","content":"hi there"}],"metadata":{"user_id":"u1"}}`, model, stream)
}

// send makes a request; the response body is read by the caller.
func (b *bundle) send(t *testing.T, method, path string, h http.Header, body string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, b.ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if h != nil {
		req.Header = h
	}
	return b.ts.Client().Do(req)
}

// call makes a request that must get a complete response, and returns it
// with its body.
func (b *bundle) call(t *testing.T, method, path string, h http.Header, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := b.send(t, method, path, h, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp, data
}

func decode[T any](t *testing.T, data []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("decode %T from %s: %v", v, data, err)
	}
	return v
}

func bodyHash(body string) string {
	sum := sha256.Sum256([]byte(body))
	return hex.EncodeToString(sum[:])
}

// wantError checks an error response: status, the real error body shape,
// and that the body's request_id is the header's.
func wantError(t *testing.T, resp *http.Response, data []byte, status int, errType, message string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d; body %s", resp.StatusCode, status, data)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	got := decode[apiError](t, data)
	want := apiError{Type: "error", Error: apiErrorDetail{Type: errType, Message: message}, RequestID: resp.Header.Get("request-id")}
	if message == "" {
		want.Error.Message = got.Error.Message
	}
	if got != want {
		t.Errorf("error body %+v, want %+v", got, want)
	}
	if !strings.HasPrefix(got.RequestID, "req_") {
		t.Errorf("request_id %q", got.RequestID)
	}
}

type sseEvent struct {
	name string
	data string
}

// readEvents parses a stream strictly as "event: NAME\ndata: JSON\n\n"
// blocks. It returns the events read before any error.
func readEvents(r io.Reader) ([]sseEvent, error) {
	var events []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.name == "" || cur.data == "" {
				return events, fmt.Errorf("incomplete event %+v", cur)
			}
			if !json.Valid([]byte(cur.data)) {
				return events, fmt.Errorf("event %s: data is not JSON: %s", cur.name, cur.data)
			}
			events = append(events, cur)
			cur = sseEvent{}
		case strings.HasPrefix(line, "event: ") && cur.name == "":
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && cur.name != "" && cur.data == "":
			cur.data = strings.TrimPrefix(line, "data: ")
		default:
			return events, fmt.Errorf("unexpected line %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		return events, err
	}
	if cur != (sseEvent{}) {
		return events, fmt.Errorf("unterminated event %+v", cur)
	}
	return events, nil
}

func eventNames(events []sseEvent) []string {
	names := make([]string, len(events))
	for i, e := range events {
		names[i] = e.name
	}
	return names
}

// streamNames is the event order of a complete reply with n deltas.
func streamNames(n int) []string {
	names := []string{"message_start", "content_block_start", "ping"}
	for range n {
		names = append(names, "content_block_delta")
	}
	return append(names, "content_block_stop", "message_delta", "message_stop")
}
