package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

const (
	classSuccess  = weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS
	classClient   = weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR
	classAuth     = weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR
	classRate     = weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED
	classOverload = weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED
	classUpstream = weirv1.OutcomeClass_OUTCOME_CLASS_UPSTREAM_ERROR
)

func TestClassify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status    int
		errorType string
		want      weirv1.OutcomeClass
	}{
		{200, "", classSuccess},
		{201, "", classSuccess},
		{204, "", classSuccess},
		{299, "", classSuccess},
		// An error named inside a 2xx (an SSE error event) wins over the status.
		{200, "overloaded_error", classOverload},
		{200, "rate_limit_error", classRate},
		{200, "authentication_error", classAuth},
		{200, "invalid_request_error", classClient},
		{200, "something_new", classUpstream},
		{400, "", classClient},
		{404, "", classClient},
		{413, "", classClient},
		{422, "", classClient},
		{401, "", classAuth},
		{403, "", classAuth},
		{429, "", classRate},
		// The body's error type does not change a non-2xx status's class.
		{429, "overloaded_error", classRate},
		{500, "", classOverload},
		{502, "", weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR},
		{503, "", classOverload},
		{504, "", weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR},
		{529, "", classOverload},
		{529, "overloaded_error", classOverload},
		{100, "", classUpstream},
		{300, "", classUpstream},
		{302, "", classUpstream},
		{402, "", classUpstream},
		{405, "", classUpstream},
		{408, "", classUpstream},
		{409, "", classUpstream},
		{501, "", classUpstream},
		{520, "", classUpstream},
		{0, "", classUpstream},
	}
	for _, tt := range tests {
		if got := classify(tt.status, tt.errorType); got != tt.want {
			t.Errorf("classify(%d, %q) = %v, want %v", tt.status, tt.errorType, got, tt.want)
		}
	}
}

func TestClassifyErrorType(t *testing.T) {
	t.Parallel()
	tests := map[string]weirv1.OutcomeClass{
		"overloaded_error":      classOverload,
		"api_error":             classOverload,
		"timeout_error":         weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR,
		"rate_limit_error":      classRate,
		"authentication_error":  classAuth,
		"permission_error":      classAuth,
		"invalid_request_error": classClient,
		"not_found_error":       classClient,
		"request_too_large":     classClient,
		"billing_error":         classUpstream,
		"conflict_error":        classUpstream,
		"":                      classUpstream,
		"Overloaded_Error":      classUpstream,
	}
	for typ, want := range tests {
		if got := classifyErrorType(typ); got != want {
			t.Errorf("classifyErrorType(%q) = %v, want %v", typ, got, want)
		}
	}
}

func TestStatusForErrorType(t *testing.T) {
	t.Parallel()
	tests := map[string]int{
		"overloaded_error":      529,
		"rate_limit_error":      429,
		"authentication_error":  401,
		"permission_error":      403,
		"invalid_request_error": 400,
		"not_found_error":       404,
		"request_too_large":     413,
		"timeout_error":         504,
		"api_error":             500,
		"billing_error":         500,
		"":                      500,
	}
	for typ, want := range tests {
		if got := statusForErrorType(typ); got != want {
			t.Errorf("statusForErrorType(%q) = %d, want %d", typ, got, want)
		}
		// A status chosen for an error type must classify the same way the
		// error type does, so a replayed failure is judged consistently.
		if typ != "" && typ != "billing_error" {
			if c, s := classifyErrorType(typ), classify(statusForErrorType(typ), ""); c != s {
				t.Errorf("%q: event class %v but status %d classifies as %v", typ, c, want, s)
			}
		}
	}
}

func TestErrorTypeOf(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}`: "overloaded_error",
		`{"type":"error","error":{"type":"rate_limit_error","message":"x"}}`:                               "rate_limit_error",
		`{"type":"message"}`: "",
		`not json`:           "",
		``:                   "",
		`{"error":"string"}`: "",
	}
	for body, want := range tests {
		if got := errorTypeOf([]byte(body)); got != want {
			t.Errorf("errorTypeOf(%q) = %q, want %q", body, got, want)
		}
	}
}

func TestDecisionHeaders(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Set("Retry-After", "30")
	h.Set("Retry-After-Ms", "30000")
	h.Set("X-Should-Retry", "true")
	h.Set("Request-Id", "req_011")
	h.Set("Anthropic-Ratelimit-Unified-Status", "rejected")
	h.Set("Anthropic-Ratelimit-Unified-7d-Utilization", "0.94")
	h.Set("Anthropic-Ratelimit-Requests-Remaining", "0")
	h.Add("Anthropic-Ratelimit-Tokens-Reset", "2026-01-01T00:00:00Z")
	h.Add("Anthropic-Ratelimit-Tokens-Reset", "2026-01-02T00:00:00Z")
	// Not decision evidence: dropped.
	h.Set("Content-Type", "application/json")
	h.Set("Anthropic-Organization-Id", "org-1")
	h.Set("Anthropic-Ratelimit", "no dash suffix")
	h.Set("X-Anthropic-Ratelimit-Foo", "prefixed")
	h.Set("Set-Cookie", "a=b")
	h.Set("Cf-Ray", "abc")
	h["Anthropic-Ratelimit-Empty"] = []string{}
	// A header map built by hand may not be canonical; still lower-cased.
	h["anthropic-ratelimit-unified-reset"] = []string{"1785736800"}

	got := decisionHeaders(h)
	want := map[string]string{
		"retry-after":                        "30",
		"retry-after-ms":                     "30000",
		"x-should-retry":                     "true",
		"request-id":                         "req_011",
		"anthropic-ratelimit-unified-status": "rejected",
		"anthropic-ratelimit-unified-7d-utilization": "0.94",
		"anthropic-ratelimit-requests-remaining":     "0",
		"anthropic-ratelimit-tokens-reset":           "2026-01-01T00:00:00Z",
		"anthropic-ratelimit-unified-reset":          "1785736800",
	}
	if !maps.Equal(got, want) {
		t.Fatalf("decisionHeaders =\n %v\nwant\n %v", got, want)
	}
	if got := decisionHeaders(nil); got == nil || len(got) != 0 {
		t.Fatalf("decisionHeaders(nil) = %v, want an empty map", got)
	}
}

func TestUsageFromMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		body string
		want usage
	}{
		{`{"type":"message","usage":{"input_tokens":25,"cache_read_input_tokens":3,"output_tokens":11}}`, usage{input: 25, output: 11, cacheRead: 3}},
		{`{"type":"message","usage":{"input_tokens":12,"cache_creation_input_tokens":1536,"cache_read_input_tokens":20480,"cache_creation":{"ephemeral_5m_input_tokens":1536,"ephemeral_1h_input_tokens":0},"output_tokens":311,"service_tier":"standard"}}`,
			usage{input: 12, output: 311, cacheRead: 20480, cacheCreation: 1536}},
		{`{"type":"message","usage":{"input_tokens":7}}`, usage{input: 7}},
		{`{"type":"message","usage":{"input_tokens":-7,"cache_read_input_tokens":-1,"output_tokens":2}}`, usage{output: 2}},
		{`{"type":"message"}`, usage{}},
		{`{"input_tokens":2095}`, usage{}}, // count_tokens: no usage object
	}
	for _, tt := range tests {
		var u usage
		u.fromMessage([]byte(tt.body))
		if u != tt.want {
			t.Errorf("fromMessage(%s) = %+v, want %+v", tt.body, u, tt.want)
		}
	}
	// A body that is not JSON leaves earlier counts alone.
	u := usage{input: 3, output: 4}
	u.fromMessage([]byte("<html>"))
	if u != (usage{input: 3, output: 4}) {
		t.Errorf("fromMessage(non-JSON) changed the counts to %+v", u)
	}
}

// TestUsageFromEvents: message_start gives the input and cache counts,
// message_delta the output and, in newer API versions, the input and
// cache counts again (cumulative, or null): the latest nonzero of each
// stands.
func TestUsageFromEvents(t *testing.T) {
	t.Parallel()
	ev := func(name, data string) sseEvent { return sseEvent{name: name, data: []byte(data)} }
	var u usage
	steps := []struct {
		ev   sseEvent
		want usage
	}{
		{ev("message_start", `{"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":120,"cache_creation_input_tokens":2048,"cache_read_input_tokens":0,"output_tokens":1}}}`),
			usage{input: 120, output: 1, cacheCreation: 2048}},
		{ev("content_block_delta", `{"type":"content_block_delta","usage":{"output_tokens":999}}`), usage{input: 120, output: 1, cacheCreation: 2048}},
		{ev("ping", `{"type":"ping"}`), usage{input: 120, output: 1, cacheCreation: 2048}},
		{ev("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":57}}`), usage{input: 120, output: 57, cacheCreation: 2048}},
		// A later message_delta without usage keeps the counts; null
		// counts are none.
		{ev("message_delta", `{"type":"message_delta","usage":{"output_tokens":0}}`), usage{input: 120, output: 57, cacheCreation: 2048}},
		{ev("message_delta", `{"type":"message_delta","usage":{"input_tokens":null,"cache_read_input_tokens":null,"output_tokens":58}}`), usage{input: 120, output: 58, cacheCreation: 2048}},
		{ev("message_delta", `not json`), usage{input: 120, output: 58, cacheCreation: 2048}},
		// Cumulative counts (a server tool ran: the input grew).
		{ev("message_delta", `{"type":"message_delta","usage":{"input_tokens":10682,"cache_creation_input_tokens":2048,"cache_read_input_tokens":512,"output_tokens":510,"server_tool_use":{"web_search_requests":1}}}`),
			usage{input: 10682, output: 510, cacheRead: 512, cacheCreation: 2048}},
		{ev("message_stop", `{"type":"message_stop"}`), usage{input: 10682, output: 510, cacheRead: 512, cacheCreation: 2048}},
		// message_start data that is not JSON is ignored.
		{ev("message_start", `{`), usage{input: 10682, output: 510, cacheRead: 512, cacheCreation: 2048}},
	}
	for i, s := range steps {
		u.fromEvent(s.ev)
		if u != s.want {
			t.Fatalf("after step %d (%s): %+v, want %+v", i, s.ev.name, u, s.want)
		}
	}
}

// TestTransportFailureWrapped: errors as the standard library wraps them
// (and weir's own) keep their cause and lose their addresses.
func TestTransportFailureWrapped(t *testing.T) {
	t.Parallel()
	const (
		dns     = weirv1.TransportCause_TRANSPORT_CAUSE_DNS
		refused = weirv1.TransportCause_TRANSPORT_CAUSE_REFUSED
		timeout = weirv1.TransportCause_TRANSPORT_CAUSE_TIMEOUT
		reset   = weirv1.TransportCause_TRANSPORT_CAUSE_RESET
		other   = weirv1.TransportCause_TRANSPORT_CAUSE_OTHER
	)
	tests := []struct {
		err   error
		cause weirv1.TransportCause
		want  string
	}{
		{&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, refused, "connection refused"},
		{fmt.Errorf("read tcp 10.0.0.1:1->10.0.0.2:443: %w", syscall.ECONNRESET), reset, "connection reset"},
		{syscall.EPIPE, reset, "connection reset"},
		{io.ErrUnexpectedEOF, reset, "connection closed"},
		{fmt.Errorf("Post \"https://api.anthropic.com/v1/messages\": %w", io.EOF), reset, "connection closed"},
		{fmt.Errorf("Post \"http://10.0.0.2/v1/messages\": %w", errors.New("http: server closed idle connection")), reset, "connection closed"},
		{context.DeadlineExceeded, timeout, "timeout"},
		{errStreamIdle, timeout, "idle timeout"},
		{&net.DNSError{Err: "no such host", Name: "api.anthropic.com", IsNotFound: true}, dns, "no such host"},
		{&net.DNSError{Err: "i/o timeout", Name: "api.anthropic.com", IsTimeout: true}, dns, "lookup timed out"},
		{&net.DNSError{Err: "server misbehaving", Name: "api.anthropic.com"}, dns, "lookup failed"},
		{errSSETooLarge, other, errSSETooLarge.Error()},
		{errMalformedBody, other, errMalformedBody.Error()},
		{errors.New("tls: secret detail about 10.1.2.3"), other, "transport error"},
	}
	for _, tt := range tests {
		if cause, got := transportFailure(tt.err); cause != tt.cause || got != tt.want {
			t.Errorf("transportFailure(%v) = %v %q, want %v %q", tt.err, cause, got, tt.cause, tt.want)
		}
	}
}
