package dataplane

import (
	"encoding/json"
	"net/http"
	"strings"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// classify maps an upstream status (and error type, when the body or an
// SSE error event named one) to the outcome class the control plane
// decides on. Pure.
func classify(status int, errorType string) weirv1.OutcomeClass {
	switch {
	case status >= 200 && status < 300:
		if errorType != "" {
			return classifyErrorType(errorType)
		}
		return weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		return weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR
	case status == http.StatusTooManyRequests:
		return weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED
	case status == http.StatusBadRequest, status == http.StatusNotFound,
		status == http.StatusRequestEntityTooLarge, status == http.StatusUnprocessableEntity:
		return weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR
	case status == http.StatusInternalServerError, status == http.StatusServiceUnavailable, status == 529:
		return weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED
	case status == http.StatusBadGateway, status == http.StatusGatewayTimeout:
		// A gateway between weir and the provider failed: neither the
		// account's fault nor the provider's load.
		return weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR
	}
	return weirv1.OutcomeClass_OUTCOME_CLASS_UPSTREAM_ERROR
}

// classifyErrorType reads an error that arrived inside a 200 stream.
func classifyErrorType(t string) weirv1.OutcomeClass {
	switch t {
	case "overloaded_error", "api_error":
		return weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED
	case "timeout_error":
		return weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR
	case "rate_limit_error":
		return weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED
	case "authentication_error", "permission_error":
		return weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR
	case "invalid_request_error", "not_found_error", "request_too_large":
		return weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR
	}
	return weirv1.OutcomeClass_OUTCOME_CLASS_UPSTREAM_ERROR
}

// statusForErrorType is the HTTP status weir answers with when an error
// that arrived as an SSE event before any output is passed on as a plain
// HTTP error (nothing was sent yet, so the client gets the usual shape).
func statusForErrorType(t string) int {
	switch t {
	case "overloaded_error":
		return 529
	case "rate_limit_error":
		return http.StatusTooManyRequests
	case "authentication_error":
		return http.StatusUnauthorized
	case "permission_error":
		return http.StatusForbidden
	case "invalid_request_error":
		return http.StatusBadRequest
	case "not_found_error":
		return http.StatusNotFound
	case "request_too_large":
		return http.StatusRequestEntityTooLarge
	case "timeout_error":
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// errorTypeOf reads error.type from an Anthropic error body or event.
func errorTypeOf(body []byte) string {
	var e struct {
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	return e.Error.Type
}

// decisionHeaders picks the upstream response headers that matter to the
// control plane's decisions.
func decisionHeaders(h http.Header) map[string]string {
	out := make(map[string]string, 8)
	for k, v := range h {
		if len(v) == 0 || !decisionHeader(k) {
			continue
		}
		out[strings.ToLower(k)] = v[0]
	}
	return out
}

// decisionHeader says whether a response header matters to decisions.
// Keys arrive canonicalized by net/http; EqualFold keeps a hand-built
// header map working too, without lowering every key (this runs on every
// answer).
func decisionHeader(k string) bool {
	if strings.EqualFold(k, "Retry-After") || strings.EqualFold(k, "Retry-After-Ms") ||
		strings.EqualFold(k, "X-Should-Retry") || strings.EqualFold(k, "Request-Id") {
		return true
	}
	return hasPrefixFold(k, "Anthropic-Ratelimit-") || hasPrefixFold(k, "X-Codex-")
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// usage reads token counts from a non-streamed message or from the
// message_start / message_delta events of a stream.
type usage struct {
	input, output int64
}

// fromMessage reads a non-streamed message's counts; the error is
// json.Unmarshal's (a *json.SyntaxError: the body is not JSON at all).
func (u *usage) fromMessage(body []byte) error {
	var m struct {
		Usage struct {
			InputTokens  int64 `json:"input_tokens"`
			OutputTokens int64 `json:"output_tokens"`
		} `json:"usage"`
	}
	err := json.Unmarshal(body, &m)
	if err == nil {
		u.input, u.output = m.Usage.InputTokens, m.Usage.OutputTokens
	}
	return err
}

func (u *usage) fromEvent(ev sseEvent) {
	switch ev.name {
	case "message_start":
		var m struct {
			Message struct {
				Usage struct {
					InputTokens  int64 `json:"input_tokens"`
					OutputTokens int64 `json:"output_tokens"`
				} `json:"usage"`
			} `json:"message"`
		}
		if json.Unmarshal(ev.data, &m) == nil {
			u.input, u.output = m.Message.Usage.InputTokens, m.Message.Usage.OutputTokens
		}
	case "message_delta":
		var m struct {
			Usage struct {
				OutputTokens int64 `json:"output_tokens"`
			} `json:"usage"`
		}
		if json.Unmarshal(ev.data, &m) == nil && m.Usage.OutputTokens > 0 {
			u.output = m.Usage.OutputTokens
		}
	}
}

// anthropicSignal reads one event of an Anthropic messages stream. Output
// starts with the first content_block_delta (message_start,
// content_block_start and ping change nothing the client shows);
// message_stop ends it; an error event fails it.
func anthropicSignal(ev sseEvent) streamSignal {
	var sig streamSignal
	var u usage
	u.fromEvent(ev)
	sig.inputTokens, sig.outputTokens = u.input, u.output
	switch ev.name {
	case "content_block_delta":
		sig.output = true
	case "message_stop":
		sig.done = true
	case "error":
		t := errorTypeOf(ev.data)
		sig.failure = &eventFailure{class: classifyErrorType(t), errorType: t,
			message: errorMessageOf(ev.data), status: statusForErrorType(t)}
	}
	return sig
}
