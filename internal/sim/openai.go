package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// OpenAI-side account kinds.
const (
	// KindChatGPT is a ChatGPT/Codex login: a Bearer access token plus the
	// chatgpt-account-id header, served on /backend-api/codex/responses.
	KindChatGPT = "chatgpt"
	// KindOpenAIKey is an OpenAI API key (Bearer sk-…), served on
	// /v1/responses and /v1/chat/completions.
	KindOpenAIKey = "openai_key"
)

// Fault kinds of the OpenAI surfaces.
const (
	// FaultUsageLimitReached is the Codex quota: 429 usage_limit_reached
	// with resets_in_seconds = RetryAfter (default 3600).
	FaultUsageLimitReached = "usage_limit_reached"
	// FaultAtCapacityEvent is a 200 stream that fails right after
	// response.created with server_is_overloaded (503 without a stream).
	FaultAtCapacityEvent = "at_capacity_event"
	// FaultInsufficientQuota is OpenAI's 429 insufficient_quota.
	FaultInsufficientQuota = "insufficient_quota"
	// FaultUsageLimitEvent is the Codex quota inside a 200 stream:
	// response.failed with code usage_limit_reached right after
	// response.created (on chat, a data: {"error":…} line). Without a
	// stream it is usage_limit_reached.
	FaultUsageLimitEvent = "usage_limit_event"
	// FaultUsageLimitAfterOutput is usage_limit_event after AfterDeltas
	// (default 2) text deltas: the quota ran out mid-answer.
	FaultUsageLimitAfterOutput = "usage_limit_after_output"
	// FaultAtCapacityAfterOutput fails a stream with server_is_overloaded
	// after AfterDeltas (default 2) text deltas (503 without a stream).
	FaultAtCapacityAfterOutput = "at_capacity_after_output"
	// FaultAtCapacityErrorEvent is the at-capacity error as a Responses
	// "error" event (type error, code server_is_overloaded) right after
	// response.created (503 without a stream).
	FaultAtCapacityErrorEvent = "at_capacity_error_event"
	// FaultGoogleQuotaExhausted is Google's 429 RESOURCE_EXHAUSTED with
	// reason QUOTA_EXHAUSTED (a quota), in the OpenAI-compatible API.
	FaultGoogleQuotaExhausted = "google_quota_exhausted"
	// FaultGoogleRateLimit is Google's 429 RESOURCE_EXHAUSTED with reason
	// RATE_LIMIT_EXCEEDED (a burst).
	FaultGoogleRateLimit = "google_rate_limit"
)

func init() {
	faultKinds = append(faultKinds, FaultUsageLimitReached, FaultAtCapacityEvent, FaultInsufficientQuota,
		FaultUsageLimitEvent, FaultAtCapacityAfterOutput, FaultAtCapacityErrorEvent,
		FaultGoogleQuotaExhausted, FaultGoogleRateLimit, FaultUsageLimitAfterOutput)
}

// Codex rate-limit windows, in minutes.
const (
	codexPrimaryWindowMinutes   = 300
	codexSecondaryWindowMinutes = 10080
)

// Messages of the OpenAI-shaped errors.
const (
	atCapacityMessage        = "Selected model is at capacity. Please try a different model."
	usageLimitReachedMessage = "The usage limit has been reached"
	insufficientQuotaMessage = "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors."
	openAIOverloadedMessage  = "The server is overloaded, please try again later."
	openAIRateLimitMessage   = "Rate limit reached for requests. Please try again later."
	defaultUsageResetSeconds = 3600
)

// openAIError is the body of an OpenAI error response.
type openAIError struct {
	Error openAIErrorDetail `json:"error"`
}

type openAIErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// openAISurface tells the OpenAI handlers apart.
type openAISurface int

const (
	surfaceCodex     openAISurface = iota // /backend-api/codex/responses
	surfaceResponses                      // /v1/responses
	surfaceChat                           // /v1/chat/completions
)

func (sf openAISurface) kind() string {
	if sf == surfaceCodex {
		return KindChatGPT
	}
	return KindOpenAIKey
}

func strPtr(s string) *string { return &s }

// failOpenAI logs the attempt and answers with an OpenAI-shaped error body.
// code "" is sent as null.
func (x *exchange) failOpenAI(outcome string, status int, errType, code, message string) {
	var c *string
	if code != "" {
		c = strPtr(code)
	}
	x.record(outcome, status)
	writeJSON(x.w, status, openAIError{Error: openAIErrorDetail{Message: message, Type: errType, Code: c}})
}

// parseOpenAIRequest reads model and stream, and requires the surface's
// input field (input for Responses, a non-empty messages list for Chat
// Completions). It reports the first problem ("" when valid).
func parseOpenAIRequest(body []byte, sf openAISurface) (messagesRequest, string) {
	var req messagesRequest
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return req, "We could not parse the JSON body of your request."
	}
	json.Unmarshal(fields["model"], &req.Model)   //nolint:errcheck // checked below
	json.Unmarshal(fields["stream"], &req.Stream) //nolint:errcheck // checked below
	req.tools, req.toolChoice, req.conversation = fields["tools"], fields["tool_choice"], fields["input"]
	json.Unmarshal(fields["previous_response_id"], &req.previousResponse) //nolint:errcheck // optional
	if sf == surfaceChat {
		req.conversation = fields["messages"]
	} else {
		req.system = fields["instructions"]
	}
	req.reasoningEffort = reasoningEffort(fields)
	var opts struct {
		IncludeUsage bool `json:"include_usage"`
	}
	json.Unmarshal(fields["stream_options"], &opts) //nolint:errcheck // optional; unreadable is not asked
	req.includeUsage = opts.IncludeUsage
	var problems []string
	if raw, ok := fields["model"]; !ok || !isJSON[string](raw) || req.Model == "" {
		problems = append(problems, "Missing required parameter: 'model'.")
	}
	if sf == surfaceChat {
		if raw, ok := fields["messages"]; !ok {
			problems = append(problems, "Missing required parameter: 'messages'.")
		} else if msgs, ok := decodeList(raw); !ok || len(msgs) == 0 {
			problems = append(problems, "Invalid 'messages': expected a non-empty array.")
		} else {
			req.items = msgs
		}
	} else {
		raw, ok := fields["input"]
		items, isList := decodeList(raw)
		switch {
		case !ok:
			problems = append(problems, "Missing required parameter: 'input'.")
		case isList:
			req.items = items
		case isJSON[string](raw):
			req.items = []json.RawMessage{raw}
		default:
			problems = append(problems, "Invalid 'input': expected a string or an array.")
		}
	}
	if raw, ok := fields["stream"]; ok && !isJSON[bool](raw) {
		problems = append(problems, "Invalid type for 'stream': expected a boolean.")
	}
	return req, strings.Join(problems, " ")
}

// authenticateOpenAI maps the Bearer token to an account of the surface's
// kind. A known credential of another kind is refused like an unknown one.
func (s *Server) authenticateOpenAI(h http.Header, sf openAISurface) (acct *account, outcome, code, message string) {
	tok, ok := bearerToken(h.Get("Authorization"))
	if !ok || tok == "" {
		return nil, outcomeAuthError, "", "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
	}
	invalid := "Incorrect API key provided."
	if sf == surfaceCodex {
		invalid = "Your authentication token is invalid."
	}
	if !wellFormedCredential(tok) {
		return nil, outcomeAuthError, "invalid_api_key", invalid
	}
	kind := sf.kind()
	now := s.now()
	s.mu.Lock()
	a := s.reg.byCred[tok]
	if a == nil && s.reg.acceptUnknown {
		a = s.reg.discover(tok, kind)
	}
	expired := false
	if a != nil {
		exp, ok := a.expires[tok]
		expired = ok && !now.Before(exp)
	}
	s.mu.Unlock()
	acctID := strings.TrimSpace(h.Get("chatgpt-account-id"))
	switch {
	case a == nil || a.kind != kind:
		return nil, outcomeAuthError, "invalid_api_key", invalid
	case a.revoked:
		return a, FaultRevoked, "invalid_api_key", revokedOpenAIMessage(a)
	case expired:
		return a, outcomeTokenExpired, "token_expired", "Provided authentication token is expired. Please try signing in again."
	case kind == KindChatGPT && acctID == "":
		return a, outcomeAuthError, "", "Missing chatgpt-account-id header."
	case kind == KindChatGPT && a.chatgptID != "" && acctID != a.chatgptID:
		return a, outcomeAuthError, "", "chatgpt-account-id does not match"
	}
	return a, "", "", ""
}

// revokedOpenAIMessage is the 401 message of a revoked OpenAI-side account.
func revokedOpenAIMessage(a *account) string {
	if a.kind == KindChatGPT {
		return "Your authentication token has been invalidated. Please try signing in again."
	}
	return "Incorrect API key provided."
}

// admitOpenAI reads the body and authenticates the request for surface sf.
// When it returns false it has already answered and logged the attempt.
func (s *Server) admitOpenAI(w http.ResponseWriter, r *http.Request, sf openAISurface) (*exchange, bool) {
	x := &exchange{s: s, w: w, r: r, wire: sf.toolWire()}
	if !x.readBody() {
		return nil, false
	}
	x.req, x.problem = parseOpenAIRequest(x.body, sf)
	acct, outcome, code, message := s.authenticateOpenAI(r.Header, sf)
	x.acct = acct
	if acct != nil && sf != surfaceChat {
		x.setCodexHeaders()
	}
	if outcome != "" {
		x.failOpenAI(outcome, http.StatusUnauthorized, "invalid_request_error", code, message)
		return nil, false
	}
	if x.problem != "" {
		x.failOpenAI(outcomeInvalidRequest, http.StatusBadRequest, "invalid_request_error", "", x.problem)
		return nil, false
	}
	return x, true
}

// setCodexHeaders sets the Codex rate-limit headers from the account's
// windows (live, as they stand before this request, or the static
// utilizations), in percent. A scripted account without one of the two
// windows sends no headers for it.
func (x *exchange) setCodexHeaders() {
	now := x.s.now()
	h := x.w.Header()
	set := func(name string, cw *codexWindow, minutes int) {
		if cw == nil {
			return
		}
		p := "x-codex-" + name + "-"
		h.Set(p+"used-percent", strconv.FormatFloat(cw.percent, 'f', -1, 64))
		h.Set(p+"window-minutes", strconv.Itoa(minutes))
		h.Set(p+"reset-after-seconds", strconv.FormatInt(secondsUntil(now, cw.reset), 10))
		h.Set(p+"reset-at", strconv.FormatInt(cw.reset.Unix(), 10))
	}
	x.s.mu.Lock()
	primary, secondary := x.acct.codexWindows(now)
	x.s.mu.Unlock()
	set("primary", primary, codexPrimaryWindowMinutes)
	set("secondary", secondary, codexSecondaryWindowMinutes)
}

// handleCodexResponses serves POST /backend-api/codex/responses.
func (s *Server) handleCodexResponses(w http.ResponseWriter, r *http.Request) {
	s.serveOpenAI(w, r, surfaceCodex)
}

// handleResponses serves POST /v1/responses.
func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	s.serveOpenAI(w, r, surfaceResponses)
}

// handleChatCompletions serves POST /v1/chat/completions.
func (s *Server) handleChatCompletions(w http.ResponseWriter, r *http.Request) {
	s.serveOpenAI(w, r, surfaceChat)
}

func (s *Server) serveOpenAI(w http.ResponseWriter, r *http.Request, sf openAISurface) {
	x, ok := s.admitOpenAI(w, r, sf)
	if !ok {
		return
	}
	x.planToolCall(sf.toolWire())
	// A full live window turns the request away before the fault queue,
	// as on /v1/messages.
	if x.codexUsageLimited() {
		return
	}
	if f, ok := s.takeFault(x.acct, x.req.Model); ok {
		x.applyOpenAIFault(f, sf)
		return
	}
	x.record(outcomeOK, http.StatusOK)
	x.succeedOpenAI(sf, nil)
}

// applyOpenAIFault answers the attempt the way fault f says, in OpenAI's
// wire shapes.
func (x *exchange) applyOpenAIFault(f Fault, sf openAISurface) {
	if slices.Contains(misbehaviourKinds, f.Kind) {
		whole := func() []byte { b, _ := json.Marshal(x.response("completed", true)); return b }
		stream := x.responsesStream
		if sf == surfaceChat {
			whole = func() []byte { b, _ := json.Marshal(x.chatCompletion()); return b }
			stream = x.chatStream
		}
		x.misbehave(f, whole, stream)
		return
	}
	h := x.w.Header()
	switch f.Kind {
	case FaultUsageLimitReached:
		secs := f.usageResetSeconds()
		x.writeUsageLimit(f.Kind, x.s.now().Unix()+int64(secs), secs)
	case FaultUsageLimitEvent, FaultUsageLimitAfterOutput:
		if !x.req.Stream {
			secs := f.usageResetSeconds()
			x.writeUsageLimit(f.Kind, x.s.now().Unix()+int64(secs), secs)
			return
		}
		x.record(f.Kind, http.StatusOK)
		x.succeedOpenAI(sf, &f)
	case FaultAtCapacityAfterOutput, FaultAtCapacityErrorEvent:
		if !x.req.Stream {
			x.failOpenAI(f.Kind, http.StatusServiceUnavailable, "server_error", "server_is_overloaded", atCapacityMessage)
			return
		}
		x.record(f.Kind, http.StatusOK)
		x.succeedOpenAI(sf, &f)
	case FaultGoogleQuotaExhausted, FaultGoogleRateLimit:
		x.googleExhausted(f)
	case FaultInsufficientQuota:
		x.failOpenAI(f.Kind, http.StatusTooManyRequests, "insufficient_quota", "insufficient_quota", insufficientQuotaMessage)
	case FaultRateLimit:
		if f.RetryAfter > 0 {
			h.Set("retry-after", strconv.Itoa(f.RetryAfter))
		}
		x.failOpenAI(f.Kind, http.StatusTooManyRequests, "requests", "rate_limit_exceeded", openAIRateLimitMessage)
	case FaultOverloaded, FaultUnavailable:
		if f.RetryAfter > 0 {
			h.Set("retry-after", strconv.Itoa(f.RetryAfter))
		}
		x.failOpenAI(f.Kind, http.StatusServiceUnavailable, "server_error", "", openAIOverloadedMessage)
	case FaultAPIError:
		x.failOpenAI(f.Kind, http.StatusInternalServerError, "server_error", "", "The server had an error while processing your request. Sorry about that!")
	case FaultRevoked:
		x.failOpenAI(f.Kind, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", revokedOpenAIMessage(x.acct))
	case FaultBadRequest:
		x.failOpenAI(f.Kind, http.StatusBadRequest, "invalid_request_error", "", "Simulated invalid request.")
	case FaultAtCapacityEvent, FaultOverloadedEvent, FaultErrorAfterContent:
		if !x.req.Stream || sf == surfaceChat {
			x.failOpenAI(f.Kind, http.StatusServiceUnavailable, "server_error", "server_is_overloaded", atCapacityMessage)
			return
		}
		x.record(f.Kind, http.StatusOK)
		x.succeedOpenAI(sf, &f)
	case FaultDropMidStream:
		x.record(f.Kind, http.StatusOK)
		if x.req.Stream {
			x.succeedOpenAI(sf, &f)
			return
		}
		x.w.Header().Set("Content-Type", "application/json")
		x.w.WriteHeader(http.StatusOK)
		x.w.Write([]byte(`{"id":"`))            //nolint:errcheck // the connection is aborted next anyway
		http.NewResponseController(x.w).Flush() //nolint:errcheck // as above
		panic(http.ErrAbortHandler)
	case FaultDropConnection:
		x.record(f.Kind, 0)
		x.dropConnection()
	case FaultSlowHeaders:
		if !pause(x.r.Context(), time.Duration(f.Delay)) {
			x.record(f.Kind, statusClientClosed)
			return
		}
		x.record(f.Kind, http.StatusOK)
		x.succeedOpenAI(sf, nil)
	default:
		panic("sim: unvalidated fault kind " + f.Kind)
	}
}

type usageLimitBody struct {
	Error usageLimitDetail `json:"error"`
}

type usageLimitDetail struct {
	Type            string `json:"type"`
	Message         string `json:"message"`
	PlanType        string `json:"plan_type"`
	ResetsAt        int64  `json:"resets_at"`
	ResetsInSeconds int    `json:"resets_in_seconds"`
}

// usageResetSeconds is resets_in_seconds of the usage limit faults.
func (f Fault) usageResetSeconds() int {
	if f.RetryAfter == 0 {
		return defaultUsageResetSeconds
	}
	return f.RetryAfter
}

// succeedOpenAI answers with the reply in the surface's shape. A stream
// fault (f not nil) cuts a stream short; without one the reply's tokens
// are added to the account's live windows.
func (x *exchange) succeedOpenAI(sf openAISurface, f *Fault) {
	if f == nil {
		x.s.charge(x.acct, x.req.Model, x.inputTokens()+x.outputTokens())
	}
	x.usage() // the prompt cache follows every request served
	if sf == surfaceChat {
		if x.req.Stream {
			x.chatStream(f)
			return
		}
		c := x.chatCompletion()
		x.reportUsage(x.usage())
		writeJSON(x.w, http.StatusOK, c)
		x.outputSent()
		return
	}
	if x.req.Stream {
		x.responsesStream(f)
		return
	}
	ro := x.response("completed", true)
	x.reportUsage(x.usage())
	writeJSON(x.w, http.StatusOK, ro)
	x.outputSent()
}

// Responses API shapes.
type (
	responseObject struct {
		ID        string           `json:"id"`
		Object    string           `json:"object"`
		CreatedAt int64            `json:"created_at"`
		Status    string           `json:"status"`
		Model     string           `json:"model"`
		Output    []any            `json:"output"` // a responseItem, functionCall or customToolCall
		Usage     *responseUsage   `json:"usage"`
		Error     *responseErrBody `json:"error"`
	}
	responseItem struct {
		ID      string            `json:"id"`
		Type    string            `json:"type"`
		Status  string            `json:"status"`
		Role    string            `json:"role"`
		Content []responseContent `json:"content"`
	}
	responseContent struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		Annotations []any  `json:"annotations"`
	}
	// responseErrBody is response.error. The usage limit event adds
	// resets_at (epoch s) and resets_in_seconds beside code and message,
	// as in the 429 usage_limit_reached body.
	responseErrBody struct {
		Code            string `json:"code"`
		Message         string `json:"message"`
		ResetsAt        *int64 `json:"resets_at,omitempty"`
		ResetsInSeconds *int   `json:"resets_in_seconds,omitempty"`
	}
)

// response is the Responses API object; done adds the output and usage.
func (x *exchange) response(status string, done bool) responseObject {
	now := x.s.now()
	if x.respID == "" {
		x.respID = newID("resp_", now)
	}
	ro := responseObject{
		ID: x.respID, Object: "response", CreatedAt: now.Unix(),
		Status: status, Model: x.req.Model, Output: []any{},
	}
	if done {
		ro.Output = []any{x.outputItem("completed")}
		ro.Usage = x.usage().responses()
	}
	return ro
}

// outputItem is the answer's output item: the text message, or the
// tool call.
func (x *exchange) outputItem(status string) any {
	if x.tool != nil {
		return x.toolCallItem(status)
	}
	return x.responseItem(status, x.s.reply.text)
}

func (x *exchange) responseItem(status, text string) responseItem {
	if x.itemID == "" {
		x.itemID = newID("msg_", x.s.now())
	}
	it := responseItem{ID: x.itemID, Type: "message", Status: status, Role: "assistant", Content: []responseContent{}}
	if status == "completed" {
		it.Content = []responseContent{{Type: "output_text", Text: text, Annotations: []any{}}}
	}
	return it
}

// startOpenAIStream sends the headers of a 200 event stream; the Codex
// headers, if any, are already set.
func (x *exchange) startOpenAIStream() *sseWriter {
	h := x.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	x.w.WriteHeader(http.StatusOK)
	sw := &sseWriter{w: x.w, rc: http.NewResponseController(x.w)}
	sw.flush()
	return sw
}

// data writes one data-only event ("data: PAYLOAD\n\n").
func (sw *sseWriter) data(payload string) {
	if sw.err != nil {
		return
	}
	if _, sw.err = fmt.Fprintf(sw.w, "data: %s\n\n", payload); sw.err == nil {
		sw.flush()
	}
}

// responsesStream streams the reply as Responses API events, each with its
// sequence_number: the text as output_text deltas, or the tool call's
// arguments as function_call_arguments deltas (a custom tool's input as
// custom_tool_call_input deltas). at_capacity_event,
// overloaded_event and usage_limit_event fail (response.failed) and at_capacity_error_event
// sends an error event right after response.created; error_after_content,
// at_capacity_after_output and drop_mid_stream come after f.afterDeltas()
// deltas.
func (x *exchange) responsesStream(f *Fault) {
	sw := x.startOpenAIStream()
	seq := 0
	emit := func(name string, fields map[string]any) {
		fields["type"] = name
		fields["sequence_number"] = seq
		seq++
		sw.event(name, fields)
	}
	resp := x.response("in_progress", false)
	emit("response.created", map[string]any{"response": resp})
	failWith := func(e responseErrBody) {
		resp.Status = "failed"
		resp.Error = &e
		emit("response.failed", map[string]any{"response": resp})
	}
	failed := func() { failWith(responseErrBody{Code: "server_is_overloaded", Message: atCapacityMessage}) }
	usageLimited := func() {
		secs := f.usageResetSeconds()
		at := x.s.now().Unix() + int64(secs)
		failWith(responseErrBody{Code: FaultUsageLimitReached, Message: usageLimitReachedMessage, ResetsAt: &at, ResetsInSeconds: &secs})
	}
	if f != nil {
		switch f.Kind {
		case FaultAtCapacityEvent, FaultOverloadedEvent:
			failed()
			return
		case FaultUsageLimitEvent:
			usageLimited()
			return
		case FaultAtCapacityErrorEvent:
			emit("error", map[string]any{"code": "server_is_overloaded", "message": atCapacityMessage, "param": nil})
			return
		}
	}
	deltaEvent, chunks := "response.output_text.delta", x.s.reply.chunks
	if x.tool != nil {
		deltaEvent, _, _ = x.tool.responsesToolEvents()
		chunks = x.tool.pieces(len(chunks))
	}
	if x.misbehaveStream(sw, f, false, deltaEvent) {
		return
	}
	emit("response.output_item.added", map[string]any{"output_index": 0, "item": x.outputItem("in_progress")})
	if f != nil {
		chunks = chunks[:min(f.afterDeltas(), len(chunks))]
	}
	for i, c := range chunks {
		if i > 0 && !pause(x.r.Context(), x.s.deltaDelay) {
			return
		}
		fields := map[string]any{"item_id": x.itemID, "output_index": 0, "delta": c}
		if x.tool == nil {
			fields["content_index"] = 0
		}
		emit(deltaEvent, fields)
		if sw.err != nil {
			return
		}
		x.outputSent()
	}
	if x.misbehaveStream(sw, f, true, deltaEvent) {
		return
	}
	if f != nil {
		switch f.Kind {
		case FaultErrorAfterContent, FaultAtCapacityAfterOutput:
			failed()
			return
		case FaultUsageLimitAfterOutput:
			usageLimited()
			return
		case FaultDropMidStream:
			panic(http.ErrAbortHandler)
		}
	}
	if x.tool != nil {
		_, doneEvent, field := x.tool.responsesToolEvents()
		emit(doneEvent, map[string]any{"item_id": x.itemID, "output_index": 0, field: x.tool.args})
	}
	emit("response.output_item.done", map[string]any{"output_index": 0, "item": x.outputItem("completed")})
	done := x.response("completed", true)
	done.ID, done.CreatedAt = resp.ID, resp.CreatedAt
	x.reportUsage(x.usage())
	emit("response.completed", map[string]any{"response": done})
}

// Chat Completions shapes.
type (
	chatCompletionObject struct {
		ID      string       `json:"id"`
		Object  string       `json:"object"`
		Created int64        `json:"created"`
		Model   string       `json:"model"`
		Choices []chatChoice `json:"choices"`
		// Usage is a *chatUsage: a completion's; in a stream that asked
		// for it (stream_options.include_usage), null on every chunk but
		// the last, which has it; absent from a stream that did not ask.
		// (A nil *chatUsage in it is written as null; only a nil Usage is
		// left out.)
		Usage any `json:"usage,omitempty"`
	}
	chatChoice struct {
		Index        int          `json:"index"`
		Message      *chatMessage `json:"message,omitempty"`
		Delta        *chatMessage `json:"delta,omitempty"`
		FinishReason *string      `json:"finish_reason"`
	}
	chatMessage struct {
		Role      string         `json:"role,omitempty"`
		Content   *string        `json:"content,omitempty"`
		ToolCalls []chatToolCall `json:"tool_calls,omitempty"`
	}
)

// chatCompletion is the complete non-streamed chat completion: the text,
// or the tool call.
func (x *exchange) chatCompletion() chatCompletionObject {
	now := x.s.now()
	msg, finish := chatMessage{Role: "assistant", Content: strPtr(x.s.reply.text)}, "stop"
	if x.tool != nil {
		msg, finish = chatMessage{Role: "assistant", ToolCalls: []chatToolCall{x.tool.chatCall()}}, "tool_calls"
	}
	return chatCompletionObject{
		ID: newID("chatcmpl-", now), Object: "chat.completion", Created: now.Unix(), Model: x.req.Model,
		Choices: []chatChoice{{Message: &msg, FinishReason: &finish}},
		Usage:   x.usage().chat(),
	}
}

// chatStreamError is the data of a chat stream's error line. Only the
// usage limit event sets resets_at and resets_in_seconds.
type chatStreamError struct {
	Error struct {
		Message         string  `json:"message"`
		Type            string  `json:"type"`
		Param           *string `json:"param"`
		Code            string  `json:"code"`
		ResetsAt        *int64  `json:"resets_at,omitempty"`
		ResetsInSeconds *int    `json:"resets_in_seconds,omitempty"`
	} `json:"error"`
}

// chatStream streams the reply as chat.completion.chunk data lines ending
// with [DONE]: after the role-only chunk, the text as content deltas, or
// the tool call (its id and name, then its arguments in pieces,
// finish_reason tool_calls); drop_mid_stream aborts after f.afterDeltas() deltas.
// usage_limit_event and at_capacity_error_event send only an error line
// (data: {"error":…}); at_capacity_after_output sends it after
// f.afterDeltas() deltas. A stream with an error line has no [DONE].
func (x *exchange) chatStream(f *Fault) {
	sw := x.startOpenAIStream()
	errLine := func(errType, code, message string, resetsIn int) {
		var e chatStreamError
		e.Error.Message, e.Error.Type, e.Error.Code = message, errType, code
		if resetsIn > 0 {
			at := x.s.now().Unix() + int64(resetsIn)
			e.Error.ResetsAt, e.Error.ResetsInSeconds = &at, &resetsIn
		}
		b, _ := json.Marshal(e)
		sw.data(string(b))
	}
	if f != nil {
		switch f.Kind {
		case FaultUsageLimitEvent:
			errLine(FaultUsageLimitReached, FaultUsageLimitReached, usageLimitReachedMessage, f.usageResetSeconds())
			return
		case FaultAtCapacityErrorEvent:
			errLine("server_error", "server_is_overloaded", atCapacityMessage, 0)
			return
		}
	}
	now := x.s.now()
	id := newID("chatcmpl-", now)
	chunk := func(delta chatMessage, finish *string) {
		c := chatCompletionObject{
			ID: id, Object: "chat.completion.chunk", Created: now.Unix(), Model: x.req.Model,
			Choices: []chatChoice{{Delta: &delta, FinishReason: finish}},
		}
		if x.req.includeUsage {
			c.Usage = (*chatUsage)(nil)
		}
		b, _ := json.Marshal(c)
		sw.data(string(b))
	}
	var deltas []chatMessage
	finish := "stop"
	if x.tool != nil {
		deltas, finish = x.tool.chatDeltas(len(x.s.reply.chunks)), "tool_calls"
	} else {
		for _, c := range x.s.reply.chunks {
			deltas = append(deltas, chatMessage{Content: strPtr(c)})
		}
	}
	chunk(chatMessage{Role: "assistant", Content: strPtr("")}, nil)
	if x.misbehaveStream(sw, f, false, "") {
		return
	}
	if f != nil {
		deltas = deltas[:min(f.afterDeltas(), len(deltas))]
	}
	for i, d := range deltas {
		if i > 0 && !pause(x.r.Context(), x.s.deltaDelay) {
			return
		}
		chunk(d, nil)
		if sw.err != nil {
			return
		}
		x.outputSent()
	}
	if x.misbehaveStream(sw, f, true, "") {
		return
	}
	if f != nil {
		switch f.Kind {
		case FaultDropMidStream:
			panic(http.ErrAbortHandler)
		case FaultAtCapacityAfterOutput:
			errLine("server_error", "server_is_overloaded", atCapacityMessage, 0)
			return
		case FaultUsageLimitAfterOutput:
			errLine(FaultUsageLimitReached, FaultUsageLimitReached, usageLimitReachedMessage, f.usageResetSeconds())
			return
		}
	}
	chunk(chatMessage{}, &finish)
	if x.req.includeUsage {
		// The usage chunk: no choices, the whole answer's usage.
		u := x.usage()
		b, _ := json.Marshal(chatCompletionObject{
			ID: id, Object: "chat.completion.chunk", Created: now.Unix(), Model: x.req.Model,
			Choices: []chatChoice{}, Usage: u.chat(),
		})
		x.reportUsage(u)
		sw.data(string(b))
	}
	sw.data("[DONE]")
}

// accountKinds are the valid values of AccountScript.Kind.
var accountKinds = []string{KindAPIKey, KindOAuth, KindChatGPT, KindOpenAIKey}
