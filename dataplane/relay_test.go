package dataplane

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

const (
	evStart = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n"
	evBlock = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0}\n\n"
	evPing  = "event: ping\ndata: {\"type\":\"ping\"}\n\n"
	evDelta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n"
	evBStop = "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n"
	evMDel  = "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n"
	evStop  = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	evOver  = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
)

// relay runs relayStream over an upstream body and returns what the client
// got and the attempt's result; relaying needs no control plane.
func relay(t *testing.T, upstream io.Reader) (*httptest.ResponseRecorder, attemptResult) {
	t.Helper()
	s := newTestServer(t)
	rec := httptest.NewRecorder()
	tw := &trackingWriter{ResponseWriter: rec, now: time.Now}
	resp := &http.Response{
		StatusCode: 200,
		Header: http.Header{
			"Content-Type":              {"text/event-stream; charset=utf-8"},
			"Request-Id":                {"req_up"},
			"Anthropic-Organization-Id": {"org-secret"},
		},
		Body: io.NopCloser(upstream),
	}
	in := &inbound{requestID: "weir_r", stream: true}
	res := s.relayStream(t.Context(), tw, resp, in, &weirv1.Outcome{}, idleWatch{})
	return rec, res
}

func TestRelayStreamSuccess(t *testing.T) {
	t.Parallel()
	full := evStart + evBlock + evPing + evDelta + evDelta + evBStop + evMDel + evStop
	rec, res := relay(t, strings.NewReader(full))
	if res.failure != nil || res.outcome.Class != classSuccess {
		t.Fatalf("class %v failure %v", res.outcome.Class, res.failure)
	}
	if rec.Body.String() != full {
		t.Errorf("client got %q, want the upstream's bytes", rec.Body.String())
	}
	if !res.outcome.BytesToClient || res.outcome.InputTokens != 10 || res.outcome.OutputTokens != 7 {
		t.Errorf("outcome = %v", res.outcome)
	}
	if rec.Header().Get("Request-Id") != "req_up" || rec.Header().Get("Anthropic-Organization-Id") != "" {
		t.Errorf("headers = %v", rec.Header())
	}
}

// TestRelayStreamErrorBeforeOutput: an overloaded event before the first
// delta leaves the client untouched, so the request can go elsewhere.
func TestRelayStreamErrorBeforeOutput(t *testing.T) {
	t.Parallel()
	rec, res := relay(t, strings.NewReader(evStart+evBlock+evPing+evOver))
	if rec.Body.Len() != 0 || rec.Code != 200 || len(rec.Header()) != 0 {
		t.Errorf("client already got %d %v %q", rec.Code, rec.Header(), rec.Body.String())
	}
	if res.outcome.Class != classOverload || res.outcome.ErrorType != "overloaded_error" || res.outcome.BytesToClient {
		t.Errorf("outcome = %v", res.outcome)
	}
	if res.failure == nil || res.failure.status != 529 {
		t.Fatalf("failure = %+v, want a 529 to replay", res.failure)
	}
	if e := errorTypeOf(res.failure.body); e != "overloaded_error" {
		t.Errorf("failure body type = %q", e)
	}
}

// TestRelayStreamCutBeforeOutput: a stream that breaks before any delta is
// a transport failure that may still be replayed.
func TestRelayStreamCutBeforeOutput(t *testing.T) {
	t.Parallel()
	rec, res := relay(t, strings.NewReader(evStart+"event: content_block_start\ndata: {"))
	if rec.Body.Len() != 0 {
		t.Errorf("client got %q", rec.Body.String())
	}
	if res.outcome.Class != classTransportError || res.failure == nil || res.failure.status != http.StatusBadGateway {
		t.Errorf("outcome %v failure %+v", res.outcome, res.failure)
	}
}

const classTransportError = weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR

// TestRelayStreamCutAfterOutput: the client keeps what it got and learns
// the stream broke from a final error event.
func TestRelayStreamCutAfterOutput(t *testing.T) {
	t.Parallel()
	partial := evStart + evBlock + evPing + evDelta + evDelta
	rec, res := relay(t, strings.NewReader(partial+"event: content_block_delta\ndata: {\"ty"))
	want := partial + string(streamErrorEvent("api_error", "upstream stream ended unexpectedly"))
	if rec.Body.String() != want {
		t.Errorf("client got %q, want %q", rec.Body.String(), want)
	}
	if res.failure != nil || res.outcome.Class != weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR || !res.outcome.BytesToClient {
		t.Errorf("outcome %v failure %v", res.outcome, res.failure)
	}
}

// TestRelayStreamTrailingBlankLine: a finished stream followed by a blank
// line is still a clean success, with nothing appended.
func TestRelayStreamTrailingBlankLine(t *testing.T) {
	t.Parallel()
	full := evStart + evBlock + evDelta + evBStop + evMDel + evStop
	rec, res := relay(t, strings.NewReader(full+"\n"))
	if res.outcome.Class != classSuccess {
		t.Errorf("class = %v, want success", res.outcome.Class)
	}
	if !strings.HasPrefix(rec.Body.String(), full) || strings.Contains(rec.Body.String(), "event: error") {
		t.Errorf("client got %q", rec.Body.String())
	}
}

// TestRelayStreamErrorAfterOutputIsLast: an upstream error event after
// output is relayed as the stream's last event; weir adds none of its own.
func TestRelayStreamErrorAfterOutputIsLast(t *testing.T) {
	t.Parallel()
	body := evStart + evBlock + evPing + evDelta + evDelta + evOver
	rec, res := relay(t, strings.NewReader(body))
	if rec.Body.String() != body {
		t.Errorf("client got %q, want exactly the upstream's %q", rec.Body.String(), body)
	}
	if res.outcome.Class != weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR || res.outcome.ErrorType != "overloaded_error" {
		t.Errorf("outcome = %v", res.outcome)
	}
}

// TestRelayStreamErrorAfterOutput is the part of the above that holds today:
// the partial output and the upstream's error event reach the client and
// the attempt is a stream error, not a replayable failure.
func TestRelayStreamErrorAfterOutput(t *testing.T) {
	t.Parallel()
	body := evStart + evBlock + evPing + evDelta + evDelta + evOver
	rec, res := relay(t, strings.NewReader(body))
	if !strings.HasPrefix(rec.Body.String(), body) {
		t.Errorf("client got %q, want it to start with %q", rec.Body.String(), body)
	}
	if res.failure != nil || res.outcome.Class != weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR ||
		res.outcome.ErrorType != "overloaded_error" || !res.outcome.BytesToClient {
		t.Errorf("outcome %v failure %v", res.outcome, res.failure)
	}
}
