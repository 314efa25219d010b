package dataplane

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/egress"
	"github.com/weirhq/weir/internal/translate"
)

// maxErrorBody bounds how much of an upstream error body is kept.
const maxErrorBody = 1 << 20

// attemptResult is what one upstream attempt left behind.
type attemptResult struct {
	outcome *weirv1.Outcome
	// failure is the upstream's failed answer, kept because nothing reached
	// the client yet: it may still be replayed elsewhere, or sent as is.
	failure *bufferedResponse
	// terminal is a stream's final error event, held back because it said
	// the quota is spent: once the outcome is released, the worker words it
	// (finishTerminal), then the stream ends.
	terminal []byte
}

// bufferedResponse is an upstream answer held back from the client.
type bufferedResponse struct {
	status int
	header http.Header
	body   []byte
}

func (b *bufferedResponse) write(w http.ResponseWriter) {
	copyResponseHeaders(w.Header(), b.header)
	if v := b.header.Get("Retry-After"); v != "" {
		if d, ok := parseRetryAfter(v, time.Now()); ok {
			w.Header().Set("Retry-After", retryAfterSeconds(d))
		} else {
			w.Header().Del("Retry-After")
		}
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(b.body)))
	w.WriteHeader(b.status)
	w.Write(b.body) //nolint:errcheck // the client may be gone
	// The client has its whole answer now, not after the lease's Release
	// and the route report that follow.
	http.NewResponseController(w).Flush() //nolint:errcheck // as above
}

// parseRetryAfter reads seconds (possibly fractional) or an HTTP date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		return time.Duration(s * float64(time.Second)), s > 0
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now), true
	}
	return 0, false
}

// attempt sends the request once on lease's account and relays a success
// (or a non-retryable answer) to the client. A failure that another
// attempt might fix is returned unsent.
func (s *Server) attempt(ctx context.Context, w *trackingWriter, r *http.Request, in *inbound, lease *weirv1.Lease, priorOverloads int32) attemptResult {
	start := s.cfg.Now()
	o := &weirv1.Outcome{PriorOverloads: priorOverloads}
	defer func() { o.Duration = durationpb.New(s.cfg.Now().Sub(start)) }()
	// The lease is renewed for as long as the attempt runs: a long wait for
	// headers holds the account as surely as a long stream does. A lease
	// that loses its place (keeper.go) ends the upstream request.
	uctx, cut := context.WithCancelCause(ctx)
	defer cut(nil)
	defer s.keeper.hold(lease, func() { cut(errLeaseLost) })()
	defer func() {
		if context.Cause(uctx) == errLeaseLost && ctx.Err() == nil {
			leaseLost(o)
		}
	}()

	// An account of the other wire's provider gets the request translated,
	// and its answer is translated back (translation.go).
	tr := translationFor(in.sf, lease.Provider)
	sf := tr.upstreamSurface(in.sf)
	reqBody := in.body
	var treq translate.Request
	if tr != nil {
		if in.sf.name == surfaceCount.name {
			// The target has no count: weir estimates, and says so. The
			// account was not asked, and proved nothing.
			o.Class, o.Status, o.BytesToClient = weirv1.OutcomeClass_OUTCOME_CLASS_NOT_SENT, http.StatusOK, true
			writeTokenEstimate(w, in.body)
			return attemptResult{outcome: o}
		}
		var err error
		if treq, err = in.translated(tr, cmp.Or(lease.Model, in.model)); err != nil {
			// The request itself is at fault: no account of this wire would
			// do better, and nothing was sent.
			apiErr := errUntranslatable(tr, err)
			o.Class, o.Status, o.ErrorType, o.ErrorMessage = weirv1.OutcomeClass_OUTCOME_CLASS_NOT_SENT, http.StatusBadRequest, "untranslatable", apiErr.message
			in.outcome = outcomeClientError
			writeError(w, in.sf.wire, in.requestID, apiErr)
			return attemptResult{outcome: o}
		}
		reqBody = treq.Body
	}
	req, body, err := upstreamRequest(uctx, r, sf, reqBody, lease, tr != nil)
	treq.Body = nil // the upstream request holds it until the answer is committed
	if err != nil {
		o.Class, o.TransportCause = weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, weirv1.TransportCause_TRANSPORT_CAUSE_OTHER
		o.TransportError = "build request: invalid base URL"
		return attemptResult{outcome: o, failure: gatewayFailure(in, "upstream request could not be built")}
	}
	client, release, err := s.upstreamClient(lease)
	if err != nil {
		// A proxy this worker cannot use: never direct instead.
		o.Class, o.TransportCause = weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, weirv1.TransportCause_TRANSPORT_CAUSE_PROXY
		o.TransportError = "egress proxy " + egress.Redact(lease.EgressProxy) + " unusable: " + err.Error()
		return attemptResult{outcome: o, failure: gatewayFailure(in, "upstream unreachable: its egress proxy failed")}
	}
	defer release()
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			o.Class = weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED
			return attemptResult{outcome: o}
		}
		if text, ok := proxyFailure(err); ok {
			// The upstream was never asked: the proxy's failure, named.
			o.Class, o.TransportCause, o.TransportError = weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR,
				weirv1.TransportCause_TRANSPORT_CAUSE_PROXY, text
			return attemptResult{outcome: o, failure: gatewayFailure(in, "upstream unreachable: its egress proxy failed")}
		}
		setTransport(o, weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, "", err)
		return attemptResult{outcome: o, failure: gatewayFailure(in, "upstream unreachable")}
	}
	defer resp.Body.Close()
	o.Status = int32(resp.StatusCode)
	// Read once the attempt is over: the transport keeps resp.Header for
	// as long as a stream runs anyway, and the outcome is only read then.
	defer func() { o.Headers = decisionHeaders(resp.Header) }()
	o.TimeToFirstByte = durationpb.New(s.cfg.Now().Sub(start))

	// Every read of the answer is timed: an upstream that goes quiet
	// mid-body, streamed or not, is cut instead of holding the attempt.
	watch := newIdleWatch(s.cfg.StreamIdleTimeout, resp.Body)
	defer watch.t.Stop()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		body, err := io.ReadAll(io.LimitReader(watch.reader(resp.Body), maxErrorBody+1))
		if err != nil && ctx.Err() != nil {
			o.Class = weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED
			return attemptResult{outcome: o}
		}
		if len(body) > maxErrorBody {
			// Only the status is left to go on: the body, cut, is neither
			// readable evidence nor an answer to pass on. The rest of it is
			// never read (closing the body drops the connection).
			o.Class = classify(resp.StatusCode, "")
			o.ErrorMessage = "upstream error body exceeds 1 MiB"
			fail := &bufferedResponse{status: resp.StatusCode, header: http.Header{"Content-Type": {"application/json"}},
				body: gatewayBody(in.sf.wire, in.requestID, "upstream error body too large ("+strconv.Itoa(resp.StatusCode)+")")}
			if o.Class == weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR || o.Class == weirv1.OutcomeClass_OUTCOME_CLASS_UPSTREAM_ERROR {
				fail.write(w)
				return attemptResult{outcome: o}
			}
			return attemptResult{outcome: o, failure: fail}
		}
		if sf.wire == wireOpenAI {
			f := openAIErrorEvidence(resp.StatusCode, resp.Header, body, s.cfg.Now())
			o.Class, o.ErrorType, o.ErrorMessage, o.Quota = f.class, f.errorType, f.message, f.quota
		} else {
			o.ErrorType, o.ErrorMessage = errorTypeOf(body), errorMessageOf(body)
			o.Class = classify(resp.StatusCode, "")
		}
		fail := &bufferedResponse{status: resp.StatusCode, header: resp.Header.Clone(), body: body}
		if tr != nil {
			fail = translatedFailure(in.sf.wire, in.requestID, resp.StatusCode, resp.Header,
				&eventFailure{class: o.Class, errorType: o.ErrorType, message: o.ErrorMessage, quota: o.Quota})
			tr.mark(fail.header, treq)
		}
		if o.Class == weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR || o.Class == weirv1.OutcomeClass_OUTCOME_CLASS_UPSTREAM_ERROR {
			// The request itself is at fault: no other account would do better.
			fail.write(w)
			return attemptResult{outcome: o}
		}
		return attemptResult{outcome: o, failure: fail}
	}
	rl := relayed{tr: tr, req: treq, sf: sf, model: cmp.Or(lease.Model, in.model)}
	if isEventStream(resp.Header) {
		var served func()
		if lease.Probe {
			// The provider answers again: say so now, not when the stream
			// ends minutes later, so that the breaker closes for everyone.
			served = func() { s.pool.probeServed(lease) }
		}
		return s.relayStream(ctx, w, resp, in, o, watch, body, served, rl)
	}
	return s.relayWhole(ctx, w, resp, in, o, watch, rl)
}

// relayed is what an answer is relayed as: the surface the upstream
// speaks (the client's, or the target's of a translation) and the
// translation back, when there is one.
type relayed struct {
	sf  surface
	tr  *translation
	req translate.Request
	// model is the model the attempt went upstream as (an alias's target,
	// else the client's): what its spend is priced as.
	model string
}

// relayWhole reads a non-streamed answer whole, so that a connection cut
// mid-body can still fail over, then sends it. An answer that is not
// JSON, or larger than Config.MaxResponseBytes, is a broken answer: it fails over
// like a cut connection and never reaches the client.
func (s *Server) relayWhole(ctx context.Context, w *trackingWriter, resp *http.Response, in *inbound, o *weirv1.Outcome, idle idleWatch, rl relayed) attemptResult {
	var body []byte
	var err error
	limit := s.cfg.MaxResponseBytes
	if resp.ContentLength > limit {
		err = errBodyTooLarge
	} else if body, err = io.ReadAll(io.LimitReader(idle.reader(resp.Body), limit+1)); err == nil && int64(len(body)) > limit {
		// Only what was promised nowhere: the rest is never read.
		body, err = nil, errBodyTooLarge
	}
	if err == nil {
		// One parse reads the token counts and proves the body is JSON
		// (json.Unmarshal checks all of its input before decoding).
		var u usage
		var perr error
		if rl.sf.wire == wireOpenAI {
			u, perr = openAIUsage(body)
		} else {
			perr = u.fromMessage(body)
		}
		if in.sf.spendsTokens() {
			o.Usage = u.proto()
		}
		if syn := (*json.SyntaxError)(nil); errors.As(perr, &syn) {
			err = errMalformedBody
		}
		if err == nil && rl.tr != nil {
			// An answer that does not translate is broken for this client:
			// another account may answer one that does.
			if body, perr = rl.tr.whole(body, in.model, rl.req); perr != nil {
				err = fmt.Errorf("%w: %v", errUntranslatableAnswer, perr)
			}
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			o.Class = weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED
			return attemptResult{outcome: o}
		}
		text := setTransport(o, weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, "body: ", idle.cause(err))
		return attemptResult{outcome: o, failure: gatewayFailure(in, "upstream answer broken: "+text)}
	}
	if in.sf.name == surfaceModels.name && len(in.allowedModels) > 0 {
		body = filterModelList(body, in.allowedModels)
	}
	o.Class = weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS
	o.BytesToClient = true
	rl.tr.mark(w.Header(), rl.req)
	s.noteSpend(in, rl.model, o.Usage)
	(&bufferedResponse{status: resp.StatusCode, header: resp.Header, body: body}).write(w)
	return attemptResult{outcome: o}
}

// relayStream relays an SSE stream event by event. Events before the first
// output (message_start, response.created, a role-only chunk: the
// surface's signal says which) are held back: if the upstream fails
// before producing output, nothing reached the client and the request can
// still be replayed on another account.
//
// Once committed, nothing will be replayed: the request body (in.body and
// the attempt's copy, which the transport holds until the stream ends)
// is let go for the rest of the stream.
//
// served, when set, is called once output starts.
func (s *Server) relayStream(ctx context.Context, w *trackingWriter, resp *http.Response, in *inbound, o *weirv1.Outcome, idle idleWatch, body *replayBody, served func(), rl relayed) attemptResult { //nolint:gocognit // one loop over the upstream's events, whose idle, replay and error paths must stay together
	rc := http.NewResponseController(w)
	sc := newSSEScanner(resp.Body)
	signal := rl.sf.signal
	if signal == nil {
		signal = anthropicSignal
	}
	var xl translate.Stream
	if rl.tr != nil {
		xl = rl.tr.stream(in.model, rl.req)
	}
	var (
		held      []byte
		committed bool
		finished  bool
		// used is what the stream reported so far, the latest of each
		// count. A stream cut midway, or one that fails, keeps what it
		// reported before: that is what was delivered.
		used usage
	)
	commit := func() error {
		copyResponseHeaders(w.Header(), resp.Header)
		rl.tr.mark(w.Header(), rl.req)
		w.WriteHeader(resp.StatusCode)
		committed = true
		o.BytesToClient = true
		in.letGo()
		body.release()
		if in.sf.name == surfaceResp.name {
			// The pool's rate-limit event goes first, as the Codex
			// backend's does: over the Responses WebSocket it is all Codex
			// reads of the pool (a WebSocket answer has no headers).
			held = append(s.poolRateLimitsEvent(in), held...)
		}
		if _, err := w.Write(held); err != nil {
			return err
		}
		held = nil
		if served != nil {
			served()
		}
		return rc.Flush()
	}
	// unflushed: events written since the last flush. They are flushed
	// before any read that may wait, so events that arrived together go
	// to the client in one write, as they came, and none waits for the
	// next to arrive.
	unflushed := false
	defer func() {
		if unflushed {
			rc.Flush() //nolint:errcheck // the client may be gone; the outcome is set
		}
	}()
	for {
		if unflushed && !sc.eventBuffered() {
			unflushed = false
			if err := rc.Flush(); err != nil {
				o.Class = weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED
				return attemptResult{outcome: o}
			}
		}
		// The watch times the upstream only: writing to a slow client does
		// not count as the upstream going quiet.
		idle.resume()
		ev, err := sc.next()
		idle.pause()
		err = idle.cause(err)
		if err == nil && malformedEvent(rl.sf, ev) {
			// Garbage is never relayed as if it were an event: before
			// output the attempt failed like a cut connection; after, the
			// client gets weir's error event instead of the garbage.
			err = errMalformedEvent
		}
		if err != nil {
			if ctx.Err() != nil {
				o.Class = weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED
				break
			}
			if finished {
				break
			}
			if !committed {
				setTransport(o, weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, "stream ended before output: ", err)
				return attemptResult{outcome: o, failure: gatewayFailure(in, "upstream stream broke before output")}
			}
			setTransport(o, weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR, "stream cut after output: ", err)
			// Tell the client in its own format instead of ending silently.
			msg := "upstream stream ended unexpectedly"
			if errors.Is(err, errMalformedEvent) {
				msg = "upstream sent a malformed event"
			}
			w.Write(streamCutEvent(in.sf, msg)) //nolint:errcheck // best effort
			rc.Flush()                          //nolint:errcheck // best effort
			break
		}
		sig := signal(ev)
		if !sig.usage.zero() {
			used.merge(sig.usage)
			o.Usage = used.proto()
			s.noteSpend(in, rl.model, o.Usage)
		}
		raw := ev.raw
		if f := sig.failure; f != nil {
			o.ErrorType, o.ErrorMessage, o.Quota = f.errorType, f.message, f.quota
			if !committed {
				o.Class = f.class
				return attemptResult{outcome: o, failure: s.eventFailureResponse(in, resp, ev, f, rl)}
			}
			if xl != nil {
				// The client's own wire's error event, never the target's.
				raw = streamErrorFor(in.sf, f)
			}
			o.Class = weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR
			if f.quota != nil {
				// Output went out, then the quota ran out: the terminal event
				// may become a usage limit once the pool is known to be spent.
				return attemptResult{outcome: o, terminal: raw}
			}
			// The upstream's own error event ends the stream for the client;
			// weir adds nothing after it.
			finished = true
		} else if xl != nil {
			if raw, err = xl.Event(ev.name, ev.data); err != nil {
				// An event the translation cannot carry breaks the stream as
				// garbage would: before output another account may serve.
				if !committed {
					setTransport(o, weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, "stream ended before output: ", errUntranslatableAnswer)
					return attemptResult{outcome: o, failure: gatewayFailure(in, "upstream stream could not be translated")}
				}
				setTransport(o, weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR, "stream cut after output: ", errUntranslatableAnswer)
				w.Write(streamCutEvent(in.sf, "upstream sent an event that could not be translated")) //nolint:errcheck // best effort
				rc.Flush()                                                                            //nolint:errcheck // best effort
				break
			}
		}
		if sig.done {
			finished = true
		}
		if xl == nil && in.sf.name == surfaceResp.name && responsesEventName(ev) == codexRateLimits {
			// The account's standing, never relayed: the commit sends the
			// pool's first, and it takes the place of every later one
			// (an event for an event, the stream's framing kept).
			if !committed {
				continue
			}
			if raw = s.poolRateLimitsEvent(in); raw == nil {
				continue
			}
		}
		if !committed {
			held = append(held, raw...)
			if !sig.output && !sig.done && sig.failure == nil && len(held) < 1<<20 {
				continue
			}
			if err := commit(); err != nil {
				o.Class = weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED
				return attemptResult{outcome: o}
			}
			continue
		}
		if len(raw) == 0 {
			continue // an event the client's wire has no place for
		}
		if _, err := w.Write(raw); err != nil {
			o.Class = weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED
			return attemptResult{outcome: o}
		}
		unflushed = true
	}
	if o.Class == weirv1.OutcomeClass_OUTCOME_CLASS_UNSPECIFIED {
		o.Class = weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS
	}
	return attemptResult{outcome: o}
}

// eventFailureResponse is the plain error answer for an error event that
// arrived before any output: nothing was sent, so the client gets the usual
// shape of an error in its own format.
func (s *Server) eventFailureResponse(in *inbound, resp *http.Response, ev sseEvent, f *eventFailure, rl relayed) *bufferedResponse {
	if rl.tr != nil {
		out := translatedFailure(in.sf.wire, in.requestID, f.status, resp.Header, f)
		rl.tr.mark(out.header, rl.req)
		return out
	}
	h := http.Header{"Content-Type": {"application/json"}}
	for _, k := range []string{"Request-Id", "X-Request-Id"} {
		if v := resp.Header.Values(k); len(v) > 0 {
			h[k] = v
		}
	}
	body := ev.data // an Anthropic error event's data is the error body
	if in.sf.wire == wireOpenAI {
		body = openAIErrorBody(f)
	}
	return &bufferedResponse{status: f.status, header: h, body: body}
}

func isEventStream(h http.Header) bool {
	ct := h.Get("Content-Type")
	return len(ct) >= 17 && ct[:17] == "text/event-stream"
}

// gatewayFailure is weir's own answer for an attempt that got no usable
// response from the upstream.
func gatewayFailure(in *inbound, msg string) *bufferedResponse {
	return &bufferedResponse{status: http.StatusBadGateway, header: http.Header{"Content-Type": {"application/json"}},
		body: gatewayBody(in.sf.wire, in.requestID, msg)}
}

func streamErrorEvent(typ, msg string) []byte {
	return []byte("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"" + typ + "\",\"message\":\"" + msg + "\"}}\n\n")
}

// errStreamIdle cuts an upstream stream that went silent.
var errStreamIdle = errors.New("upstream stream idle")

// Broken answers: each fails the attempt like a cut connection.
var (
	errBodyTooLarge   = errors.New("answer exceeds MaxResponseBytes")
	errMalformedBody  = errors.New("answer is not JSON")
	errMalformedEvent = errors.New("malformed event")
	// errUntranslatableAnswer: the answer does not translate into the
	// client's wire (translation.go).
	errUntranslatableAnswer = errors.New("answer could not be translated")
)

// malformedEvent reports an event no client could read: a line that is
// no SSE field (garbage), data that is not JSON (other than Chat
// Completions' [DONE]), or, on the Anthropic wire, which names every
// event, data without an event name. Comments and empty events are fine.
func malformedEvent(sf surface, ev sseEvent) bool {
	switch {
	case ev.junk:
		return true
	case len(ev.data) == 0:
		return false
	case !validJSON(ev.data):
		return string(ev.data) != "[DONE]"
	}
	// "message" is the SSE default for an event without a name.
	return sf.wire == wireAnthropic && ev.name == "message"
}

// transportFailure classifies a transport failure: its cause, from the
// fixed set (TransportCause), and its text, without the addresses, host
// names and URLs the underlying error carries. Pure.
func transportFailure(err error) (weirv1.TransportCause, string) {
	var (
		dnsErr   *net.DNSError
		opErr    *net.OpError
		netErr   net.Error
		verify   *tls.CertificateVerificationError
		record   tls.RecordHeaderError
		alert    tls.AlertError
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
	)
	switch {
	case errors.Is(err, errStreamIdle):
		return weirv1.TransportCause_TRANSPORT_CAUSE_TIMEOUT, "idle timeout"
	case errors.As(err, &dnsErr):
		// Before timeouts: a lookup that timed out is still the name's.
		switch {
		case dnsErr.IsNotFound:
			return weirv1.TransportCause_TRANSPORT_CAUSE_DNS, "no such host"
		case dnsErr.IsTimeout:
			return weirv1.TransportCause_TRANSPORT_CAUSE_DNS, "lookup timed out"
		}
		return weirv1.TransportCause_TRANSPORT_CAUSE_DNS, "lookup failed"
	case errors.Is(err, syscall.ECONNREFUSED):
		return weirv1.TransportCause_TRANSPORT_CAUSE_REFUSED, "connection refused"
	case errors.As(err, &unknown):
		return weirv1.TransportCause_TRANSPORT_CAUSE_TLS, "certificate signed by an unknown authority"
	case errors.As(err, &hostname):
		return weirv1.TransportCause_TRANSPORT_CAUSE_TLS, "certificate not valid for the host"
	case errors.As(err, &invalid), errors.As(err, &verify):
		return weirv1.TransportCause_TRANSPORT_CAUSE_TLS, "certificate not valid"
	case errors.As(err, &record):
		return weirv1.TransportCause_TRANSPORT_CAUSE_TLS, "the upstream does not speak TLS"
	case errors.As(err, &alert), errors.As(err, &opErr) && opErr.Op == "remote error":
		// crypto/tls reports an alert from the peer as a "remote error".
		return weirv1.TransportCause_TRANSPORT_CAUSE_TLS, "handshake refused by the upstream"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return weirv1.TransportCause_TRANSPORT_CAUSE_RESET, "connection reset"
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		// net/http's word for a fresh connection closed before it could
		// answer (known only by its fixed text).
		strings.Contains(err.Error(), "server closed idle connection"):
		return weirv1.TransportCause_TRANSPORT_CAUSE_RESET, "connection closed"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return weirv1.TransportCause_TRANSPORT_CAUSE_TIMEOUT, timeoutText(err)
	case errors.Is(err, errSSETooLarge), errors.Is(err, errBodyTooLarge),
		errors.Is(err, errMalformedBody), errors.Is(err, errMalformedEvent), errors.Is(err, errUntranslatableAnswer):
		return weirv1.TransportCause_TRANSPORT_CAUSE_OTHER, err.Error()
	}
	return weirv1.TransportCause_TRANSPORT_CAUSE_OTHER, "transport error"
}

// timeoutText says which wait ran out. net/http's own timeouts are known
// only by their fixed texts.
func timeoutText(err error) string {
	var opErr *net.OpError
	switch msg := err.Error(); {
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return "dial timeout"
	case strings.Contains(msg, "awaiting response headers"):
		return "no response headers in time"
	case strings.Contains(msg, "TLS handshake timeout"):
		return "TLS handshake timeout"
	}
	return "timeout"
}

// setTransport records a transport failure on o, its text after where
// (where it happened, "" for the request itself), and returns the text.
// errLeaseLost ends an attempt whose lease the control plane refused to
// renew.
var errLeaseLost = errors.New("the lease lost its place: it lapsed while this worker could not renew it, and the account's places were granted again")

// leaseLost marks an attempt ended by errLeaseLost: before output it fails
// over like a gateway's failure (weir's own, the account is not at fault
// and cools nothing); after, the stream was cut.
func leaseLost(o *weirv1.Outcome) {
	if o.Class == weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR {
		o.Class = weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR
	}
	o.ErrorType, o.TransportCause, o.TransportError = "lease_lost", weirv1.TransportCause_TRANSPORT_CAUSE_UNSPECIFIED, errLeaseLost.Error()
}

func setTransport(o *weirv1.Outcome, class weirv1.OutcomeClass, where string, err error) string {
	cause, text := transportFailure(err)
	o.Class, o.TransportCause, o.TransportError = class, cause, where+text
	return text
}

// trackingWriter records what reached the client.
type trackingWriter struct {
	http.ResponseWriter
	now       func() time.Time
	status    int
	firstByte time.Time
	// beforeHeader, when set, may add to the headers just before the
	// status goes out (the pool's rate-limit headers, poolHeaders).
	beforeHeader func(status int, h http.Header)
}

func (t *trackingWriter) WriteHeader(code int) {
	if t.status == 0 {
		t.status = code
		if t.beforeHeader != nil {
			t.beforeHeader(code, t.Header())
		}
	}
	t.ResponseWriter.WriteHeader(code)
}

func (t *trackingWriter) Write(b []byte) (int, error) {
	if t.status == 0 {
		t.WriteHeader(http.StatusOK)
	}
	if t.firstByte.IsZero() && len(b) > 0 {
		t.firstByte = t.now()
	}
	return t.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush.
func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// idleWatch cuts an upstream answer that stays silent for its timeout:
// its timer closes the answer's body, which ends the read in progress
// without touching the client's request, and sets fired.
type idleWatch struct {
	t       *time.Timer
	timeout time.Duration
	fired   *atomic.Bool
}

func newIdleWatch(timeout time.Duration, body io.Closer) idleWatch {
	w := idleWatch{timeout: timeout, fired: new(atomic.Bool)}
	w.t = time.AfterFunc(timeout, func() {
		w.fired.Store(true)
		body.Close() //nolint:errcheck // the read in progress fails either way
	})
	return w
}

// cause names a read's failure errStreamIdle when the watch cut it.
func (w idleWatch) cause(err error) error {
	if err != nil && w.fired != nil && w.fired.Load() {
		return errStreamIdle
	}
	return err
}

// reader times every read of r.
func (w idleWatch) reader(r io.Reader) io.Reader { return idleReader{w: w, r: r} }

type idleReader struct {
	w idleWatch
	r io.Reader
}

func (r idleReader) Read(p []byte) (int, error) {
	r.w.resume()
	n, err := r.r.Read(p)
	r.w.pause()
	return n, err
}

func (w idleWatch) resume() {
	if w.t != nil {
		w.t.Reset(w.timeout)
	}
}

func (w idleWatch) pause() {
	if w.t != nil {
		w.t.Stop()
	}
}
