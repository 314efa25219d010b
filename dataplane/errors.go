package dataplane

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// apiError is an error weir itself answers, in the Anthropic wire format:
// {"type":"error","error":{"type":T,"message":M},"request_id":R}.
type apiError struct {
	status  int
	typ     string
	message string
	// retryAfter, when positive, is sent as integer seconds.
	retryAfter time.Duration
	// final tells SDK clients not to retry (x-should-retry: false).
	final bool
	// code is the OpenAI error code, when the OpenAI format needs one that
	// the type does not imply; openAIType the OpenAI error type, when it is
	// not the one typ maps to.
	code, openAIType string
}

func (e *apiError) Error() string { return e.typ + ": " + e.message }

func errInvalidRequest(msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", message: msg, final: true}
}

func errAuthentication(msg string) *apiError {
	return &apiError{status: http.StatusUnauthorized, typ: "authentication_error", message: msg, final: true}
}

// errBodyTimeout answers a client that did not send its whole body in
// time (a stalled or slow-loris client): its request was never started.
func errBodyTimeout(limit time.Duration) *apiError {
	return &apiError{status: http.StatusRequestTimeout, typ: "request_timeout",
		message: "request body not received within " + limit.String(), retryAfter: time.Second}
}

// errBodyIdle answers a client whose body stopped arriving.
func errBodyIdle(idle time.Duration) *apiError {
	return &apiError{status: http.StatusRequestTimeout, typ: "request_timeout",
		message: "request body stopped arriving: nothing received for " + idle.String(), retryAfter: time.Second}
}

func errTooLarge(limit int64) *apiError {
	size := strconv.FormatInt(limit, 10) + " bytes"
	if limit >= 1<<20 && limit%(1<<20) == 0 {
		size = strconv.FormatInt(limit>>20, 10) + " MiB"
	}
	return &apiError{status: http.StatusRequestEntityTooLarge, typ: "request_too_large",
		message: "request body exceeds the " + size + " limit", final: true}
}

func errNotFound(msg string) *apiError {
	return &apiError{status: http.StatusNotFound, typ: "not_found_error", message: msg, final: true}
}

// writeAPIError writes e in the Anthropic format; nothing may have been
// written to w before.
func writeAPIError(w http.ResponseWriter, requestID string, e *apiError) {
	writeError(w, wireAnthropic, requestID, e)
}

// anthropicErrorJSON is the Anthropic error body.
func anthropicErrorJSON(typ, message, requestID string) []byte {
	b, _ := json.Marshal(map[string]any{
		"type":       "error",
		"error":      map[string]string{"type": typ, "message": message},
		"request_id": requestID,
	})
	return b
}

// retryAfterSeconds renders a wait as integer seconds, rounded up, at
// least 1: clients parse Retry-After as an integer.
func retryAfterSeconds(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	return strconv.FormatInt(max(s, 1), 10)
}
