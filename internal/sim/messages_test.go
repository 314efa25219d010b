package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestMessageNonStream(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	body := messagesBody(sonnet, false)
	resp, data := b.call(t, "POST", "/v1/messages?beta=true", apiKeyHeaders(keyA), body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	if id := resp.Header.Get("request-id"); !strings.HasPrefix(id, "req_") {
		t.Errorf("request-id %q", id)
	}

	// Exact field set and order of the real body.
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("body lacks %q: %s", k, data)
		}
	}
	if string(raw["stop_sequence"]) != "null" {
		t.Errorf("stop_sequence %s, want null", raw["stop_sequence"])
	}
	m := decode[message](t, data)
	wantTokens := len(body) / 4
	if !strings.HasPrefix(m.ID, "msg_") || m.Type != "message" || m.Role != "assistant" || m.Model != sonnet ||
		m.StopReason == nil || *m.StopReason != "end_turn" {
		t.Errorf("message %+v", m)
	}
	if len(m.Content) != 1 || m.Content[0] != (contentBlock{Type: "text", Text: replyText}) {
		t.Errorf("content %+v", m.Content)
	}
	if m.Usage != (usage{InputTokens: wantTokens, OutputTokens: len(replyText) / 4}) {
		t.Errorf("usage %+v, want input %d", m.Usage, wantTokens)
	}
	if strings.Contains(string(data), "key-a") {
		t.Errorf("reply leaks the account name: %s", data)
	}

	// API keys get the per-key limit headers, with RFC 3339 resets.
	for _, name := range []string{"requests", "tokens", "input-tokens", "output-tokens"} {
		p := "anthropic-ratelimit-" + name
		if _, err := strconv.Atoi(resp.Header.Get(p + "-limit")); err != nil {
			t.Errorf("%s-limit: %v", p, err)
		}
		if _, err := strconv.Atoi(resp.Header.Get(p + "-remaining")); err != nil {
			t.Errorf("%s-remaining: %v", p, err)
		}
		if _, err := time.Parse(time.RFC3339, resp.Header.Get(p+"-reset")); err != nil {
			t.Errorf("%s-reset: %v", p, err)
		}
	}
	if got := resp.Header.Get("anthropic-ratelimit-unified-status"); got != "" {
		t.Errorf("API key got unified status %q", got)
	}

	a := b.nextAttempt(t)
	want := Attempt{Time: testNow, Account: "key-a", Model: sonnet, Path: "/v1/messages", BodySHA256: bodyHash(body), Outcome: "ok", Status: 200}
	if a != want {
		t.Errorf("attempt %+v, want %+v", a, want)
	}
}

func TestMessageStream(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	body := messagesBody(sonnet, true)
	resp, data := b.call(t, "POST", "/v1/messages?beta=true", oauthHeaders(tokO), body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-cache" {
		t.Errorf("Cache-Control %q", cc)
	}
	events, err := readEvents(strings.NewReader(string(data)))
	if err != nil {
		t.Fatalf("parse stream: %v\n%s", err, data)
	}
	if got, want := eventNames(events), streamNames(8); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}

	var start messageStartEvent
	if err := json.Unmarshal([]byte(events[0].data), &start); err != nil {
		t.Fatal(err)
	}
	inputTokens := len(body) / 4
	if start.Type != "message_start" || start.Message.Model != sonnet || len(start.Message.Content) != 0 ||
		start.Message.StopReason != nil || start.Message.Usage != (usage{InputTokens: inputTokens, OutputTokens: 1}) {
		t.Errorf("message_start %s", events[0].data)
	}
	if !strings.Contains(events[0].data, `"content":[]`) {
		t.Errorf("message_start content is not an empty list: %s", events[0].data)
	}
	if events[1].data != `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}` {
		t.Errorf("content_block_start %s", events[1].data)
	}
	if events[2].data != `{"type":"ping"}` {
		t.Errorf("ping %s", events[2].data)
	}
	var text strings.Builder
	for _, e := range events[3:11] {
		var d contentBlockDeltaEvent
		if err := json.Unmarshal([]byte(e.data), &d); err != nil {
			t.Fatal(err)
		}
		if d.Type != "content_block_delta" || d.Index != 0 || d.Delta.Type != "text_delta" || d.Delta.Text == "" {
			t.Errorf("delta %s", e.data)
		}
		text.WriteString(d.Delta.Text)
	}
	if text.String() != replyText {
		t.Errorf("streamed text %q, want %q", text.String(), replyText)
	}
	if events[11].data != `{"type":"content_block_stop","index":0}` {
		t.Errorf("content_block_stop %s", events[11].data)
	}
	wantDelta := `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":` +
		strconv.Itoa(len(replyText)/4) + `}}`
	if events[12].data != wantDelta {
		t.Errorf("message_delta %s, want %s", events[12].data, wantDelta)
	}
	if events[13].data != `{"type":"message_stop"}` {
		t.Errorf("message_stop %s", events[13].data)
	}

	// The streamed usage matches the non-streamed reply of the same body.
	_, data = b.call(t, "POST", "/v1/messages", oauthHeaders(tokO), messagesBody(sonnet, false))
	m := decode[message](t, data)
	if m.Usage.InputTokens != inputTokens || m.Usage.OutputTokens != len(replyText)/4 {
		t.Errorf("non-stream usage %+v", m.Usage)
	}
}

func TestUnifiedAllowedHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	resp, data := b.call(t, "POST", "/v1/messages", oauthHeaders(tokO), messagesBody(sonnet, false))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	fiveReset := strconv.FormatInt(time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC).Unix(), 10)
	sevenReset := strconv.FormatInt(time.Date(2026, 3, 7, 10, 0, 0, 0, time.UTC).Unix(), 10)
	want := map[string]string{
		"status":               "allowed_warning", // the weekly window is at 0.85
		"representative-claim": "seven_day",
		"reset":                sevenReset,
		"5h-status":            "allowed",
		"5h-utilization":       "0.3",
		"5h-reset":             fiveReset,
		"7d-status":            "allowed_warning",
		"7d-utilization":       "0.85",
		"7d-reset":             sevenReset,
		"fallback-percentage":  "0.5",
	}
	for k, v := range want {
		if got := resp.Header.Get("anthropic-ratelimit-unified-" + k); got != v {
			t.Errorf("unified-%s = %q, want %q", k, got, v)
		}
	}
	if got := resp.Header.Get("anthropic-ratelimit-requests-limit"); got != "" {
		t.Errorf("OAuth account got API-key limit headers")
	}
}

func TestCountTokensAndModels(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	body := messagesBody(sonnet, false)
	resp, data := b.call(t, "POST", "/v1/messages/count_tokens?beta=true", apiKeyHeaders(keyA), body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("count_tokens status %d: %s", resp.StatusCode, data)
	}
	if got := decode[map[string]int](t, data); len(got) != 1 || got["input_tokens"] != len(body)/4 {
		t.Errorf("count_tokens %s", data)
	}

	resp, data = b.call(t, "GET", "/v1/models", oauthHeaders(tokO), "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("models status %d: %s", resp.StatusCode, data)
	}
	list := decode[modelList](t, data)
	ids := []string{}
	for _, m := range list.Data {
		if m.Type != "model" || m.DisplayName == "" {
			t.Errorf("model %+v", m)
		}
		if _, err := time.Parse(time.RFC3339, m.CreatedAt); err != nil {
			t.Errorf("created_at: %v", err)
		}
		ids = append(ids, m.ID)
	}
	for _, id := range []string{"claude-sonnet-4-5-20250929", "claude-opus-4-1-20250805", "claude-haiku-4-5-20251001"} {
		if !slices.Contains(ids, id) {
			t.Errorf("models lack %s", id)
		}
	}
	if list.HasMore || list.FirstID != ids[0] || list.LastID != ids[len(ids)-1] {
		t.Errorf("list %+v", list)
	}

	resp, data = b.call(t, "GET", "/v1/models", nil, "")
	wantError(t, resp, data, http.StatusUnauthorized, "authentication_error", "x-api-key header is required")
}

func TestRequestValidation(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	noVersion := apiKeyHeaders(keyA)
	noVersion.Del("anthropic-version")
	tests := []struct {
		name    string
		path    string
		h       http.Header
		body    string
		status  int
		errType string
		message string
	}{
		{"missing version", "/v1/messages", noVersion, messagesBody(sonnet, false), 400, "invalid_request_error", "anthropic-version: header is required"},
		{"not JSON", "/v1/messages", nil, `{"model":`, 400, "invalid_request_error", ""},
		{"not an object", "/v1/messages", nil, `[1,2]`, 400, "invalid_request_error", "The request body must be a JSON object."},
		{"no model", "/v1/messages", nil, `{"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "model: Field required"},
		{"model not a string", "/v1/messages", nil, `{"model":3,"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "model: Input should be a valid string"},
		{"no messages", "/v1/messages", nil, `{"model":"m"}`, 400, "invalid_request_error", "messages: Field required"},
		{"messages not a list", "/v1/messages", nil, `{"model":"m","messages":"hi"}`, 400, "invalid_request_error", "messages: Input should be a valid list"},
		{"empty messages", "/v1/messages", nil, `{"model":"m","messages":[]}`, 400, "invalid_request_error", "messages: at least one message is required"},
		{"stream not a bool", "/v1/messages", nil, `{"model":"m","messages":[{}],"stream":"yes"}`, 400, "invalid_request_error", "stream: Input should be a valid boolean"},
		{"count_tokens no model", "/v1/messages/count_tokens", nil, `{"messages":[{}]}`, 400, "invalid_request_error", "model: Field required"},
		{"unknown path", "/v1/complete", nil, `{}`, 404, "not_found_error", "Not Found"},
		{"wrong method", "/v1/messages", nil, ``, 404, "not_found_error", "Not Found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.h
			if h == nil {
				h = apiKeyHeaders(keyA)
			}
			method := "POST"
			if tt.name == "wrong method" {
				method = "GET"
			}
			resp, data := b.call(t, method, tt.path, h, tt.body)
			wantError(t, resp, data, tt.status, tt.errType, tt.message)
		})
	}
}

// TestDeltaDelay runs a stream in a synctest bubble: the deltas are paced
// by DeltaDelay on a timer, and the stream stops when the request ends.
func TestDeltaDelay(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{Script: testScript(), DeltaDelay: time.Second, Deltas: 8})
		serve := func(ctx context.Context) []sseEvent {
			req := httptest.NewRequestWithContext(ctx, "POST", "/v1/messages", strings.NewReader(messagesBody(sonnet, true)))
			req.Header = apiKeyHeaders(keyA)
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			events, err := readEvents(rec.Body)
			if err != nil {
				t.Fatal(err)
			}
			return events
		}

		start := time.Now()
		events := serve(t.Context())
		if got := time.Since(start); got != 7*time.Second {
			t.Errorf("8 deltas took %v, want 7 pauses of 1s", got)
		}
		if !slices.Equal(eventNames(events), streamNames(8)) {
			t.Errorf("events %v", eventNames(events))
		}

		ctx, cancel := context.WithTimeout(t.Context(), 2500*time.Millisecond)
		defer cancel()
		events = serve(ctx)
		if got, want := eventNames(events), streamNames(3)[:6]; !slices.Equal(got, want) {
			t.Errorf("cancelled stream sent %v, want %v", got, want)
		}
	})
}

func TestNewReply(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 8, 43, 44, 100} {
		r := newReply(n)
		if len(r.chunks) != n || strings.Join(r.chunks, "") != r.text {
			t.Errorf("newReply(%d): %d chunks %q of %q", n, len(r.chunks), r.chunks, r.text)
		}
		for i, c := range r.chunks {
			if c == "" {
				t.Errorf("newReply(%d): chunk %d is empty", n, i)
			}
		}
	}
}

// TestStreamFlushesEachEvent reads the first delta while the server is
// still pausing an hour before the second: each event must be flushed as
// it is written, and the stream must stop when the client leaves.
func TestStreamFlushesEachEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{DeltaDelay: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", b.ts.URL+"/v1/messages", strings.NewReader(messagesBody(sonnet, true)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = apiKeyHeaders(keyA)
	resp, err := b.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	var names []string
	for !slices.Contains(names, "content_block_delta") {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("after %v: %v", names, err)
		}
		if name, ok := strings.CutPrefix(strings.TrimSpace(line), "event: "); ok {
			names = append(names, name)
		}
	}
	if want := streamNames(1)[:4]; !slices.Equal(names, want) {
		t.Errorf("events %v, want %v", names, want)
	}
	cancel()
	// Closing the server waits for the handler, which must leave its pause.
	b.ts.Close()
}

func FuzzParseMessagesRequest(f *testing.F) {
	for _, seed := range []string{
		messagesBody(sonnet, true), `{}`, `[]`, `null`, `{"model":"m","messages":[{}],"stream":null}`, `{"model":1}`, "\x00",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, problem := parseMessagesRequest(body)
		if problem == "" && (req.Model == "" || !json.Valid(body)) {
			t.Errorf("accepted %q as %+v", body, req)
		}
	})
}
