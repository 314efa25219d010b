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

// spendAtWrite is a client connection that reads, at each write of the
// answer, the spend the worker's ledger holds for the request's session:
// what the client's next request would be checked against if it came
// the moment that write reached it.
type spendAtWrite struct {
	*httptest.ResponseRecorder
	s      *Server
	in     *inbound
	tokens []int64
}

func (w *spendAtWrite) Write(p []byte) (int, error) {
	var t int64
	for _, r := range w.s.ledger.unreported(w.in.keyID, w.in.team, w.in.session).GetRequests() {
		if r.Session {
			t += r.Tokens
		}
	}
	w.tokens = append(w.tokens, t)
	return w.ResponseRecorder.Write(p)
}

// TestBudgetedSpendCountedBeforeTheAnswerEnds: a budgeted request's spend
// is in the ledger before the last byte of its answer is written, whole or
// streamed, so that a sequential client's next request (sent the moment
// this answer ends) is checked against it. It was added only once the
// request's handler returned, after the client had its answer.
func TestBudgetedSpendCountedBeforeTheAnswerEnds(t *testing.T) {
	t.Parallel()
	s := newTestServer(t)
	newIn := func(id string, stream bool) *inbound {
		return &inbound{requestID: id, stream: stream, budgeted: true, keyID: "key-1", session: "sess", model: "claude-sonnet-4-5",
			sf: surfaceMessages}
	}

	in := newIn("weir_whole", false)
	w := &spendAtWrite{ResponseRecorder: httptest.NewRecorder(), s: s, in: in}
	resp := &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(`{"type":"message","content":[],"usage":{"input_tokens":10,"output_tokens":7}}`))}
	res := s.relayWhole(t.Context(), &trackingWriter{ResponseWriter: w, now: time.Now}, resp, in, &weirv1.Outcome{}, idleWatch{}, relayed{sf: surfaceMessages, model: in.model})
	if res.failure != nil || len(w.tokens) == 0 || w.tokens[len(w.tokens)-1] != 17 {
		t.Fatalf("whole answer: spend in the ledger at each write %v (failure %v), want 17 at the last", w.tokens, res.failure)
	}

	in = newIn("weir_stream", true)
	w = &spendAtWrite{ResponseRecorder: httptest.NewRecorder(), s: s, in: in}
	resp = &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
		Body: io.NopCloser(strings.NewReader(evStart + evBlock + evDelta + evBStop + evMDel + evStop))}
	res = s.relayStream(t.Context(), &trackingWriter{ResponseWriter: w, now: time.Now}, resp, in, &weirv1.Outcome{}, idleWatch{}, nil, nil, relayed{sf: surfaceMessages, model: in.model})
	if res.failure != nil || len(w.tokens) == 0 || w.tokens[len(w.tokens)-1] != 17+17 {
		t.Fatalf("stream: spend in the ledger (this session's two requests) at each write %v (failure %v), want 34 at the last", w.tokens, res.failure)
	}
}
