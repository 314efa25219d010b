package sim

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// tickingClock moves a millisecond at every reading, so that the order of
// an attempt's stamps shows in their times.
func tickingClock() func() time.Time {
	var n atomic.Int64
	return func() time.Time { return testNow.Add(time.Duration(n.Add(1)) * time.Millisecond) }
}

// lastAttempt is the log's newest attempt once the server has finished
// every request (Close waits for the handlers).
func (b *bundle) lastAttempt(t *testing.T) Attempt {
	t.Helper()
	b.ts.Close()
	atts := b.sim.Attempts()
	if len(atts) == 0 {
		t.Fatal("no attempt logged")
	}
	return atts[len(atts)-1]
}

func TestAttemptStampsEndAndOutput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		path       string
		h          http.Header
		body       string
		fault      *Fault
		wantOutput bool
	}{
		{name: "messages", path: "/v1/messages", h: apiKeyHeaders(keyA), body: messagesBody(sonnet, false), wantOutput: true},
		{name: "messages stream", path: "/v1/messages", h: apiKeyHeaders(keyA), body: messagesBody(sonnet, true), wantOutput: true},
		{name: "overloaded", path: "/v1/messages", h: apiKeyHeaders(keyA), body: messagesBody(sonnet, true), fault: &Fault{Kind: FaultOverloaded}},
		{name: "overloaded event", path: "/v1/messages", h: apiKeyHeaders(keyA), body: messagesBody(sonnet, true), fault: &Fault{Kind: FaultOverloadedEvent}},
		{name: "reset before output", path: "/v1/messages", h: apiKeyHeaders(keyA), body: messagesBody(sonnet, true), fault: &Fault{Kind: FaultResetBeforeOutput}},
		{name: "reset after output", path: "/v1/messages", h: apiKeyHeaders(keyA), body: messagesBody(sonnet, true), fault: &Fault{Kind: FaultResetAfterOutput}, wantOutput: true},
		{name: "dropped", path: "/v1/messages", h: apiKeyHeaders(keyA), body: messagesBody(sonnet, false), fault: &Fault{Kind: FaultDropConnection}},
		{name: "responses", path: "/v1/responses", h: openAIKeyHeaders(keyOpenAI), body: responsesBody(false), wantOutput: true},
		{name: "responses stream", path: "/v1/responses", h: openAIKeyHeaders(keyOpenAI), body: responsesBody(true), wantOutput: true},
		{name: "responses 503", path: "/v1/responses", h: openAIKeyHeaders(keyOpenAI), body: responsesBody(true), fault: &Fault{Kind: FaultUnavailable}},
		{name: "chat stream", path: "/v1/chat/completions", h: openAIKeyHeaders(keyOpenAI), body: chatBody(true), wantOutput: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{Now: tickingClock(), Script: openAIScript()})
			if tc.fault != nil {
				acct := "key-a"
				if tc.path != "/v1/messages" {
					acct = "oai"
				}
				if err := b.sim.AddFaults(acct, *tc.fault); err != nil {
					t.Fatal(err)
				}
			}
			if resp, err := b.send(t, "POST", tc.path, tc.h, tc.body); err == nil {
				io.Copy(io.Discard, resp.Body) //nolint:errcheck // a reset ends it early
				resp.Body.Close()
			}
			a := b.lastAttempt(t)
			if a.Ended.IsZero() || !a.Ended.After(a.Time) {
				t.Errorf("ended %v, started %v", a.Ended, a.Time)
			}
			if got := !a.Output.IsZero(); got != tc.wantOutput {
				t.Errorf("output %v, want output %v", a.Output, tc.wantOutput)
			}
			if tc.wantOutput && (!a.Output.After(a.Time) || !a.Ended.After(a.Output)) {
				t.Errorf("stamps out of order: %v, output %v, ended %v", a.Time, a.Output, a.Ended)
			}
			if a.ClientGone {
				t.Error("client gone, but it read the whole answer")
			}
		})
	}
}

// A client that leaves mid-stream: the attempt ends when the simulator
// notices, marked as the client's doing.
func TestAttemptClientGone(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Now: tickingClock()})
	h := apiKeyHeaders(keyA)
	h.Set(StreamHeader, "hold")
	resp, err := b.send(t, "POST", "/v1/messages", h, messagesBody(sonnet, true))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, "content_block_delta") {
			break
		}
	}
	resp.Body.Close()
	a := b.lastAttempt(t)
	if !a.ClientGone || a.Output.IsZero() || !a.Ended.After(a.Output) {
		t.Errorf("attempt %+v: want output, then the client gone", a)
	}
}

// A clear starts a new generation: a request logged before it stamps
// nothing after.
func TestAttemptLogUpdateAcrossClear(t *testing.T) {
	t.Parallel()
	var l attemptLog
	gen, seq := l.add(Attempt{Status: 1})
	l.clear()
	l.add(Attempt{Status: 2})
	l.update(gen, seq, func(a *Attempt) { a.Status = 99 })
	if got := l.list(); len(got) != 1 || got[0].Status != 2 {
		t.Errorf("log %+v", got)
	}
	// And one dropped from the ring is not written over its successor.
	var r attemptLog
	g0, s0 := r.add(Attempt{})
	for range maxAttempts {
		r.add(Attempt{Status: 7})
	}
	r.update(g0, s0, func(a *Attempt) { a.Status = 99 })
	for _, a := range r.list() {
		if a.Status != 7 {
			t.Fatalf("a dropped attempt was updated over a kept one: %+v", a)
		}
	}
}
