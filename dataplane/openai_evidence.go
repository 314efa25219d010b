package dataplane

// Evidence from the OpenAI-shaped surfaces: the OpenAI Responses API, the
// Codex backend, Chat Completions, and Google's OpenAI-compatible
// endpoint. Every function here is pure: bytes and now in, evidence out.

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// openAIAtCapacity starts the message of the Codex at-capacity failure,
// whatever code comes with it.
const openAIAtCapacity = "Selected model is at capacity"

// maxEvidenceSeconds bounds a reset the upstream announces (about 31
// years): beyond it the number is garbage, and would overflow a Duration.
const maxEvidenceSeconds = 1e9

// maxEpochSeconds is the last second a protobuf Timestamp can hold.
const maxEpochSeconds = 253402300799

// maxMessageBytes bounds eventFailure.message.
const maxMessageBytes = 300

// openAIError is the error object of all three dialects: OpenAI's
// {message, type, param, code}, the Codex usage limit's extra fields, and
// Google's {code, message, status, details}.
type openAIError struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	// Code is a string (or null) at OpenAI, the HTTP status number at
	// Google.
	Code json.RawMessage `json:"code"`
	// Status and Details are Google's.
	Status  string `json:"status"`
	Details []struct {
		Reason     string `json:"reason"`     // google.rpc.ErrorInfo
		RetryDelay string `json:"retryDelay"` // google.rpc.RetryInfo
	} `json:"details"`
	// ResetsAt (epoch seconds) and ResetsInSeconds are the Codex usage
	// limit's: numbers, or strings of digits.
	ResetsAt        json.RawMessage `json:"resets_at"`
	ResetsInSeconds json.RawMessage `json:"resets_in_seconds"`
}

// code is the OpenAI error code; Google's numeric code is not one.
func (e *openAIError) code() string {
	var s string
	if json.Unmarshal(e.Code, &s) != nil {
		return ""
	}
	return s
}

// reason is the first Google ErrorInfo reason.
func (e *openAIError) reason() string {
	for _, d := range e.Details {
		if d.Reason != "" {
			return d.Reason
		}
	}
	return ""
}

// names are the error's own names, most specific first: the OpenAI code,
// the Google reason, the OpenAI type, the Google status.
func (e *openAIError) names() []string {
	var out []string
	for _, n := range []string{e.code(), e.reason(), e.Type, e.Status} {
		if n != "" {
			out = append(out, n)
		}
	}
	return out
}

// name is eventFailure.errorType.
func (e *openAIError) name() string {
	if n := e.names(); len(n) > 0 {
		return n[0]
	}
	return ""
}

// is reports whether the error goes by one of names.
func (e *openAIError) is(names ...string) bool {
	for _, n := range e.names() {
		for _, m := range names {
			if n == m {
				return true
			}
		}
	}
	return false
}

// resourceExhausted reports a Google 429, burst or quota.
func (e *openAIError) resourceExhausted() bool {
	return e.is("RESOURCE_EXHAUSTED", "QUOTA_EXHAUSTED", "RATE_LIMIT_EXCEEDED")
}

// quota reads the evidence of a spent quota, or nil. now filters out a
// reset already past; a zero now (a stream event, which has no clock)
// keeps every reset. h supplies Retry-After and the x-codex-* windows;
// it may be nil.
func (e *openAIError) quota(now time.Time, h http.Header, message string) *weirv1.QuotaEvidence {
	var q *weirv1.QuotaEvidence
	switch {
	case e.is("usage_limit_reached"):
		q = &weirv1.QuotaEvidence{Kind: weirv1.QuotaKind_QUOTA_KIND_CODEX_USAGE_LIMIT}
		if at, ok := evidenceSeconds(e.ResetsAt); ok && at <= maxEpochSeconds {
			if t := time.Unix(int64(at), 0); t.After(now) {
				q.ResetsAt = timestamppb.New(t)
			}
		}
		if s, ok := evidenceSeconds(e.ResetsInSeconds); ok && s <= maxEvidenceSeconds {
			q.ResetAfter = durationpb.New(time.Duration(s * float64(time.Second)))
		}
		q.WindowMinutes = codexWindowMinutes(h, q, now)
	case e.is("insufficient_quota"):
		// Billing: nothing reopens it on its own.
		q = &weirv1.QuotaEvidence{Kind: weirv1.QuotaKind_QUOTA_KIND_OPENAI_INSUFFICIENT_QUOTA}
	case e.reason() == "QUOTA_EXHAUSTED":
		q = &weirv1.QuotaEvidence{Kind: weirv1.QuotaKind_QUOTA_KIND_GOOGLE_QUOTA_EXHAUSTED}
		if d, ok := googleRetryDelay(e); ok {
			q.ResetAfter = durationpb.New(d)
		} else if v := h.Get("Retry-After"); v != "" {
			if d, ok := parseRetryAfter(v, now); ok && d > 0 && d <= maxEvidenceSeconds*time.Second {
				q.ResetAfter = durationpb.New(d)
			}
		}
	default:
		return nil
	}
	q.Message = message
	return q
}

// googleRetryDelay reads RetryInfo.retryDelay, a protobuf Duration in its
// JSON form ("22s", "1.5s").
func googleRetryDelay(e *openAIError) (time.Duration, bool) {
	for _, d := range e.Details {
		if !strings.HasSuffix(d.RetryDelay, "s") {
			continue
		}
		s, err := strconv.ParseFloat(strings.TrimSuffix(d.RetryDelay, "s"), 64)
		if err == nil && s > 0 && s <= maxEvidenceSeconds {
			return time.Duration(s * float64(time.Second)), true
		}
	}
	return 0, false
}

// evidenceSeconds reads a positive count of seconds sent as a JSON number
// or as a string of digits.
func evidenceSeconds(raw json.RawMessage) (float64, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		n, err := strconv.ParseUint(s, 10, 63)
		return float64(n), err == nil && n > 0
	}
	var f float64
	if json.Unmarshal(raw, &f) != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, f > 0
}

// codexWindowMinutes picks the window a Codex usage limit is about from
// the x-codex-{primary,secondary}-* headers: the spent window (used ≥
// 100%) whose reset is the evidence's (±2 s), else the only spent window;
// 0 when neither tells.
func codexWindowMinutes(h http.Header, q *weirv1.QuotaEvidence, now time.Time) int32 {
	var reset time.Time
	switch {
	case q.ResetsAt != nil:
		reset = q.ResetsAt.AsTime()
	case q.ResetAfter != nil && !now.IsZero():
		reset = now.Add(q.ResetAfter.AsDuration())
	}
	var spent []int32
	var matched int32
	for _, w := range []string{"Primary", "Secondary"} {
		p := "X-Codex-" + w + "-"
		used, err := strconv.ParseFloat(h.Get(p+"Used-Percent"), 64)
		if err != nil || !(used >= 100) {
			continue
		}
		minutes, err := strconv.ParseInt(h.Get(p+"Window-Minutes"), 10, 32)
		if err != nil || minutes <= 0 {
			continue
		}
		spent = append(spent, int32(minutes))
		var at time.Time
		if s, err := strconv.ParseInt(h.Get(p+"Reset-At"), 10, 64); err == nil && s > 0 && s <= maxEpochSeconds {
			at = time.Unix(s, 0)
		} else if s, err := strconv.ParseInt(h.Get(p+"Reset-After-Seconds"), 10, 64); err == nil &&
			s > 0 && s <= maxEvidenceSeconds && !now.IsZero() {
			at = now.Add(time.Duration(s) * time.Second)
		}
		if !reset.IsZero() && !at.IsZero() && at.Sub(reset).Abs() <= 2*time.Second {
			// Both spent and resetting together: the longer window is the
			// one that holds the account out longer.
			matched = max(matched, int32(minutes))
		}
	}
	switch {
	case matched > 0:
		return matched
	case len(spent) == 1:
		return spent[0]
	}
	return 0
}

// decodeOpenAIError reads the error object of an error body,
// {"error":{…}} or Google's [{"error":{…}}].
func decodeOpenAIError(body []byte) (*openAIError, bool) {
	type envelope struct {
		Error json.RawMessage `json:"error"`
	}
	body = bytes.TrimSpace(body)
	var env envelope
	if len(body) > 0 && body[0] == '[' {
		var all []envelope
		if json.Unmarshal(body, &all) != nil || len(all) == 0 {
			return nil, false
		}
		env = all[0]
	} else if json.Unmarshal(body, &env) != nil {
		return nil, false
	}
	return parseOpenAIError(env.Error)
}

// parseOpenAIError reads an error object; a bare string (as some gateways
// send) is its message.
func parseOpenAIError(raw json.RawMessage) (*openAIError, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, false
	}
	var e openAIError
	if raw[0] == '"' {
		if json.Unmarshal(raw, &e.Message) != nil {
			return nil, false
		}
		return &e, true
	}
	if json.Unmarshal(raw, &e) != nil {
		return nil, false
	}
	return &e, true
}

// openAIErrorEvidence reads a non-2xx answer of an OpenAI, Codex backend
// or Google OpenAI-compatible endpoint. The class is classify's for the
// status, except where the body names the error better: a spent quota
// (recognised by name at any status, since the names are unambiguous),
// a Google RESOURCE_EXHAUSTED, a 5xx that says overloaded, a request the
// upstream rejects as the client's fault.
func openAIErrorEvidence(status int, h http.Header, body []byte, now time.Time) eventFailure {
	f := eventFailure{class: classify(status, ""), status: status}
	e, ok := decodeOpenAIError(body)
	if !ok {
		return f
	}
	f.errorType = e.name()
	f.message = upstreamMessageLine(e.Message)
	switch {
	case status >= 200 && status < 300:
		// Not an error status: the body's names are all there is, as in
		// classify.
		f.class = openAIErrorClass(e)
	case e.resourceExhausted():
		f.class = weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED
	case status >= 500 && (e.is("server_is_overloaded", "slow_down") || strings.Contains(e.Message, openAIAtCapacity)):
		f.class = weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED
	case e.is("context_length_exceeded", "invalid_request_error") &&
		status != http.StatusUnauthorized && status != http.StatusForbidden && status != http.StatusTooManyRequests:
		// OpenAI sends a missing or bad API key as a 401 of type
		// invalid_request_error: the status is the better evidence there.
		f.class = weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR
	}
	if f.quota = e.quota(now, h, f.message); f.quota != nil {
		f.class = weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED
	}
	return f
}

// openAIErrorClass classifies an error that arrived inside a 200 stream
// by its names, the most specific known one deciding.
func openAIErrorClass(e *openAIError) weirv1.OutcomeClass {
	if strings.Contains(e.Message, openAIAtCapacity) {
		// Codex does not retry it, whatever the code: another account may
		// well have capacity.
		return weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED
	}
	for _, n := range e.names() {
		switch n {
		case "server_is_overloaded", "slow_down", "server_error":
			return weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED
		case "rate_limit_exceeded", "usage_limit_reached", "insufficient_quota",
			"RESOURCE_EXHAUSTED", "QUOTA_EXHAUSTED", "RATE_LIMIT_EXCEEDED":
			return weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED
		case "context_length_exceeded", "invalid_prompt", "invalid_request_error":
			return weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR
		}
	}
	return weirv1.OutcomeClass_OUTCOME_CLASS_UPSTREAM_ERROR
}

// openAIStatusForClass is the HTTP status weir answers with for an
// in-stream failure passed on before anything was sent.
func openAIStatusForClass(c weirv1.OutcomeClass) int {
	switch c {
	case weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED:
		return http.StatusServiceUnavailable
	case weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED:
		return http.StatusTooManyRequests
	case weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR:
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// openAIStreamFailure is the failure an in-stream error object means; e
// may be nil (a failure event without a readable error).
func openAIStreamFailure(e *openAIError) *eventFailure {
	if e == nil {
		e = &openAIError{}
	}
	f := &eventFailure{class: openAIErrorClass(e), errorType: e.name(), message: upstreamMessageLine(e.Message)}
	// A stream has no clock here: resets are kept as sent.
	if f.quota = e.quota(time.Time{}, nil, f.message); f.quota != nil {
		f.class = weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED
	}
	f.status = openAIStatusForClass(f.class)
	return f
}

// responsesEvent is what responsesSignal reads of a Responses stream event.
type responsesEvent struct {
	Type     string `json:"type"`
	Response *struct {
		Usage *openAIUsageObject `json:"usage"`
		Error json.RawMessage    `json:"error"`
	} `json:"response"`
}

// usage is what the event's response reports it used.
func (r *responsesEvent) usage() usage {
	if r.Response == nil || r.Response.Usage == nil {
		return usage{}
	}
	return r.Response.Usage.usage()
}

// responsesSignal reads one event of an OpenAI Responses stream (the Codex
// backend and /v1/responses).
//
// Output is anything that changes what the client shows: every response.*
// event except the lifecycle ones (created, in_progress, queued) and the
// terminal ones, which are done or failure. codex.rate_limits and unknown
// non-response.* events are bookkeeping. An event without an event: line
// is named by its data's "type".
func responsesSignal(ev sseEvent) streamSignal {
	name := responsesEventName(ev)
	switch name {
	case "response.completed", "response.incomplete":
		// incomplete is a finished response too (max_output_tokens, a
		// content filter): the client has its answer.
		var r responsesEvent
		json.Unmarshal(ev.data, &r) //nolint:errcheck // unreadable: no token counts
		return streamSignal{done: true, usage: r.usage()}
	case "response.failed":
		var r responsesEvent
		json.Unmarshal(ev.data, &r) //nolint:errcheck // unreadable: a failure without detail
		var e *openAIError
		if r.Response != nil {
			e, _ = parseOpenAIError(r.Response.Error)
		}
		return streamSignal{failure: openAIStreamFailure(e), usage: r.usage()}
	case "error":
		return streamSignal{failure: openAIStreamFailure(responsesErrorEvent(ev.data))}
	case "response.created", "response.in_progress", "response.queued", codexRateLimits:
		return streamSignal{}
	}
	return streamSignal{output: strings.HasPrefix(name, "response.")}
}

// responsesEventName is a Responses stream event's name: its event:
// line, else its data's "type".
func responsesEventName(ev sseEvent) string {
	if ev.name != "" && ev.name != "message" {
		return ev.name
	}
	var t struct {
		Type string `json:"type"`
	}
	json.Unmarshal(ev.data, &t) //nolint:errcheck // unreadable: no name
	return t.Type
}

// responsesErrorEvent reads an error event: the error's fields at the top
// level ({"type":"error","code","message","param"}), or, failing that,
// nested under "error".
func responsesErrorEvent(data []byte) *openAIError {
	var m struct {
		openAIError
		Nested json.RawMessage `json:"error"`
	}
	if json.Unmarshal(data, &m) != nil {
		return nil
	}
	e := m.openAIError
	if e.Type == "error" {
		e.Type = "" // the event's type, not the error's
	}
	if e.name() == "" && e.Message == "" {
		if nested, ok := parseOpenAIError(m.Nested); ok {
			return nested
		}
	}
	return &e
}

// chatSignal reads one Chat Completions stream chunk (data-only events).
// The role-only first chunk is not output; a delta with text, reasoning,
// a refusal or a tool call is, and so is a finish_reason.
func chatSignal(ev sseEvent) streamSignal {
	data := bytes.TrimSpace(ev.data)
	if string(data) == "[DONE]" {
		return streamSignal{done: true}
	}
	var c struct {
		Error   json.RawMessage `json:"error"`
		Choices []struct {
			Delta struct {
				Content          json.RawMessage `json:"content"`
				ReasoningContent json.RawMessage `json:"reasoning_content"`
				// reasoning is what some compatible servers call it.
				Reasoning    json.RawMessage `json:"reasoning"`
				Refusal      json.RawMessage `json:"refusal"`
				ToolCalls    json.RawMessage `json:"tool_calls"`
				FunctionCall json.RawMessage `json:"function_call"`
			} `json:"delta"`
			FinishReason json.RawMessage `json:"finish_reason"`
		} `json:"choices"`
		// Usage is on the last chunk when the request set
		// stream_options.include_usage (null on the others), else nowhere.
		Usage *openAIUsageObject `json:"usage"`
	}
	if json.Unmarshal(data, &c) != nil {
		return streamSignal{}
	}
	var s streamSignal
	if c.Usage != nil {
		s.usage = c.Usage.usage()
	}
	if e, ok := parseOpenAIError(c.Error); ok {
		s.failure = openAIStreamFailure(e)
		return s
	}
	for _, ch := range c.Choices {
		d := ch.Delta
		for _, v := range []json.RawMessage{d.Content, d.ReasoningContent, d.Reasoning, d.Refusal, d.ToolCalls, d.FunctionCall, ch.FinishReason} {
			if nonEmptyJSON(v) {
				s.output = true
			}
		}
	}
	return s
}

// nonEmptyJSON reports a JSON value that is there and not empty.
func nonEmptyJSON(v json.RawMessage) bool {
	switch string(bytes.TrimSpace(v)) {
	case "", "null", `""`, "[]", "{}":
		return false
	}
	return true
}

// openAIUsageObject is the usage object of the OpenAI wires: the
// Responses API's (input_tokens, output_tokens and their details), or
// Chat Completions' (prompt_tokens, completion_tokens and theirs). Both
// count cached tokens in the input and reasoning tokens in the output.
type openAIUsageObject struct {
	InputTokens        int64 `json:"input_tokens"`
	OutputTokens       int64 `json:"output_tokens"`
	InputTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

// scanUsage reads the object next in sc as encoding/json would, where
// its counts are plain (decodeUsage).
func (o *openAIUsageObject) scanUsage(sc *jsonScanner) bool {
	counts := [...]*int64{&o.InputTokens, &o.OutputTokens, nil, nil, &o.PromptTokens, &o.CompletionTokens, nil, nil}
	details := [...]*int64{2: &o.InputTokensDetails.CachedTokens, 3: &o.OutputTokensDetails.ReasoningTokens,
		6: &o.PromptTokensDetails.CachedTokens, 7: &o.CompletionTokensDetails.ReasoningTokens}
	return sc.countsObject(openAIUsageFields, func(f int) bool {
		if counts[f] != nil {
			return sc.int64OrNull(counts[f])
		}
		fields := openAICachedFields
		if f == 3 || f == 7 {
			fields = openAIReasoningFields
		}
		return sc.countsObject(fields, func(int) bool { return sc.int64OrNull(details[f]) })
	})
}

// openAIUsageFields are openAIUsageObject's keys, in scanUsage's order;
// the details objects have one count each.
var (
	openAIUsageFields = [][]byte{[]byte("input_tokens"), []byte("output_tokens"), []byte("input_tokens_details"),
		[]byte("output_tokens_details"), []byte("prompt_tokens"), []byte("completion_tokens"),
		[]byte("prompt_tokens_details"), []byte("completion_tokens_details")}
	openAICachedFields    = [][]byte{[]byte("cached_tokens")}
	openAIReasoningFields = [][]byte{[]byte("reasoning_tokens")}
)

// usage normalizes the counts: the input less its cached tokens (which
// are the cache read; OpenAI reports no cache writes), the output with
// its reasoning. A negative count is none, and a part is never more
// than its whole (cached tokens past the input count as all of it).
func (o *openAIUsageObject) usage() usage {
	in, out := o.InputTokens, o.OutputTokens
	cached, reasoning := o.InputTokensDetails.CachedTokens, o.OutputTokensDetails.ReasoningTokens
	if in == 0 && out == 0 {
		in, out = o.PromptTokens, o.CompletionTokens
		cached, reasoning = o.PromptTokensDetails.CachedTokens, o.CompletionTokensDetails.ReasoningTokens
	}
	in, out = max(in, 0), max(out, 0)
	cached, reasoning = min(max(cached, 0), in), min(max(reasoning, 0), out)
	return usage{input: in - cached, output: out, cacheRead: cached, reasoning: reasoning}
}

// openAIUsage reads what a non-streamed Responses or Chat Completions
// body reports it used; the error is json.Unmarshal's.
func openAIUsage(body []byte) (usage, error) {
	var o openAIUsageObject
	if err := decodeUsage(body, &o); err != nil {
		return usage{}, err
	}
	return o.usage(), nil
}

// secretPattern finds what looks like a credential in an upstream
// message: an OpenAI or Anthropic key (sk-…, masked or not), a bearer
// token, a JWT.
var secretPattern = regexp.MustCompile(`(?i)\bbearer\s+[A-Za-z0-9._~+/=-]+|\bsk-[A-Za-z0-9_*-]{4,}|\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9._-]*`)

// upstreamMessageLine makes an upstream message fit for evidence: valid
// UTF-8 on one line, credentials redacted, at most maxMessageBytes cut on
// a rune boundary.
func upstreamMessageLine(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }), " ")
	s = secretPattern.ReplaceAllStringFunc(s, func(m string) string {
		if len(m) > 6 && strings.EqualFold(m[:6], "bearer") {
			return m[:6] + " [redacted]"
		}
		return "[redacted]"
	})
	if len(s) > maxMessageBytes {
		cut := maxMessageBytes
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = strings.TrimRight(s[:cut], " ")
	}
	return s
}
