package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
)

// replyText is the simulator's answer to every request. It is fixed and
// says nothing about the account, since a gateway must not leak which
// account served a request.
const replyText = "Hello! This is the weir upstream simulator."

// reply is the text every successful request gets, precomputed for the
// configured number of deltas.
type reply struct {
	text         string
	chunks       []string // one per content_block_delta
	outputTokens int
}

// newReply repeats replyText until it has at least one character per
// delta, and splits it into deltas chunks of nearly equal length.
func newReply(deltas int) reply {
	text := replyText
	for utf8.RuneCountInString(text) < deltas {
		text += " " + replyText
	}
	return reply{text: text, chunks: splitRunes(text, deltas), outputTokens: approxTokens(len(text))}
}

// splitRunes splits text into n pieces of nearly equal length in runes, or
// into one a rune when it is shorter (one empty piece when it is empty).
func splitRunes(text string, n int) []string {
	runes := []rune(text)
	n = max(1, min(n, len(runes)))
	chunks := make([]string, n)
	for i := range n {
		chunks[i] = string(runes[i*len(runes)/n : (i+1)*len(runes)/n])
	}
	return chunks
}

// approxTokens is the simulator's token count: about four bytes a token.
func approxTokens(nbytes int) int {
	return max(1, nbytes/4)
}

// messagesRequest is what the simulator reads from a request body.
type messagesRequest struct {
	Model  string
	Stream bool
	// tools, toolChoice and conversation (messages, or a Responses input)
	// are kept raw; they are read only when tools are offered.
	tools, toolChoice, conversation json.RawMessage
	// previousResponse is a Responses request's previous_response_id: its
	// input then holds only what came after that response.
	previousResponse string

	// What the prompt cache and the usage read (usage.go): the system
	// prompt (a Responses request's instructions), raw; the conversation's
	// messages (input items) one by one, raw (a string input is one item);
	// whether a Messages request asks for caching (a cache_control
	// anywhere in its system, messages or tools); the reasoning effort a
	// Responses or Chat Completions request asks for ("" when it asks
	// none); and whether a chat stream asks for its usage
	// (stream_options.include_usage).
	system          json.RawMessage
	items           []json.RawMessage
	cacheControl    bool
	reasoningEffort string
	includeUsage    bool
}

// parseMessagesRequest reads model and stream even from an invalid body, so
// that rejected attempts are logged with them, and reports the first
// problem with the message the real API would give ("" when valid).
func parseMessagesRequest(body []byte) (messagesRequest, string) {
	var req messagesRequest
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return req, "The request body must be a JSON object."
		}
		return req, "The request body is not valid JSON: " + err.Error()
	}
	json.Unmarshal(fields["model"], &req.Model)   //nolint:errcheck // checked below
	json.Unmarshal(fields["stream"], &req.Stream) //nolint:errcheck // checked below
	req.tools, req.toolChoice, req.conversation = fields["tools"], fields["tool_choice"], fields["messages"]
	req.system = fields["system"]
	req.cacheControl = hasCacheControl(req.system) || hasCacheControl(req.conversation) || hasCacheControl(req.tools)

	var problems []string
	if raw, ok := fields["model"]; !ok {
		problems = append(problems, "model: Field required")
	} else if !isJSON[string](raw) {
		problems = append(problems, "model: Input should be a valid string")
	} else if req.Model == "" {
		problems = append(problems, "model: String should have at least 1 character")
	}
	if raw, ok := fields["messages"]; !ok {
		problems = append(problems, "messages: Field required")
	} else if msgs, ok := decodeList(raw); !ok {
		problems = append(problems, "messages: Input should be a valid list")
	} else if len(msgs) == 0 {
		problems = append(problems, "messages: at least one message is required")
	} else {
		req.items = msgs
	}
	if raw, ok := fields["stream"]; ok && !isJSON[bool](raw) {
		problems = append(problems, "stream: Input should be a valid boolean")
	}
	if len(problems) > 0 {
		return req, strings.Join(problems, "; ")
	}
	return req, ""
}

// maxOutputTokens is the largest max_tokens the simulator accepts, the
// most any current model allows (with the 128k output beta).
const maxOutputTokens = 128000

// maxTokensProblem checks max_tokens the way the real API does, with its
// messages; a body without it passes (the real API requires it, but the
// simulator has always accepted bodies without it).
func maxTokensProblem(body []byte, model string) string {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return ""
	}
	raw, ok := fields["max_tokens"]
	if !ok {
		return ""
	}
	var f float64
	if string(raw) == "null" || json.Unmarshal(raw, &f) != nil {
		return "max_tokens: Input should be a valid integer"
	}
	var n int64
	switch {
	case json.Unmarshal(raw, &n) != nil && f != float64(int64(f)):
		return "max_tokens: Input should be a valid integer, got a number with a fractional part"
	case f < 1:
		return "max_tokens: Input should be greater than or equal to 1"
	case f > maxOutputTokens:
		return fmt.Sprintf("max_tokens: %s > %d, which is the maximum allowed number of output tokens for %s", raw, maxOutputTokens, model)
	}
	return ""
}

func decodeList(raw json.RawMessage) ([]json.RawMessage, bool) {
	var list []json.RawMessage
	if json.Unmarshal(raw, &list) != nil || list == nil {
		return nil, false
	}
	return list, true
}

// isJSON reports whether raw decodes as a (non-null) T.
func isJSON[T any](raw json.RawMessage) bool {
	var v *T
	return json.Unmarshal(raw, &v) == nil && v != nil
}

// handleMessages serves POST /v1/messages: the next fault of the account,
// or a successful reply.
func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	if !pause(r.Context(), s.latency) {
		return
	}
	x, ok := s.admit(w, r)
	if !ok {
		return
	}
	if x.problem == "" {
		x.problem = maxTokensProblem(x.body, x.req.Model)
	}
	if x.problem != "" {
		x.fail(outcomeInvalidRequest, http.StatusBadRequest, "invalid_request_error", x.problem)
		return
	}
	x.planToolCall(toolWireMessages)
	// A full usage window turns the request away before it reaches the
	// fault queue, so that no fault is used up by it.
	if x.usageLimited() {
		return
	}
	if f, ok := s.takeFault(x.acct, x.req.Model); ok {
		x.applyFault(f)
		return
	}
	x.record(outcomeOK, http.StatusOK)
	x.succeed()
}

// succeed answers with the reply, streamed or not. Its tokens are added to
// the account's usage windows first, so that the unified headers include
// this request, as they do in production.
func (x *exchange) succeed() {
	x.s.charge(x.acct, x.req.Model, x.inputTokens()+x.outputTokens())
	if x.req.Stream {
		x.stream(nil)
		return
	}
	x.setRateLimitHeaders()
	m := x.message()
	x.reportUsage(x.usage())
	writeJSON(x.w, http.StatusOK, m)
	x.outputSent()
}

// handleCountTokens serves POST /v1/messages/count_tokens. Faults apply to
// /v1/messages only, so that a token count never consumes one.
func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	x, ok := s.admit(w, r)
	if !ok {
		return
	}
	if x.problem != "" {
		x.fail(outcomeInvalidRequest, http.StatusBadRequest, "invalid_request_error", x.problem)
		return
	}
	x.record(outcomeOK, http.StatusOK)
	writeJSON(w, http.StatusOK, map[string]int{"input_tokens": x.inputTokens()})
}

func (x *exchange) inputTokens() int {
	return approxTokens(len(x.body))
}

type message struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []contentBlock `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        usage          `json:"usage"`
}

// contentBlock is a text block or, with ID, Name and Input, a tool_use
// block.
type contentBlock struct {
	Type  string  `json:"type"`
	Text  string  `json:"text"`
	ID    string  `json:"id,omitempty"`
	Name  string  `json:"name,omitempty"`
	Input rawJSON `json:"input,omitempty"`
}

// MarshalJSON writes a text block with its text, even an empty one, and a
// tool_use block without any, as the real API does.
func (b contentBlock) MarshalJSON() ([]byte, error) {
	if b.Type == "tool_use" {
		return json.Marshal(struct {
			Type  string  `json:"type"`
			ID    string  `json:"id"`
			Name  string  `json:"name"`
			Input rawJSON `json:"input"`
		}{b.Type, b.ID, b.Name, b.Input})
	}
	return json.Marshal(struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}{b.Type, b.Text})
}

// message is the complete non-streamed reply: the text, or the tool call.
func (x *exchange) message() message {
	stop, block := "end_turn", contentBlock{Type: "text", Text: x.s.reply.text}
	if x.tool != nil {
		stop, block = "tool_use", x.tool.messagesBlock(false)
	}
	return message{
		ID:         newID("msg_", x.s.now()),
		Type:       "message",
		Role:       "assistant",
		Model:      x.req.Model,
		Content:    []contentBlock{block},
		StopReason: &stop,
		Usage:      x.usage().anthropic(),
	}
}

// Stream event payloads, in the order they are sent.
type (
	messageStartEvent struct {
		Type    string  `json:"type"`
		Message message `json:"message"`
	}
	contentBlockStartEvent struct {
		Type         string       `json:"type"`
		Index        int          `json:"index"`
		ContentBlock contentBlock `json:"content_block"`
	}
	pingEvent struct {
		Type string `json:"type"`
	}
	contentBlockDeltaEvent struct {
		Type  string    `json:"type"`
		Index int       `json:"index"`
		Delta textDelta `json:"delta"`
	}
	textDelta struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	contentBlockStopEvent struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
	}
	messageDeltaEvent struct {
		Type  string       `json:"type"`
		Delta stopDelta    `json:"delta"`
		Usage outputTokens `json:"usage"`
	}
	stopDelta struct {
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	}
	outputTokens struct {
		OutputTokens int `json:"output_tokens"`
	}
	messageStopEvent struct {
		Type string `json:"type"`
	}
)

// stream sends the reply as server-sent events: the text, or the tool
// call's input as input_json_delta pieces. A stream fault (f not nil) cuts
// it short: overloaded_event right after message_start,
// error_after_content and drop_mid_stream after f.afterDeltas() deltas.
func (x *exchange) stream(f *Fault) {
	sw := x.startStream()
	start := x.message()
	start.Content = []contentBlock{}
	start.StopReason = nil
	// message_start reports the input and a first output token; the
	// output's count comes with message_delta.
	start.Usage.OutputTokens = 1
	reported := x.usage()
	reported.OutputTokens = 1
	x.reportUsage(reported)
	sw.event("message_start", messageStartEvent{Type: "message_start", Message: start})
	if f != nil && f.Kind == FaultOverloadedEvent {
		sw.event("error", overloadedEvent)
		return
	}
	if x.misbehaveStream(sw, f, false, "content_block_delta") {
		return
	}
	chunks, delay := x.s.reply.chunks, x.s.deltaDelay
	pace, paced := parseStreamHeader(x.r.Header.Get(StreamHeader))
	if paced {
		chunks, delay = newReply(pace.Deltas).chunks, pace.Delay
	}
	block, stop := contentBlock{Type: "text"}, "end_turn"
	delta := func(c string) any {
		return contentBlockDeltaEvent{Type: "content_block_delta", Delta: textDelta{Type: "text_delta", Text: c}}
	}
	if x.tool != nil {
		// The real API opens a tool_use block with an empty input, then
		// sends the input in pieces, the first one empty.
		block, stop = x.tool.messagesBlock(true), "tool_use"
		chunks = append([]string{""}, x.tool.pieces(len(chunks))...)
		delta = func(c string) any {
			return inputJSONDeltaEvent{Type: "content_block_delta", Delta: jsonDelta{Type: "input_json_delta", PartialJSON: c}}
		}
	}
	sw.event("content_block_start", contentBlockStartEvent{Type: "content_block_start", ContentBlock: block})
	sw.event("ping", pingEvent{Type: "ping"})
	if f != nil {
		chunks = chunks[:min(f.afterDeltas(), len(chunks))]
	}
	for i, c := range chunks {
		if i > 0 && !pause(x.r.Context(), delay) {
			return
		}
		sw.event("content_block_delta", delta(c))
		if sw.err != nil {
			return
		}
		x.outputSent()
		if paced && pace.Hold {
			// An idle stream: output has started, then nothing until
			// the client goes away.
			<-x.r.Context().Done()
			return
		}
	}

	if x.misbehaveStream(sw, f, true, "content_block_delta") {
		return
	}
	if f != nil {
		switch f.Kind {
		case FaultErrorAfterContent:
			sw.event("error", overloadedEvent)
			return
		case FaultDropMidStream:
			panic(http.ErrAbortHandler)
		}
	}
	sw.event("content_block_stop", contentBlockStopEvent{Type: "content_block_stop"})
	x.reportUsage(x.usage())
	sw.event("message_delta", messageDeltaEvent{
		Type:  "message_delta",
		Delta: stopDelta{StopReason: stop},
		Usage: outputTokens{OutputTokens: x.usage().OutputTokens},
	})
	sw.event("message_stop", messageStopEvent{Type: "message_stop"})
}
