package dataplane

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// wire is the error and stream format a client speaks.
type wire int

const (
	// wireAnthropic: /v1/messages and its siblings.
	wireAnthropic wire = iota
	// wireOpenAI: /v1/responses and /v1/chat/completions.
	wireOpenAI
)

// surface is one client endpoint weir serves.
type surface struct {
	// name labels metrics and route events.
	name string
	wire wire
	// api is what Acquire is told: it decides the providers.
	api weirv1.Surface
	// suffix is the upstream path under an OpenAI or Codex account's base
	// URL ("" for Anthropic, where the client's path is kept).
	suffix string
	// signal reads one upstream stream event; nil for endpoints that never
	// stream.
	signal func(sseEvent) streamSignal
}

var (
	surfaceMessages = surface{name: "messages", wire: wireAnthropic, api: weirv1.Surface_SURFACE_MESSAGES, signal: anthropicSignal}
	surfaceCount    = surface{name: "count_tokens", wire: wireAnthropic, api: weirv1.Surface_SURFACE_MESSAGES}
	surfaceModels   = surface{name: "models", wire: wireAnthropic, api: weirv1.Surface_SURFACE_MESSAGES}
	surfaceResp     = surface{name: "responses", wire: wireOpenAI, api: weirv1.Surface_SURFACE_RESPONSES,
		suffix: "/responses", signal: responsesSignal}
	surfaceChat = surface{name: "chat_completions", wire: wireOpenAI, api: weirv1.Surface_SURFACE_CHAT_COMPLETIONS,
		suffix: "/chat/completions", signal: chatSignal}
)

// spendsTokens says whether the surface's answers use tokens (and report
// them): the surfaces that generate, which are those that stream;
// count_tokens and the model list use none.
func (sf surface) spendsTokens() bool { return sf.signal != nil }

// upstreamPath is where an attempt goes under the lease's base URL: the
// client's own path for Anthropic; for OpenAI the surface's path under the
// versioned base (https://api.openai.com/v1 + /responses); for Codex the
// backend's (https://chatgpt.com/backend-api + /codex/responses).
func (sf surface) upstreamPath(clientPath string, p weirv1.Provider) string {
	switch p {
	case weirv1.Provider_PROVIDER_CODEX:
		return "/codex" + sf.suffix
	case weirv1.Provider_PROVIDER_OPENAI:
		return sf.suffix
	}
	return clientPath
}

// writeError writes e in the client's wire format; nothing may have been
// written to w before.
func writeError(w http.ResponseWriter, wr wire, requestID string, e *apiError) {
	errorResponse(wr, requestID, e).write(w)
}

// errorResponse is e as an answer in the wire's format.
func errorResponse(wr wire, requestID string, e *apiError) *bufferedResponse {
	status, body := e.status, anthropicErrorJSON(e.typ, e.message, requestID)
	if wr == wireOpenAI {
		if status == 529 {
			// 529 is Anthropic's; OpenAI clients know overload as 503.
			status = http.StatusServiceUnavailable
		}
		typ, code := openAIErrorKind(e)
		body = openAIErrorJSON(e.message, typ, code)
	}
	h := http.Header{"Content-Type": {"application/json"}}
	if e.retryAfter > 0 {
		h.Set("Retry-After", retryAfterSeconds(e.retryAfter))
	}
	h.Set("X-Should-Retry", strconv.FormatBool(!e.final))
	return &bufferedResponse{status: status, header: h, body: body}
}

// openAIErrorJSON is the OpenAI error body; code is nil when there is none.
func openAIErrorJSON(message, typ string, code any) []byte {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": message, "type": typ, "param": nil, "code": code}})
	return b
}

// openAIErrorKind names weir's own errors the way OpenAI does: a type and
// a code (nil when there is none).
func openAIErrorKind(e *apiError) (typ string, code any) {
	if e.code != "" {
		code = e.code
	}
	if e.openAIType != "" {
		return e.openAIType, code
	}
	switch e.typ {
	case "authentication_error":
		if code == nil {
			code = "invalid_api_key"
		}
		return "invalid_request_error", code
	case "invalid_request_error", "request_too_large", "not_found_error", "permission_error":
		return "invalid_request_error", code
	case "overloaded_error":
		if code == nil {
			code = "server_is_overloaded"
		}
		return "server_error", code
	case "rate_limit_error":
		return "rate_limit_exceeded", code
	}
	return "server_error", code
}

// openAIErrorBody is an OpenAI error body for an upstream failure that
// arrived as a stream event before any output, sent as a plain error.
func openAIErrorBody(f *eventFailure) []byte {
	typ := "server_error"
	switch f.class {
	case weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED:
		typ = "rate_limit_exceeded"
		if f.quota != nil && f.quota.GetKind() == weirv1.QuotaKind_QUOTA_KIND_CODEX_USAGE_LIMIT {
			typ = "usage_limit_reached"
		}
		if f.quota != nil && f.quota.GetKind() == weirv1.QuotaKind_QUOTA_KIND_OPENAI_INSUFFICIENT_QUOTA {
			typ = "insufficient_quota"
		}
	case weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR:
		typ = "invalid_request_error"
	case weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR:
		typ = "invalid_request_error"
	}
	e := map[string]any{"message": f.message, "type": typ, "param": nil, "code": nilIfEmpty(f.errorType)}
	if q := f.quota; q != nil && q.GetResetsAt() != nil {
		e["resets_at"] = q.GetResetsAt().AsTime().Unix()
	}
	if q := f.quota; q != nil && q.GetResetAfter() != nil {
		e["resets_in_seconds"] = int64(q.GetResetAfter().AsDuration() / time.Second)
	}
	b, _ := json.Marshal(map[string]any{"error": e})
	return b
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// streamCutEvent is weir's terminal event for a stream the upstream cut
// after output reached the client: the client hears of the failure in its
// own format instead of a silent end.
func streamCutEvent(sf surface, msg string) []byte {
	switch sf.api {
	case weirv1.Surface_SURFACE_RESPONSES:
		// Codex retries a failed response (not server_is_overloaded, which
		// it takes as final): server_error says the fault was on the way.
		b, _ := json.Marshal(map[string]any{"type": "response.failed", "response": map[string]any{
			"status": "failed", "error": map[string]any{"code": "server_error", "message": msg}}})
		return []byte("event: response.failed\ndata: " + string(b) + "\n\n")
	case weirv1.Surface_SURFACE_CHAT_COMPLETIONS:
		return []byte("data: " + string(openAIErrorJSON(msg, "server_error", "server_error")) + "\n\n")
	}
	return streamErrorEvent("api_error", msg)
}

// gatewayBody is weir's own error body for an attempt that got no usable
// response, in the client's format.
func gatewayBody(wr wire, requestID, msg string) []byte {
	if wr == wireOpenAI {
		return openAIErrorJSON("weir: "+msg, "server_error", "upstream_error")
	}
	return anthropicErrorJSON("api_error", "weir: "+msg, requestID)
}

// errorTypeFor reads the error type of a held failure body in either
// format: the Anthropic error.type, else the OpenAI error.code, else its
// error.type.
func errorTypeFor(body []byte) string {
	var e struct {
		Error struct {
			Type string `json:"type"`
			Code any    `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	if c, ok := e.Error.Code.(string); ok && c != "" {
		return c
	}
	return e.Error.Type
}

// errorMessageOf reads error.message from an error body in either format,
// as one line of at most 300 bytes without anything that looks like a
// secret.
func errorMessageOf(body []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil {
		return ""
	}
	return upstreamMessageLine(e.Error.Message)
}
