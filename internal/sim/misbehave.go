package sim

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Misbehaviour kinds: an upstream that breaks the protocol rather than
// answering with an error. The *_before_output kinds act on a stream
// after its first event (message_start, response.created, the role-only
// chunk), the *_after_output kinds after AfterDeltas deltas; a request
// without a stream gets the non-streamed form each kind names.
const (
	// FaultNoHeaders accepts the request and never answers, until the
	// client goes away.
	FaultNoHeaders = "no_headers"
	// FaultResetBeforeOutput and FaultResetAfterOutput reset the TCP
	// connection (RST) mid-stream. Without a stream: Content-Length
	// promised, half the body written, then the reset.
	FaultResetBeforeOutput = "reset_before_output"
	FaultResetAfterOutput  = "reset_after_output"
	// FaultStallBeforeOutput and FaultStallAfterOutput stop sending
	// mid-stream, keeping the connection open until the client leaves.
	// Without a stream: Content-Length promised, half the body, then the
	// same silence.
	FaultStallBeforeOutput = "stall_before_output"
	FaultStallAfterOutput  = "stall_after_output"
	// FaultMalformedBeforeOutput and FaultMalformedAfterOutput insert one
	// malformed event (Malformed says which) and then go on with the
	// stream as if nothing happened. Without a stream: a 200 whose body is
	// not JSON.
	FaultMalformedBeforeOutput = "malformed_before_output"
	FaultMalformedAfterOutput  = "malformed_after_output"
	// FaultOversizedLineBeforeOutput and FaultOversizedLineAfterOutput
	// send one data line of Size bytes (default 17 MiB, past weir's 16 MiB
	// event limit), then go on with the stream. Without a stream: as
	// huge_body.
	FaultOversizedLineBeforeOutput = "oversized_line_before_output"
	FaultOversizedLineAfterOutput  = "oversized_line_after_output"
	// FaultBodyLongerThanLength answers (streamed or not) with the whole
	// non-streamed reply and its true Content-Length, then Size more bytes
	// of junk on the connection (default 1 MiB), then closes it.
	FaultBodyLongerThanLength = "body_longer_than_length"
	// FaultHugeBody answers (streamed or not) with Status (default 200)
	// and a JSON-looking body of Size bytes (default 65 MiB) without a
	// Content-Length, cut short only if the client goes away.
	FaultHugeBody = "huge_body"
)

// Malformations of a malformed_* fault.
const (
	// MalformedGarbage is a line that is no SSE field at all.
	MalformedGarbage = "garbage"
	// MalformedNonJSONData is a named event whose data is not JSON.
	MalformedNonJSONData = "non_json_data"
	// MalformedBrokenJSON is a delta whose JSON is cut off.
	MalformedBrokenJSON = "broken_json"
	// MalformedNoEventName is data without an event: line (malformed on
	// the Messages API, which names every event; the OpenAI streams allow
	// it, Chat Completions never names one).
	MalformedNoEventName = "no_event_name"
)

var malformations = []string{MalformedGarbage, MalformedNonJSONData, MalformedBrokenJSON, MalformedNoEventName}

func init() {
	faultKinds = append(faultKinds, misbehaviourKinds...)
}

var misbehaviourKinds = []string{
	FaultNoHeaders, FaultResetBeforeOutput, FaultResetAfterOutput, FaultStallBeforeOutput, FaultStallAfterOutput,
	FaultMalformedBeforeOutput, FaultMalformedAfterOutput, FaultOversizedLineBeforeOutput, FaultOversizedLineAfterOutput,
	FaultBodyLongerThanLength, FaultHugeBody,
}

const (
	defaultOversizedLine = 17 << 20
	defaultJunk          = 1 << 20
	defaultHugeBody      = 65 << 20
)

// size is f.Size, or def when unset.
func (f Fault) size(def int) int {
	if f.Size == 0 {
		return def
	}
	return f.Size
}

// validateMisbehaviour reports the problems of the fields only
// misbehaviour kinds take.
func validateMisbehaviour(ff string, f Fault) []error {
	var errs []error
	if f.Size < 0 {
		errs = append(errs, fmt.Errorf("%s.size: %d is negative", ff, f.Size))
	}
	if f.Size != 0 && !slices.Contains([]string{FaultOversizedLineBeforeOutput, FaultOversizedLineAfterOutput, FaultBodyLongerThanLength, FaultHugeBody}, f.Kind) {
		errs = append(errs, fmt.Errorf("%s.size: only valid for the oversized_line, body_longer_than_length and huge_body kinds", ff))
	}
	if f.Status != 0 && (f.Kind != FaultHugeBody || f.Status < 200 || f.Status > 599) {
		errs = append(errs, fmt.Errorf("%s.status: only valid for kind %q, 200-599", ff, FaultHugeBody))
	}
	if f.Malformed != "" {
		if f.Kind != FaultMalformedBeforeOutput && f.Kind != FaultMalformedAfterOutput {
			errs = append(errs, fmt.Errorf("%s.malformed: only valid for the malformed kinds", ff))
		} else if !slices.Contains(malformations, f.Malformed) {
			errs = append(errs, fmt.Errorf("%s.malformed: unknown malformation %q (want one of %s)", ff, f.Malformed, strings.Join(malformations, ", ")))
		}
	}
	return errs
}

// misbehave answers an attempt whose fault is a misbehaviour kind: whole
// is the non-streamed reply's body, stream the surface's stream (which
// calls misbehaveStream at its two points).
func (x *exchange) misbehave(f Fault, whole func() []byte, stream func(*Fault)) {
	switch {
	case f.Kind == FaultNoHeaders:
		x.record(f.Kind, 0)
		<-x.r.Context().Done()
	case f.Kind == FaultBodyLongerThanLength:
		x.record(f.Kind, http.StatusOK)
		body := whole()
		x.reportUsage(x.usage()) // the whole answer goes out before the junk
		x.longerThanLength(body, f.size(defaultJunk))
	case f.Kind == FaultHugeBody:
		status := f.Status
		if status == 0 {
			status = http.StatusOK
		}
		x.record(f.Kind, status)
		x.hugeBody(status, f.size(defaultHugeBody))
	case x.req.Stream:
		x.record(f.Kind, http.StatusOK)
		stream(&f)
	case f.Kind == FaultResetBeforeOutput, f.Kind == FaultResetAfterOutput:
		x.record(f.Kind, http.StatusOK)
		x.halfBody(whole())
		x.reset()
	case f.Kind == FaultStallBeforeOutput, f.Kind == FaultStallAfterOutput:
		x.record(f.Kind, http.StatusOK)
		x.halfBody(whole())
		<-x.r.Context().Done()
	case f.Kind == FaultMalformedBeforeOutput, f.Kind == FaultMalformedAfterOutput:
		x.record(f.Kind, http.StatusOK)
		x.w.Header().Set("Content-Type", "application/json")
		x.w.WriteHeader(http.StatusOK)
		x.w.Write([]byte("this is not JSON\n")) //nolint:errcheck // the client may be gone
	default: // the oversized_line kinds
		x.record(f.Kind, http.StatusOK)
		x.hugeBody(http.StatusOK, f.size(defaultOversizedLine))
	}
}

// misbehaveStream acts on a stream at one of its two points (afterOutput
// or before it) when f's kind is for that point, and reports whether the
// stream must end there. deltaEvent names the surface's output event (""
// for Chat Completions, which names none).
func (x *exchange) misbehaveStream(sw *sseWriter, f *Fault, afterOutput bool, deltaEvent string) (stop bool) {
	if f == nil || sw.err != nil {
		return false
	}
	var kind string
	switch f.Kind {
	case FaultResetBeforeOutput, FaultStallBeforeOutput, FaultMalformedBeforeOutput, FaultOversizedLineBeforeOutput:
		kind = strings.TrimSuffix(f.Kind, "_before_output")
		if afterOutput {
			return false
		}
	case FaultResetAfterOutput, FaultStallAfterOutput, FaultMalformedAfterOutput, FaultOversizedLineAfterOutput:
		kind = strings.TrimSuffix(f.Kind, "_after_output")
		if !afterOutput {
			return false
		}
	default:
		return false
	}
	named := ""
	if deltaEvent != "" {
		named = "event: " + deltaEvent + "\n"
	}
	switch kind {
	case "reset":
		x.reset()
		return true
	case "stall":
		<-x.r.Context().Done()
		return true
	case "malformed":
		var ev string
		switch f.Malformed {
		case MalformedNonJSONData:
			ev = named + "data: this is not JSON\n\n"
		case MalformedBrokenJSON:
			ev = named + `data: {"type":"` + deltaEvent + `","index":0,"delta":{"type":"text_delta","text":"cut` + "\n\n"
		case MalformedNoEventName:
			ev = `data: {"type":"ping"}` + "\n\n"
		default:
			ev = "this line is no server-sent event\n\n"
		}
		sw.raw(ev)
	default: // oversized_line
		sw.raw(named + "data: {\"text\":\"" + strings.Repeat("a", f.size(defaultOversizedLine)) + "\"}\n\n")
	}
	return false
}

// raw writes bytes as they are and flushes them.
func (sw *sseWriter) raw(s string) {
	if sw.err != nil {
		return
	}
	if _, sw.err = sw.w.Write([]byte(s)); sw.err == nil {
		sw.flush()
	}
}

// halfBody promises body's Content-Length and sends its first half.
func (x *exchange) halfBody(body []byte) {
	h := x.w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	x.w.WriteHeader(http.StatusOK)
	x.w.Write(body[:len(body)/2])           //nolint:errcheck // the connection is cut next anyway
	http.NewResponseController(x.w).Flush() //nolint:errcheck // as above
}

// reset ends the connection with a TCP RST: what was written is flushed,
// then the connection is closed without lingering. Where it cannot be
// hijacked (HTTP/2), the stream is reset instead.
func (x *exchange) reset() {
	conn, _, err := http.NewResponseController(x.w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0) //nolint:errcheck // a plain close is the fallback
	}
	x.s.endAttempt(x.r)
	conn.Close()
}

// longerThanLength writes a raw HTTP/1.1 response whose Content-Length is
// body's, then junk bytes more (net/http refuses to write past a declared
// length, so the connection is taken over).
func (x *exchange) longerThanLength(body []byte, junk int) {
	conn, bw, err := http.NewResponseController(x.w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	defer conn.Close()
	// A client that stops reading must not hold the handler.
	conn.SetWriteDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // best effort
	// Errors surface at Flush.
	_, _ = bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n")
	bw.Write(body) //nolint:errcheck // see Flush
	chunk := strings.Repeat("junk after the promised length\n", 1024)
	for n := 0; n < junk; n += len(chunk) {
		if _, err := bw.WriteString(chunk[:min(len(chunk), junk-n)]); err != nil {
			return
		}
	}
	bw.Flush() //nolint:errcheck // the client may be gone
}

// hugeBody streams a JSON-looking body of n bytes with no Content-Length.
func (x *exchange) hugeBody(status, n int) {
	x.w.Header().Set("Content-Type", "application/json")
	x.w.WriteHeader(status)
	head, tail := `{"type":"error","error":{"type":"api_error","message":"`, `"}}`
	chunk := strings.Repeat("a", 64<<10)
	if _, err := x.w.Write([]byte(head)); err != nil {
		return
	}
	for left := n - len(head) - len(tail); left > 0; left -= len(chunk) {
		if _, err := x.w.Write([]byte(chunk[:min(len(chunk), left)])); err != nil {
			return
		}
	}
	x.w.Write([]byte(tail)) //nolint:errcheck // the client may be gone
}
