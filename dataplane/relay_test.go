package dataplane

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"weak"

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
	res := s.relayStream(t.Context(), tw, resp, in, &weirv1.Outcome{}, idleWatch{}, nil, nil, relayed{})
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
	if !res.outcome.BytesToClient || res.outcome.GetUsage().GetInputTokens() != 10 || res.outcome.GetUsage().GetOutputTokens() != 7 {
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

// firstWrite is a client connection that says when its first bytes came.
type firstWrite struct {
	*httptest.ResponseRecorder
	once  sync.Once
	wrote chan struct{}
}

func (f *firstWrite) Write(b []byte) (int, error) {
	f.once.Do(func() { close(f.wrote) })
	return f.ResponseRecorder.Write(b)
}

// TestStreamLetsTheRequestBodyGo: once a stream's first output reached the
// client, nothing will replay the request, so its body (an agent's whole
// conversation, often hundreds of KiB) is no longer held for the minutes
// the stream runs, although the transport keeps the upstream request.
func TestStreamLetsTheRequestBodyGo(t *testing.T) {
	t.Parallel()
	finish := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n, _ := io.Copy(io.Discard, r.Body); n != 256<<10 {
			t.Errorf("upstream got %d body bytes", n)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, evStart+evBlock+evDelta) //nolint:errcheck // test upstream
		w.(http.Flusher).Flush()
		select {
		case <-finish:
		case <-r.Context().Done():
		}
		io.WriteString(w, evBStop+evMDel+evStop) //nolint:errcheck // test upstream
	}))
	defer up.Close()
	s := newTestServer(t)

	body := bytes.Repeat([]byte("x"), 256<<10)
	held := weak.Make(&body[0])
	in := &inbound{sf: surfaceMessages, requestID: "weir_body", stream: true, body: body}
	body = nil
	client := &firstWrite{ResponseRecorder: httptest.NewRecorder(), wrote: make(chan struct{})}
	tw := &trackingWriter{ResponseWriter: client, now: time.Now}
	done := make(chan attemptResult, 1)
	go func() {
		done <- s.attempt(t.Context(), tw, httptest.NewRequest(http.MethodPost, "/v1/messages", nil), in,
			&weirv1.Lease{Id: "l1", AccountId: "a1", BaseUrl: up.URL, Credential: testAPIKey}, 0)
	}()
	<-client.wrote
	runtime.GC()
	runtime.GC()
	released := held.Value() == nil
	close(finish)
	res := <-done
	if !released {
		t.Error("the request body is still held while the stream runs")
	}
	if res.outcome.Class != classSuccess || res.outcome.GetUsage().GetOutputTokens() != 7 {
		t.Errorf("outcome = %v", res.outcome)
	}
}

// TestReplayBodyAfterRelease: every reader shares the one copy, and none
// reads after it was let go.
func TestReplayBodyAfterRelease(t *testing.T) {
	t.Parallel()
	rb := &replayBody{b: []byte("hello"), n: 5}
	r1, _ := rb.GetBody()
	if b, _ := io.ReadAll(r1); string(b) != "hello" {
		t.Fatalf("read %q", b)
	}
	r2, _ := rb.GetBody()
	var sb strings.Builder
	if n, err := r2.(io.WriterTo).WriteTo(&sb); n != 5 || err != nil || sb.String() != "hello" {
		t.Fatalf("WriteTo = %d, %v, %q", n, err, sb.String())
	}
	r3, _ := rb.GetBody()
	rb.release()
	if _, err := r3.Read(make([]byte, 8)); !errors.Is(err, errBodyReleased) {
		t.Errorf("read after release: %v", err)
	}
	// The transport reads once more past Content-Length to check the body
	// had no more; at its end a reader says EOF, released or not.
	for _, r := range []io.Reader{r1, r2} {
		if n, err := r.Read(make([]byte, 8)); n != 0 || err != io.EOF {
			t.Errorf("read at the end after release: %d, %v; want EOF", n, err)
		}
	}
	if n, err := r2.(io.WriterTo).WriteTo(&sb); n != 0 || err != nil {
		t.Errorf("WriteTo at the end after release: %d, %v", n, err)
	}
	if _, err := rb.GetBody(); !errors.Is(err, errBodyReleased) {
		t.Errorf("GetBody after release: %v", err)
	}
}

// TestRelayStreamIdleCut: an upstream that goes silent after output is cut
// by the idle watch (it closes the body under the blocked read) and the
// attempt says so: a stream error for the idle timeout, not a hang.
func TestRelayStreamIdleCut(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newTestServer(t)
		pr, pw := io.Pipe()
		go func() {
			io.WriteString(pw, evStart+evBlock+evDelta) //nolint:errcheck // read by the relay
			// then silence: the relay's read blocks until the watch fires
		}()
		resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: pr}
		watch := idleWatch{timeout: time.Minute, fired: new(atomic.Bool)}
		watch.t = time.AfterFunc(watch.timeout, func() {
			watch.fired.Store(true)
			pr.Close() //nolint:errcheck // test
		})
		rec := httptest.NewRecorder()
		tw := &trackingWriter{ResponseWriter: rec, now: time.Now}
		start := time.Now()
		res := s.relayStream(t.Context(), tw, resp, &inbound{requestID: "weir_idle", stream: true}, &weirv1.Outcome{}, watch, nil, nil, relayed{})
		if res.outcome.Class != weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR || !strings.Contains(res.outcome.TransportError, "idle timeout") {
			t.Errorf("outcome = %v, want a stream error for the idle timeout", res.outcome)
		}
		if waited := time.Since(start); waited != time.Minute {
			t.Errorf("cut after %v, want the 1m idle timeout", waited)
		}
		if !strings.Contains(rec.Body.String(), "upstream stream ended unexpectedly") {
			t.Errorf("client got %q, want the stream's end told in its format", rec.Body.String())
		}
	})
}

// flushLog records what the client had been sent at each flush.
type flushLog struct {
	*httptest.ResponseRecorder
	mu      sync.Mutex
	flushed []string
}

func (f *flushLog) Flush() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flushed = append(f.flushed, f.Body.String())
}

func (f *flushLog) log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.flushed)
}

// TestRelayStreamFlushesBeforeWaiting: events that arrive together go to
// the client in one flush, and everything relayed is flushed before the
// relay waits on the upstream again: no event waits for the next one.
func TestRelayStreamFlushesBeforeWaiting(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := newTestServer(t)
		pr, pw := io.Pipe()
		more := make(chan struct{})
		first := evStart + evBlock + evPing + evDelta + evDelta + evDelta
		rest := evBStop + evMDel + evStop
		go func() {
			io.WriteString(pw, first) //nolint:errcheck // read by the relay
			<-more
			io.WriteString(pw, rest) //nolint:errcheck // read by the relay
			pw.Close()               //nolint:errcheck // test
		}()
		resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: pr}
		fl := &flushLog{ResponseRecorder: httptest.NewRecorder()}
		tw := &trackingWriter{ResponseWriter: fl, now: time.Now}
		done := make(chan attemptResult)
		go func() {
			done <- s.relayStream(t.Context(), tw, resp, &inbound{requestID: "weir_flush", stream: true}, &weirv1.Outcome{}, idleWatch{}, nil, nil, relayed{})
		}()
		synctest.Wait() // the relay waits on the upstream
		got := fl.log()
		if len(got) == 0 || got[len(got)-1] != first {
			t.Fatalf("%d flushes; the client had %d of the %d bytes relayed while the upstream is quiet", len(got), len(lastOf(got)), len(first))
		}
		// The commit's flush (the events up to the first delta), then one
		// for the two deltas that came with them.
		if len(got) != 2 {
			t.Errorf("%d flushes for one burst, want 2", len(got))
		}
		close(more)
		res := <-done
		if res.outcome.Class != classSuccess {
			t.Fatalf("outcome %v", res.outcome)
		}
		if got := fl.log(); len(got) != 3 || got[2] != first+rest {
			t.Errorf("%d flushes, want a third with the whole stream", len(got))
		}
	})
}

func lastOf(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}
