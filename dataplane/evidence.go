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

// usage is what an answer reported it used, in weirv1.TokenUsage's
// vocabulary: input is the input neither read from nor written to the
// prompt cache (the OpenAI wires count their cached tokens in their
// input, and are read less them), output includes reasoning. All the
// input a request sent is input + cacheRead + cacheCreation.
type usage struct {
	input, output, cacheRead, cacheCreation, reasoning int64
}

// zero reports an answer that reported nothing.
func (u usage) zero() bool { return u == usage{} }

// merge takes the latest report: each count v carries (nonzero) replaces
// u's, the others stay. A Messages stream reports its input and cache
// counts in message_start and its output in message_delta (which, in
// newer API versions, repeats the input and cache counts, cumulative);
// an OpenAI stream reports all of it once, at its end.
func (u *usage) merge(v usage) {
	for _, f := range []struct{ to, from *int64 }{
		{&u.input, &v.input}, {&u.output, &v.output}, {&u.cacheRead, &v.cacheRead},
		{&u.cacheCreation, &v.cacheCreation}, {&u.reasoning, &v.reasoning},
	} {
		if *f.from > 0 {
			*f.to = *f.from
		}
	}
}

// proto is u as an Outcome's usage; nil when it reported nothing.
func (u usage) proto() *weirv1.TokenUsage {
	if u.zero() {
		return nil
	}
	return &weirv1.TokenUsage{InputTokens: u.input, OutputTokens: u.output, CacheReadTokens: u.cacheRead,
		CacheCreationTokens: u.cacheCreation, ReasoningTokens: u.reasoning}
}

// anthropicUsage is an Anthropic usage object: a message's, message_start's
// (message.usage) or message_delta's (usage: output_tokens, and in newer
// API versions the input and cache counts again, cumulative, or null).
type anthropicUsage struct {
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

// scanUsage reads the object next in sc as encoding/json would, where
// its counts are plain (decodeUsage).
func (a *anthropicUsage) scanUsage(sc *jsonScanner) bool {
	counts := [...]*int64{&a.InputTokens, &a.OutputTokens, &a.CacheCreationInputTokens, &a.CacheReadInputTokens}
	return sc.countsObject(anthropicUsageFields, func(f int) bool { return sc.int64OrNull(counts[f]) })
}

// anthropicUsageFields are anthropicUsage's keys, in scanUsage's order.
var anthropicUsageFields = [][]byte{[]byte("input_tokens"), []byte("output_tokens"),
	[]byte("cache_creation_input_tokens"), []byte("cache_read_input_tokens")}

// usage is the object's counts, which are weir's already (Anthropic's
// input_tokens leaves the cache out); a negative count is none.
func (a *anthropicUsage) usage() usage {
	return usage{input: max(a.InputTokens, 0), output: max(a.OutputTokens, 0),
		cacheRead: max(a.CacheReadInputTokens, 0), cacheCreation: max(a.CacheCreationInputTokens, 0)}
}

// fromMessage reads a non-streamed message's counts; the error is
// json.Unmarshal's (a *json.SyntaxError: the body is not JSON at all),
// though only the usage object is decoded (decodeUsage).
func (u *usage) fromMessage(body []byte) error {
	var a anthropicUsage
	err := decodeUsage(body, &a)
	if err == nil {
		*u = a.usage()
	}
	return err
}

// fromEvent takes the counts of a Messages stream's message_start and
// message_delta events, the latest of each (merge).
func (u *usage) fromEvent(ev sseEvent) {
	var m struct {
		Message struct {
			Usage anthropicUsage `json:"usage"`
		} `json:"message"`
		Usage anthropicUsage `json:"usage"`
	}
	switch ev.name {
	case "message_start":
		if json.Unmarshal(ev.data, &m) == nil {
			u.merge(m.Message.Usage.usage())
		}
	case "message_delta":
		if json.Unmarshal(ev.data, &m) == nil {
			u.merge(m.Usage.usage())
		}
	}
}

// anthropicSignal reads one event of an Anthropic messages stream. Output
// starts with the first content_block_delta (message_start,
// content_block_start and ping change nothing the client shows);
// message_stop ends it; an error event fails it.
func anthropicSignal(ev sseEvent) streamSignal {
	var sig streamSignal
	sig.usage.fromEvent(ev)
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
