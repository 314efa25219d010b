package dataplane

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/translate"
)

// translation is one attempt's crossing from the client's wire to its
// account's, when they differ: the control plane leases an account of the
// other wire's provider only for an alias that allows it (Alias.translate),
// and the lease's provider says which crossing it is. The translators are
// internal/translate's, pure; this is where the request path meets them.
type translation struct {
	// name labels attempt records and metrics: "messages>responses".
	name string
	// target is the surface the upstream speaks: its path, its evidence
	// (errors, stream signals, usage) and its events.
	target surface
	// request turns the client's body into the target's for model, with
	// cacheKey as the target's prompt cache key.
	request func(body []byte, model, cacheKey string) (translate.Request, error)
	// whole turns a whole answer back into the client's, for model (the
	// one the client asked for) and the request as translated.
	whole func(body []byte, model string, req translate.Request) ([]byte, error)
	// stream starts the translation of a stream's events.
	stream func(model string, req translate.Request) translate.Stream
}

// translationFor is the crossing an attempt on provider's account makes
// for a client on sf; nil when the account speaks the client's wire.
// Messages go to Codex accounts as Responses (the backend's only API) and
// to OpenAI accounts as Chat Completions (what every OpenAI-compatible
// endpoint speaks).
func translationFor(sf surface, provider weirv1.Provider) *translation {
	switch {
	case sf.wire == wireAnthropic && provider == weirv1.Provider_PROVIDER_OPENAI:
		return &messagesToChat
	case sf.wire == wireAnthropic && provider == weirv1.Provider_PROVIDER_CODEX:
		return &messagesToResponses
	case sf.api == weirv1.Surface_SURFACE_RESPONSES && provider == weirv1.Provider_PROVIDER_ANTHROPIC:
		return &responsesToMessages
	case sf.api == weirv1.Surface_SURFACE_CHAT_COMPLETIONS && provider == weirv1.Provider_PROVIDER_ANTHROPIC:
		return &chatToMessages
	}
	return nil
}

var (
	messagesToChat = translation{name: "messages>chat_completions", target: surfaceChat,
		request: translate.MessagesToChat, whole: translate.ChatToMessages,
		stream: func(model string, _ translate.Request) translate.Stream { return translate.NewChatStream(model) }}
	messagesToResponses = translation{name: "messages>responses", target: surfaceResp,
		request: translate.MessagesToResponses, whole: translate.ResponsesToMessages,
		stream: translate.NewResponsesStream}
	responsesToMessages = translation{name: "responses>messages", target: surfaceMessages,
		request: translate.ResponsesToMessagesRequest, whole: translate.MessagesToResponsesAnswer,
		stream: translate.NewMessagesToResponsesStream}
	chatToMessages = translation{name: "chat_completions>messages", target: surfaceMessages,
		request: translate.ChatToMessagesRequest, whole: translate.MessagesToChatAnswer,
		stream: translate.NewMessagesToChatStream}
)

// translationName is the crossing's name for records; "" for none.
func (t *translation) translationName() string {
	if t == nil {
		return ""
	}
	return t.name
}

// upstreamSurface is the surface the attempt's upstream speaks.
func (t *translation) upstreamSurface(client surface) surface {
	if t == nil {
		return client
	}
	return t.target
}

// cacheKeyFor is the target's prompt cache key for a session: derived,
// not the client's own identifiers, and the same for every turn of it so
// that a translated session reads the target's cache.
func cacheKeyFor(session string) string {
	if session == "" {
		return ""
	}
	return "weir-" + hashKey("session:" + session)[:32]
}

// errUntranslatable answers a request the target wire cannot carry: a
// 400 naming what, in the client's format, never a silent drop.
func errUntranslatable(t *translation, err error) *apiError {
	var u *translate.Unsupported
	if errors.As(err, &u) {
		return errInvalidRequest("weir: this request is served through translation (" + t.name + "), and the target cannot carry " + u.Feature + ": send it without that, or use a model its own provider serves")
	}
	return errInvalidRequest("weir: this request could not be translated (" + t.name + "): " + err.Error())
}

// translatedFailure is an upstream failure of the account's wire in the
// client's: its class sets the type and status (the rate limit, overload
// and client errors the client's own SDK knows), its message is kept, and
// so is the upstream's retry advice.
func translatedFailure(wr wire, requestID string, status int, h http.Header, f *eventFailure) *bufferedResponse {
	e := &apiError{status: status, typ: "api_error", message: f.message}
	switch f.class {
	case weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED:
		e.status, e.typ = http.StatusTooManyRequests, "rate_limit_error"
		if q := f.quota; q != nil && q.GetKind() == weirv1.QuotaKind_QUOTA_KIND_CODEX_USAGE_LIMIT {
			e.openAIType, e.code = "usage_limit_reached", "usage_limit_reached"
		}
	case weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED:
		e.status, e.typ = 529, "overloaded_error"
	case weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR:
		e.typ, e.final = "invalid_request_error", true
		switch status {
		case http.StatusNotFound:
			e.typ = "not_found_error"
		case http.StatusRequestEntityTooLarge:
			e.typ = "request_too_large"
		}
		if status < 400 || status > 499 {
			e.status = http.StatusBadRequest
		}
	case weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR:
		e.typ = "authentication_error"
	default:
		e.status = http.StatusInternalServerError
	}
	if e.message == "" {
		e.message = "upstream error " + strconv.Itoa(status)
	}
	out := errorResponse(wr, requestID, e)
	for _, k := range []string{"Retry-After", "Retry-After-Ms", "Request-Id", "X-Request-Id"} {
		if v := h.Values(k); len(v) > 0 {
			out.header[k] = v
		}
	}
	if v := h.Get("X-Should-Retry"); v != "" {
		out.header.Set("X-Should-Retry", v)
	}
	return out
}

// streamErrorFor is an upstream error event of the account's wire as the
// client's terminal event, after output.
func streamErrorFor(sf surface, f *eventFailure) []byte {
	switch sf.api {
	case weirv1.Surface_SURFACE_RESPONSES:
		code := "server_error"
		switch f.class {
		case weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED:
			code = "rate_limit_exceeded"
		case weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED:
			code = "server_is_overloaded"
		case weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR:
			code = "invalid_request"
		}
		b, _ := json.Marshal(map[string]any{"type": "response.failed", "response": map[string]any{
			"status": "failed", "error": map[string]any{"code": code, "message": f.message}}})
		return []byte("event: response.failed\ndata: " + string(b) + "\n\n")
	case weirv1.Surface_SURFACE_CHAT_COMPLETIONS:
		typ, code := openAIErrorKind(&apiError{typ: anthropicTypeFor(f.class)})
		return []byte("data: " + string(openAIErrorJSON(f.message, typ, code)) + "\n\n")
	}
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": anthropicTypeFor(f.class), "message": f.message}})
	return []byte("event: error\ndata: " + string(b) + "\n\n")
}

// anthropicTypeFor names an outcome class as an Anthropic error type.
func anthropicTypeFor(c weirv1.OutcomeClass) string {
	switch c {
	case weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED:
		return "rate_limit_error"
	case weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED:
		return "overloaded_error"
	case weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR:
		return "invalid_request_error"
	case weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR:
		return "authentication_error"
	}
	return "api_error"
}

// mark says on an answer's headers that it was translated, and what the
// translation left out (translate.Request.Dropped): never silently.
func (t *translation) mark(h http.Header, req translate.Request) {
	if t == nil {
		return
	}
	h.Set("Weir-Translation", t.name)
	if len(req.Dropped) > 0 {
		h.Set("Weir-Translation-Dropped", strings.Join(req.Dropped, ", "))
	}
}

// writeTokenEstimate answers count_tokens for a target that has no count:
// an estimate, a token per four bytes of the request's text (its strings:
// the prompt, messages and tool schemas), marked as one.
func writeTokenEstimate(w http.ResponseWriter, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Weir-Token-Count", "estimate")
	b, _ := json.Marshal(map[string]int64{"input_tokens": estimateTokens(body)})
	w.WriteHeader(http.StatusOK)
	w.Write(b) //nolint:errcheck // the client may be gone
}

// estimateTokens is a quarter of the bytes of every string in body (a
// JSON request), rounded up; at least 1.
func estimateTokens(body []byte) int64 {
	dec := json.NewDecoder(bytes.NewReader(body))
	var n int64
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		if s, ok := tok.(string); ok {
			n += int64(len(s))
		}
	}
	return max(1, (n+3)/4)
}

// translated is the request translated by t for model: translated once
// and kept for the request's next attempts (a held request is replayed
// many times, on the same target as often as not). A WebSocket turn,
// which carries only its new items, is put together whole first.
func (in *inbound) translated(t *translation, model string) (translate.Request, error) {
	key := t.name + " " + model
	if in.xlated != nil && in.xlated.key == key {
		return in.xlated.req, nil
	}
	src := in.body
	if in.history != nil {
		var err error
		if src, err = in.history.expand(in.body); err != nil {
			return translate.Request{}, err
		}
	}
	req, err := t.request(src, model, cacheKeyFor(in.session))
	if err != nil {
		return translate.Request{}, err
	}
	in.xlated = &translatedBody{key: key, req: req}
	return req, nil
}

// translatedBody is a request's last translation, and for which
// crossing and model.
type translatedBody struct {
	key string
	req translate.Request
}
