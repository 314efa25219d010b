package sim

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// statusClientClosed is logged for an attempt whose client went away
// before the simulator answered (nginx's convention).
const statusClientClosed = 499

// applyFault answers the attempt the way fault f says, in the real API's
// wire shapes.
func (x *exchange) applyFault(f Fault) {
	if slices.Contains(misbehaviourKinds, f.Kind) {
		x.misbehave(f, func() []byte { b, _ := json.Marshal(x.message()); return b }, x.stream)
		return
	}
	switch f.Kind {
	case FaultRateLimit:
		x.rateLimit(f)
	case FaultOverloaded:
		x.failRetryable(f, statusOverloaded, "overloaded_error", "Overloaded")
	case FaultUnavailable:
		x.failRetryable(f, http.StatusServiceUnavailable, "api_error", "Service Unavailable")
	case FaultAPIError:
		x.failRetryable(f, http.StatusInternalServerError, "api_error", "Internal server error")
	case FaultRevoked:
		x.fail(f.Kind, http.StatusUnauthorized, "authentication_error", revokedMessage(x.acct))
	case FaultBadRequest:
		x.fail(f.Kind, http.StatusBadRequest, "invalid_request_error", "Simulated invalid request.")
	case FaultOverloadedEvent, FaultErrorAfterContent:
		// Without a stream there is nowhere to put an event; the real API
		// answers such a request with a 529.
		if !x.req.Stream {
			x.failRetryable(f, statusOverloaded, "overloaded_error", "Overloaded")
			return
		}
		x.record(f.Kind, http.StatusOK)
		x.stream(&f)
	case FaultUsageLimitReached, FaultInsufficientQuota, FaultUsageLimitEvent, FaultUsageLimitAfterOutput,
		FaultGoogleQuotaExhausted, FaultGoogleRateLimit:
		// The OpenAI and Google quota faults look like a plain 429 on the
		// Messages API.
		x.rateLimit(f)
	case FaultAtCapacityAfterOutput:
		// The overloaded event after some content.
		if !x.req.Stream {
			x.failRetryable(f, statusOverloaded, "overloaded_error", "Overloaded")
			return
		}
		x.record(f.Kind, http.StatusOK)
		ev := f
		ev.Kind = FaultErrorAfterContent
		x.stream(&ev)
	case FaultAtCapacityEvent, FaultAtCapacityErrorEvent:
		// On the Messages API, at capacity is the overloaded event.
		if !x.req.Stream {
			x.failRetryable(f, statusOverloaded, "overloaded_error", "Overloaded")
			return
		}
		x.record(f.Kind, http.StatusOK)
		ev := f
		ev.Kind = FaultOverloadedEvent
		x.stream(&ev)
	case FaultDropMidStream:
		x.record(f.Kind, http.StatusOK)
		if x.req.Stream {
			x.stream(&f)
			return
		}
		x.truncatedMessage()
	case FaultDropConnection:
		x.record(f.Kind, 0)
		x.dropConnection()
	case FaultSlowHeaders:
		if !pause(x.r.Context(), time.Duration(f.Delay)) {
			x.record(f.Kind, statusClientClosed)
			return
		}
		x.record(f.Kind, http.StatusOK)
		x.succeed()
	default:
		// Validation keeps unknown kinds out of every queue.
		panic("sim: unvalidated fault kind " + f.Kind)
	}
}

// statusOverloaded is Anthropic's 529.
const statusOverloaded = 529

// failRetryable answers with an error the client may retry: retry-after
// when the fault sets one (429, 529, 503) and x-should-retry: true.
func (x *exchange) failRetryable(f Fault, status int, errType, message string) {
	h := x.w.Header()
	if f.RetryAfter > 0 && status != http.StatusInternalServerError {
		h.Set("retry-after", strconv.Itoa(f.RetryAfter))
	}
	h.Set("x-should-retry", "true")
	x.fail(f.Kind, status, errType, message)
}

// rateLimit answers 429. With f.Unified it is a subscription limit with the
// unified rejection headers; without, a burst limit, which carries no
// unified status (API keys report their exhausted request budget instead).
func (x *exchange) rateLimit(f Fault) {
	now := x.s.now()
	switch {
	case f.Unified != nil:
		setUnified(x.w.Header(), now, x.s.unifiedView(x.acct, x.req.Model, now, false), f.Unified)
	case x.acct.kind == KindAPIKey:
		reset := now.Add(time.Minute)
		if f.RetryAfter > 0 {
			reset = now.Add(time.Duration(f.RetryAfter) * time.Second)
		}
		setAPIKeyLimits(x.w.Header(), apiKeyUsage{reset: reset})
	}
	x.failRetryable(f, http.StatusTooManyRequests, "rate_limit_error", rateLimitMessage)
}

// rateLimitMessage is the message of every 429 rate_limit_error.
const rateLimitMessage = "This request would exceed your account's rate limit. Please try again later."

// usageLimited answers 429 when a live usage window the request draws on
// is full: the unified rejection headers, retry-after until the
// representative claim resets, x-should-retry: true. It reports whether it
// answered.
func (x *exchange) usageLimited() bool {
	if x.acct == nil {
		return false
	}
	now := x.s.now()
	v := x.s.unifiedView(x.acct, x.req.Model, now, true)
	if !v.rejected {
		return false
	}
	h := x.w.Header()
	rep := setUnifiedRejected(h, v)
	h.Set("retry-after", strconv.FormatInt(secondsUntil(now, rep.reset), 10))
	h.Set("x-should-retry", "true")
	x.fail(outcomeUsageLimit, http.StatusTooManyRequests, "rate_limit_error", rateLimitMessage)
	return true
}

// secondsUntil is t-now in whole seconds, rounded up, at least 1.
func secondsUntil(now, t time.Time) int64 {
	d := t.Sub(now)
	return max(1, int64((d+time.Second-1)/time.Second))
}

// truncatedMessage sends the headers and half of a non-streamed reply, then
// aborts the connection.
func (x *exchange) truncatedMessage() {
	b, _ := json.Marshal(x.message())
	x.setRateLimitHeaders()
	x.w.Header().Set("Content-Type", "application/json")
	x.w.WriteHeader(http.StatusOK)
	x.w.Write(b[:len(b)/2])                 //nolint:errcheck // the connection is aborted next anyway
	http.NewResponseController(x.w).Flush() //nolint:errcheck // as above
	panic(http.ErrAbortHandler)
}

// dropConnection closes the connection before any header is written, so
// the client sees EOF or a reset. Where the connection cannot be hijacked
// (HTTP/2), aborting the handler resets the stream instead.
func (x *exchange) dropConnection() {
	conn, _, err := http.NewResponseController(x.w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	x.s.endAttempt(x.r)
	conn.Close()
}
