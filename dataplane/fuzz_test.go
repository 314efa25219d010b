package dataplane

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// FuzzAnthropicEvidence: whatever an upstream answers, as a body or as an
// event stream, reading it as evidence never panics, classifies it as a
// known outcome, and yields text that is valid UTF-8 (it ends up in JSON
// answers, route events and logs).
func FuzzAnthropicEvidence(f *testing.F) {
	for _, s := range []struct {
		status int
		body   string
	}{
		{529, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`},
		{429, `{"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed your account's rate limit."}}`},
		{400, `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}`},
		{200, `{"id":"msg_1","type":"message","usage":{"input_tokens":12,"output_tokens":7}}`},
		{200, evStart + evBlock + evDelta + evMDel + evStop},
		{200, evStart + evOver},
		{200, `{"id":"msg_1","type":"message","usage":{"input_tokens":12,"cache_creation_input_tokens":1536,"cache_read_input_tokens":20480,"output_tokens":311}}`},
		{200, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":-3,\"cache_read_input_tokens\":null,\"output_tokens\":5}}\n\n"},
		{500, `{"error":{"type":42}}`},
		{401, "\xff\xfe{"},
	} {
		f.Add(s.status, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		typ := errorTypeOf(body)
		if !utf8.ValidString(typ) {
			t.Errorf("error type %q is not UTF-8", typ)
		}
		if msg := errorMessageOf(body); !utf8.ValidString(msg) || strings.ContainsAny(msg, "\r\n") {
			t.Errorf("error message %q is not one line of UTF-8", msg)
		}
		if c := classify(status, typ); weirv1.OutcomeClass_name[int32(c)] == "" || c == weirv1.OutcomeClass_OUTCOME_CLASS_UNSPECIFIED {
			t.Errorf("classify(%d, %q) = %v", status, typ, c)
		}
		var u usage
		u.fromMessage(body)
		sc := newSSEScanner(bytes.NewReader(body))
		for range 10000 {
			ev, err := sc.next()
			if err != nil {
				break
			}
			sig := anthropicSignal(ev)
			if f := sig.failure; f != nil && (!utf8.ValidString(f.message) || !utf8.ValidString(f.errorType)) {
				t.Errorf("event failure %+v is not UTF-8", f)
			}
			u.fromEvent(ev)
		}
		if u.input < 0 || u.output < 0 || u.cacheRead < 0 || u.cacheCreation < 0 || u.reasoning != 0 {
			t.Errorf("token counts %+v: a negative one, or reasoning (Anthropic reports none apart)", u)
		}
	})
}

// FuzzRequestHead: whatever an agent sends as a body, reading its head
// (model, stream, session) never panics and either accepts it with a
// model or refuses it with a 400 or 413 whose message is valid UTF-8; a
// session key is never longer than 256 bytes.
func FuzzRequestHead(f *testing.F) {
	for _, s := range []string{
		`{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,"metadata":{"user_id":"user_1_account__session_abc"},"messages":[]}`,
		`{"model":"gpt-5-codex","stream":true,"prompt_cache_key":"019a-cache","input":[]}`,
		`{"model":""}`,
		`{"model":null}`,
		`{"model":1}`,
		`{"stream":"yes","model":"m"}`,
		`{"model":"m","metadata":{"user_id":` + `"` + strings.Repeat("u", 300) + `"}}`,
		`{"model":"m"`,
		"\xff\xfe",
		``,
	} {
		f.Add(true, []byte(s))
		f.Add(false, []byte(s))
	}
	s := newTestServer(f)
	s.cfg.MaxBodyBytes = 1 << 20
	f.Fuzz(func(t *testing.T, openai bool, body []byte) {
		sf := surfaceMessages
		if openai {
			sf = surfaceResp
		}
		in := &inbound{sf: sf}
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/x", io.NopCloser(bytes.NewReader(body)))
		apiErr := s.readBody(w, r, in)
		switch {
		case apiErr != nil:
			if apiErr.status != http.StatusBadRequest && apiErr.status != http.StatusRequestEntityTooLarge {
				t.Errorf("refused with %d: %q", apiErr.status, apiErr.message)
			}
			if !utf8.ValidString(apiErr.message) {
				t.Errorf("refusal message %q is not UTF-8", apiErr.message)
			}
		case in.model == "":
			t.Errorf("accepted %q without a model", body)
		case !bytes.Equal(in.body, body):
			t.Errorf("accepted body differs from what was sent")
		}
		if len(in.session) > 256 {
			t.Errorf("session key of %d bytes", len(in.session))
		}
		if in.letGo(); s.bodies.total != 0 {
			t.Errorf("%d body bytes still reserved once the request let its body go", s.bodies.total)
		}
	})
}
