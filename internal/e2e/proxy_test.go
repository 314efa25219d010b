package e2e

import (
	"time"

	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/sim"
)

func TestNonStreamSuccess(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "api-1"}}})
	r := e.post(false)
	if r.status != http.StatusOK {
		t.Fatalf("status = %d: %s", r.status, r.body)
	}
	up := e.upstream.only(t)
	if !bytes.Equal(r.body, up.body) {
		t.Errorf("body relayed changed:\n got %s\nwant %s", r.body, up.body)
	}
	var msg struct {
		Type, Role, Model string
		Content           []struct{ Type, Text string }
	}
	if err := json.Unmarshal(r.body, &msg); err != nil || msg.Type != "message" || msg.Model != model || len(msg.Content) != 1 || msg.Content[0].Text == "" {
		t.Errorf("not a message: %s (%v)", r.body, err)
	}
	if got, want := r.header.Get("Request-Id"), up.header.Get("Request-Id"); got == "" || got != want {
		t.Errorf("Request-Id = %q, upstream sent %q", got, want)
	}
	n := 0
	for k, v := range up.header {
		if strings.HasPrefix(k, "Anthropic-Ratelimit-") {
			n++
			if !slices.Equal(r.header[k], v) {
				t.Errorf("%s = %q, upstream sent %q", k, r.header[k], v)
			}
		}
	}
	if n == 0 {
		t.Error("the simulator sent no rate-limit headers to compare")
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}

	ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
	in, out := usageOf(t, up.body, false)
	if in == 0 || out == 0 {
		t.Fatalf("simulator usage %d/%d", in, out)
	}
	if ev.InputTokens != in || ev.OutputTokens != out {
		t.Errorf("route event usage %d/%d, upstream said %d/%d", ev.InputTokens, ev.OutputTokens, in, out)
	}
	if ev.Status != 200 || ev.Attempts != 1 || ev.AccountId != e.ids["api-1"] || ev.KeyId != e.keyID ||
		ev.Model != model || ev.Stream || ev.Surface != "messages" || ev.ErrorType != "" {
		t.Errorf("route event = %v", ev)
	}
	e.leasesReleased()
}

func TestStreamSuccess(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "api-1"}}})
	r := e.post(true)
	if r.status != http.StatusOK {
		t.Fatalf("status = %d: %s", r.status, r.body)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Errorf("Content-Type = %q", ct)
	}
	up := e.upstream.only(t)
	if !bytes.Equal(r.body, up.body) {
		t.Errorf("client stream differs from the simulator's:\n got %q\nwant %q", r.body, up.body)
	}
	var names []string
	for _, ev := range sseEvents(t, r.body) {
		names = append(names, ev[0])
	}
	want := []string{"message_start", "content_block_start", "ping"}
	for range 8 {
		want = append(want, "content_block_delta")
	}
	want = append(want, "content_block_stop", "message_delta", "message_stop")
	if !slices.Equal(names, want) {
		t.Errorf("events = %v, want %v", names, want)
	}
	if got := r.header.Get("Request-Id"); got == "" || got != up.header.Get("Request-Id") {
		t.Errorf("Request-Id = %q", got)
	}
	ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
	in, out := usageOf(t, up.body, true)
	if ev.InputTokens != in || ev.OutputTokens != out || in == 0 || out <= 1 {
		t.Errorf("route event usage %d/%d, upstream said %d/%d", ev.InputTokens, ev.OutputTokens, in, out)
	}
	if !ev.Stream || ev.Status != 200 || ev.Attempts != 1 || ev.TimeToFirstByte == nil {
		t.Errorf("route event = %v", ev)
	}
	e.leasesReleased()
}

// TestUpstreamSeesAccountCredential: the upstream gets the leased account's
// credential, in that account's scheme, and never the client's weir key.
func TestUpstreamSeesAccountCredential(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{
		{label: "max-1", oauth: true, priority: 10},
		{label: "api-1"},
	}})
	noClientKey := func(h http.Header) {
		t.Helper()
		for k, vs := range h {
			for _, v := range vs {
				if strings.Contains(v, e.key) {
					t.Errorf("upstream header %s carries the client's weir key", k)
				}
			}
		}
	}

	// OAuth, with the client's own betas and its key as a bearer.
	r := e.do(http.MethodPost, "/v1/messages", messagesBody(false), func(req *http.Request) {
		req.Header.Del("X-Api-Key")
		req.Header.Set("Authorization", "Bearer "+e.key)
		req.Header.Set("Anthropic-Beta", "claude-code-20250219,interleaved-thinking-2025-05-14")
	})
	if r.status != http.StatusOK {
		t.Fatalf("oauth request: status %d: %s", r.status, r.body)
	}
	xs := e.upstream.exchanges()
	if len(xs) != 1 {
		t.Fatalf("upstream saw %d requests", len(xs))
	}
	h := xs[0].reqHeader
	if got := h.Values("Authorization"); !slices.Equal(got, []string{"Bearer " + e.creds["max-1"]}) {
		t.Errorf("Authorization = %q, want the account's token", got)
	}
	if _, ok := h["X-Api-Key"]; ok {
		t.Error("x-api-key sent on an OAuth account")
	}
	if got := h.Values("Anthropic-Beta"); !slices.Equal(got, []string{"claude-code-20250219,interleaved-thinking-2025-05-14,oauth-2025-04-20"}) {
		t.Errorf("Anthropic-Beta = %q", got)
	}
	noClientKey(h)
	if ev := e.routeEvent(r.header.Get("Weir-Request-Id")); ev.AccountId != e.ids["max-1"] {
		t.Errorf("route event account %s, want max-1", e.labels[ev.AccountId])
	}
	// The subscription's own unified headers never reach the client: the
	// pool's are written instead, and this pool has no reading yet.
	if got := r.header.Get("Anthropic-Ratelimit-Unified-Status"); got != "" {
		t.Errorf("unified status %q reached the client with no pool reading", got)
	}

	// API key: the OAuth account is paused, so api-1 serves.
	e.change(func() {
		if _, err := e.accounts.PauseAccount(t.Context(), connect.NewRequest(&weirv1.PauseAccountRequest{Id: "max-1"})); err != nil {
			t.Fatal(err)
		}
	})
	// Without anthropic-version: weir sends the default the API requires.
	r = e.do(http.MethodPost, "/v1/messages", messagesBody(false), func(req *http.Request) { req.Header.Del("Anthropic-Version") })
	if r.status != http.StatusOK {
		t.Fatalf("api-key request: status %d: %s", r.status, r.body)
	}
	xs = e.upstream.exchanges()
	h = xs[len(xs)-1].reqHeader
	if got := h.Get("Anthropic-Version"); got != "2023-06-01" {
		t.Errorf("anthropic-version = %q, want the default", got)
	}
	if got := h.Values("X-Api-Key"); !slices.Equal(got, []string{e.creds["api-1"]}) {
		t.Errorf("x-api-key = %q, want the account's key", got)
	}
	if _, ok := h["Authorization"]; ok {
		t.Error("Authorization sent on an API-key account")
	}
	noClientKey(h)

	// The simulator accepts unknown credentials as "key-…" accounts: had
	// the client's key gone upstream, it would show here.
	if got, want := e.attempts(), []string{"max-1:ok:200", "api-1:ok:200"}; !slices.Equal(got, want) {
		t.Errorf("simulator attempts = %v, want %v", got, want)
	}
	e.leasesReleased()
}

// TestClaudeCodeSessionAffinity: consecutive requests of one Claude Code
// session stay on one account while another is free.
func TestClaudeCodeSessionAffinity(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "api-a"}, {label: "api-b"}}})
	session := func(id string) func(*http.Request) {
		return func(r *http.Request) {
			r.Header.Set("X-Claude-Code-Session-Id", id)
			r.Header.Set("X-App", "cli")
			r.Header.Set("User-Agent", "claude-cli/2.1.33 (external, cli)")
		}
	}
	for i := range 4 {
		r := e.do(http.MethodPost, "/v1/messages?beta=true", messagesBody(i%2 == 1), session("session-1"))
		if r.status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, r.status, r.body)
		}
	}
	att := e.sim.Attempts()
	if len(att) != 4 {
		t.Fatalf("attempts = %v", e.attempts())
	}
	bound := att[0].Account
	for i, a := range att {
		if a.Account != bound || a.Outcome != "ok" {
			t.Errorf("request %d served by %s/%s, want %s: the session moved", i, a.Account, a.Outcome, bound)
		}
	}
	for i, x := range e.upstream.exchanges() {
		if x.rawQuery != "beta=true" || x.reqHeader.Get("X-Claude-Code-Session-Id") != "session-1" {
			t.Errorf("request %d: upstream got query %q session %q", i, x.rawQuery, x.reqHeader.Get("X-Claude-Code-Session-Id"))
		}
	}

	// Without the session, least-recently-used routing picks the other
	// account: it was free all along, so the session's stickiness was
	// affinity, not a lack of choice.
	if r := e.post(false); r.status != http.StatusOK {
		t.Fatalf("status %d", r.status)
	}
	att = e.sim.Attempts()
	if other := att[len(att)-1].Account; other == bound || (other != "api-a" && other != "api-b") {
		t.Errorf("a request without a session went to %s; want the account other than %s", other, bound)
	}
	e.leasesReleased()
}

func TestCountTokensAndModelsProxied(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "api-1"}}})

	r := e.do(http.MethodPost, "/v1/messages/count_tokens", `{"model":"`+model+`","messages":[{"role":"user","content":"Count me."}]}`, nil)
	if r.status != http.StatusOK {
		t.Fatalf("count_tokens: status %d: %s", r.status, r.body)
	}
	xs := e.upstream.exchanges()
	if len(xs) != 1 || xs[0].path != "/v1/messages/count_tokens" || !bytes.Equal(r.body, xs[0].body) {
		t.Fatalf("count_tokens: got %s, upstream exchanges %d", r.body, len(xs))
	}
	var count struct {
		InputTokens int `json:"input_tokens"`
	}
	if err := json.Unmarshal(r.body, &count); err != nil || count.InputTokens <= 0 {
		t.Errorf("count_tokens body %s", r.body)
	}

	r = e.do(http.MethodGet, "/v1/models", "", nil)
	if r.status != http.StatusOK {
		t.Fatalf("models: status %d: %s", r.status, r.body)
	}
	xs = e.upstream.exchanges()
	if len(xs) != 2 || xs[1].path != "/v1/models" || xs[1].method != http.MethodGet || !bytes.Equal(r.body, xs[1].body) {
		t.Fatalf("models: got %s", r.body)
	}
	var list struct {
		Data []struct{ ID string } `json:"data"`
	}
	if err := json.Unmarshal(r.body, &list); err != nil || len(list.Data) == 0 {
		t.Errorf("models body %s", r.body)
	}
	if got := e.attempts(); !slices.Equal(got, []string{"api-1:ok:200", "api-1:ok:200"}) {
		t.Errorf("attempts = %v", got)
	}
	ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
	if ev.Surface != "models" || ev.Status != 200 || ev.AccountId != e.ids["api-1"] {
		t.Errorf("route event = %v", ev)
	}
	e.leasesReleased()
}

// TestLeaseReleasedAfterEachRequest: whatever happened, no lease stays in
// flight once the client has its answer.
func TestLeaseReleasedAfterEachRequest(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "api-a", priority: 10}, {label: "api-b"}}})
	steps := []struct {
		name   string
		fault  string // on api-a, the preferred account
		stream bool
		status int
	}{
		{name: "non-stream", status: 200},
		{name: "stream", stream: true, status: 200},
		{name: "client error", fault: sim.FaultBadRequest, status: 400},
		{name: "stream cut after output", fault: sim.FaultDropMidStream, stream: true, status: 200},
		// Without a hold budget there is no same-account retry: api-b.
		{name: "error event before output", fault: sim.FaultOverloadedEvent, stream: true, status: 200},
		// api-a answered overloaded a moment ago: api-b, which answers,
		// goes first, and api-a's fault is still queued.
		{name: "overloaded a moment ago", fault: sim.FaultOverloaded, status: 200},
	}
	for _, s := range steps {
		if s.fault != "" {
			if err := e.sim.AddFaults("api-a", sim.Fault{Kind: s.fault}); err != nil {
				t.Fatal(err)
			}
		}
		r := e.post(s.stream)
		if r.status != s.status {
			t.Fatalf("%s: status %d, want %d: %s", s.name, r.status, s.status, r.body)
		}
		e.leasesReleased()
	}
	if n := len(e.sim.Attempts()); n != 7 {
		t.Errorf("simulator saw %d attempts, want 7: %v", n, e.attempts())
	}
}

// TestLongStreamKeepsItsLease: a stream that outlives the lease TTL keeps
// its account's slot, renewed by the worker's one keeper (one RenewBatch
// per period for every lease it holds), and frees it when it ends.
func TestLongStreamKeepsItsLease(t *testing.T) {
	t.Parallel()
	const ttl = 1500 * time.Millisecond
	e := setup(t, options{leaseTTL: ttl, deltaDelay: 700 * time.Millisecond, accounts: []account{{label: "only", maxConc: 1}}})
	done := make(chan response, 1)
	start := time.Now()
	go func() { done <- e.post(true) }()
	eventually(t, "the stream to hold the account", func() bool { return e.account("only").InFlight == 1 })
	// Past twice the TTL the stream is still running, and still holds the
	// account: only a renewal can have kept its lease alive.
	for time.Since(start) < 2*ttl {
		select {
		case r := <-done:
			t.Fatalf("the stream ended after %v, before twice the TTL: %d", time.Since(start), r.status)
		default:
		}
		if n := e.account("only").InFlight; n != 1 {
			t.Fatalf("in flight %d at %v into a live stream, want 1 (the lease lapsed)", n, time.Since(start))
		}
	}
	if r := <-done; r.status != http.StatusOK {
		t.Fatalf("stream: %d", r.status)
	}
	e.leasesReleased()
}
