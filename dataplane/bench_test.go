package dataplane

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Benchmarks of the data plane's per-request and per-event pure functions:
// evidence parsing, stream signals, the SSE scanner and the session key.
// Results and method: docs/benchmarks.md.

// benchCapture reads a capture's headers and body for a benchmark.
func benchCapture(b *testing.B, file string) (http.Header, []byte) {
	b.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "captures", file))
	if err != nil {
		b.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.Fatal(err)
	}
	return resp.Header, body
}

func BenchmarkClassify(b *testing.B) {
	for _, tc := range []struct {
		name      string
		status    int
		errorType string
	}{
		{"429", 429, ""},
		{"200_stream_error", 200, "overloaded_error"},
		{"502", 502, ""},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				classify(tc.status, tc.errorType)
			}
		})
	}
}

func BenchmarkErrorTypeOf(b *testing.B) {
	_, body := benchCapture(b, "429-weekly-rejected.txt")
	if got := errorTypeOf(body); got != "rate_limit_error" {
		b.Fatalf("errorTypeOf = %q", got)
	}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		errorTypeOf(body)
	}
}

// BenchmarkDecisionHeaders runs on the full header set of a production
// 429 (unified claims plus Cloudflare's and the CDN's headers).
func BenchmarkDecisionHeaders(b *testing.B) {
	h, _ := benchCapture(b, "429-weekly-rejected.txt")
	if got := decisionHeaders(h); len(got) != 19 {
		b.Fatalf("decisionHeaders kept %d headers, want 19", len(got))
	}
	for b.Loop() {
		decisionHeaders(h)
	}
}

func BenchmarkOpenAIErrorEvidence(b *testing.B) {
	codex := codexHeaders("100", openAINow.Unix()+36800, "64", openAINow.Unix()+400000)
	for _, tc := range []struct {
		name   string
		status int
		h      http.Header
		body   string
	}{
		{"codex_usage_limit_reached", 429, codex, codexUsageLimitBody},
		{"google_resource_exhausted", 429, http.Header{"Content-Type": {"application/json"}}, googleQuotaArrayBody},
	} {
		b.Run(tc.name, func(b *testing.B) {
			body := []byte(tc.body)
			if f := openAIErrorEvidence(tc.status, tc.h, body, openAINow); f.quota == nil {
				b.Fatalf("no quota evidence read from %s", tc.name)
			}
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				openAIErrorEvidence(tc.status, tc.h, body, openAINow)
			}
		})
	}
}

// Realistic streams: 64 text deltas framed the way each upstream frames
// them.
const streamDeltas = 64

func anthropicStream() []byte {
	var s strings.Builder
	ev := func(name, data string) { fmt.Fprintf(&s, "event: %s\ndata: %s\n\n", name, data) }
	ev("message_start", `{"type":"message_start","message":{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5-20250929","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":2095,"cache_creation_input_tokens":0,"cache_read_input_tokens":18432,"output_tokens":1,"service_tier":"standard"}}}`)
	ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
	ev("ping", `{"type": "ping"}`)
	for i := range streamDeltas {
		ev("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"token %02d of the answer, "}}`, i))
	}
	ev("content_block_stop", `{"type":"content_block_stop","index":0}`)
	ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":503}}`)
	ev("message_stop", `{"type":"message_stop"}`)
	return []byte(s.String())
}

func responsesStream() []byte {
	var s strings.Builder
	seq := 0
	ev := func(name, data string) {
		fmt.Fprintf(&s, "event: %s\ndata: %s\n\n", name, strings.Replace(data, "SEQ", fmt.Sprint(seq), 1))
		seq++
	}
	ev("response.created", `{"type":"response.created","sequence_number":SEQ,"response":{"id":"resp_1","object":"response","created_at":1785700000,"status":"in_progress","model":"gpt-5-codex","output":[],"usage":null}}`)
	ev("response.in_progress", `{"type":"response.in_progress","sequence_number":SEQ,"response":{"id":"resp_1","object":"response","created_at":1785700000,"status":"in_progress","model":"gpt-5-codex","output":[],"usage":null}}`)
	ev("response.output_item.added", `{"type":"response.output_item.added","sequence_number":SEQ,"output_index":0,"item":{"id":"msg_1","type":"message","status":"in_progress","role":"assistant","content":[]}}`)
	ev("response.content_part.added", `{"type":"response.content_part.added","sequence_number":SEQ,"item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}`)
	for i := range streamDeltas {
		ev("response.output_text.delta", fmt.Sprintf(`{"type":"response.output_text.delta","sequence_number":SEQ,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"token %02d of the answer, "}`, i))
	}
	ev("response.output_text.done", `{"type":"response.output_text.done","sequence_number":SEQ,"item_id":"msg_1","output_index":0,"content_index":0,"text":"the whole answer"}`)
	ev("response.content_part.done", `{"type":"response.content_part.done","sequence_number":SEQ,"item_id":"msg_1","output_index":0,"content_index":0,"part":{"type":"output_text","text":"the whole answer","annotations":[]}}`)
	ev("response.output_item.done", `{"type":"response.output_item.done","sequence_number":SEQ,"output_index":0,"item":{"id":"msg_1","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"the whole answer","annotations":[]}]}}`)
	ev("response.completed", strings.Replace(responsesCompleted, `"sequence_number":7`, `"sequence_number":SEQ`, 1))
	return []byte(s.String())
}

// scanEvents splits a stream into its events (outside the timed loop).
func scanEvents(b *testing.B, stream []byte) []sseEvent {
	b.Helper()
	evs, err := scanAll(b, bytes.NewReader(stream))
	if err != io.EOF {
		b.Fatal(err)
	}
	return evs
}

// eventNamed is the first event of evs with that name.
func eventNamed(b *testing.B, evs []sseEvent, name string) sseEvent {
	b.Helper()
	for _, ev := range evs {
		if ev.name == name {
			return ev
		}
	}
	b.Fatalf("no %s event", name)
	return sseEvent{}
}

// BenchmarkAnthropicSignal is one event's signal, per event type.
func BenchmarkAnthropicSignal(b *testing.B) {
	evs := scanEvents(b, anthropicStream())
	errEv := sseEvent{name: "error", data: []byte(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)}
	for _, ev := range []sseEvent{
		eventNamed(b, evs, "message_start"), eventNamed(b, evs, "ping"), eventNamed(b, evs, "content_block_delta"),
		eventNamed(b, evs, "message_delta"), eventNamed(b, evs, "message_stop"), errEv,
	} {
		b.Run(ev.name, func(b *testing.B) {
			for b.Loop() {
				anthropicSignal(ev)
			}
		})
	}
}

// BenchmarkResponsesSignal is one event's signal, per event type.
func BenchmarkResponsesSignal(b *testing.B) {
	evs := scanEvents(b, responsesStream())
	unnamed := eventNamed(b, evs, "response.output_text.delta")
	unnamed.name = "message" // a data-only event, named by its type
	for _, tc := range []struct {
		name string
		ev   sseEvent
	}{
		{"created", eventNamed(b, evs, "response.created")},
		{"output_text.delta", eventNamed(b, evs, "response.output_text.delta")},
		{"output_text.delta_unnamed", unnamed},
		{"completed", eventNamed(b, evs, "response.completed")},
		{"failed", sseEvent{name: "response.failed", data: []byte(atCapacityFailed)}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				responsesSignal(tc.ev)
			}
		})
	}
}

// BenchmarkSSEScan splits a whole stream into events (bytes/op is the
// stream's size); the _signal variants also read every event's signal, as
// relayStream does.
func BenchmarkSSEScan(b *testing.B) {
	for _, tc := range []struct {
		name   string
		stream []byte
		signal func(sseEvent) streamSignal
	}{
		{"anthropic_64_deltas", anthropicStream(), anthropicSignal},
		{"responses_64_deltas", responsesStream(), responsesSignal},
	} {
		if n := len(scanEvents(b, tc.stream)); n < streamDeltas {
			b.Fatalf("%s: %d events", tc.name, n)
		}
		for _, withSignal := range []bool{false, true} {
			name := tc.name
			if withSignal {
				name += "_signal"
			}
			b.Run(name, func(b *testing.B) {
				r := bytes.NewReader(tc.stream)
				b.SetBytes(int64(len(tc.stream)))
				for b.Loop() {
					r.Reset(tc.stream)
					s := newSSEScanner(r)
					for {
						ev, err := s.next()
						if err != nil {
							if err != io.EOF {
								b.Fatal(err)
							}
							break
						}
						if withSignal {
							tc.signal(ev)
						}
					}
				}
			})
		}
	}
}

func BenchmarkSessionKey(b *testing.B) {
	for _, tc := range []struct {
		name   string
		sf     surface
		header [2]string
		userID string
		pcKey  string
	}{
		{name: "messages_header", sf: surfaceMessages, header: [2]string{"X-Claude-Code-Session-Id", "3f0b9a4e-6c2d-4b8a-9e1f-7d5c3a2b1e0f"}},
		{name: "messages_user_id", sf: surfaceMessages, userID: "user_8c1f2e3d4b5a69788796a5b4c3d2e1f0_account__session_3f0b9a4e-6c2d-4b8a-9e1f-7d5c3a2b1e0f"},
		{name: "responses_header", sf: surfaceResp, header: [2]string{"Session_id", "0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"}},
		{name: "responses_long_key_hashed", sf: surfaceResp, pcKey: strings.Repeat("k", 300)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r := httptest.NewRequest(http.MethodPost, "/v1/messages", nil)
			if tc.header[0] != "" {
				r.Header.Set(tc.header[0], tc.header[1])
			}
			if k := sessionKey(r, tc.sf, tc.userID, tc.pcKey); k == "" || len(k) > 256 {
				b.Fatalf("sessionKey = %q", k)
			}
			for b.Loop() {
				sessionKey(r, tc.sf, tc.userID, tc.pcKey)
			}
		})
	}
}
