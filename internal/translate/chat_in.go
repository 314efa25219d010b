package translate

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// An OpenAI client served by an Anthropic account: its request as a
// Messages request, the Messages answer as the client's. This file holds
// the Messages side both OpenAI wires share (the request builder, the
// answer and stream readers, usage) and the Chat Completions client's
// translators; responses_in.go holds the Responses client's.

// defaultMaxTokens is max_tokens when the client sets no output cap:
// Messages requires one, OpenAI has none unless asked. 32000 is the
// largest every Claude 4 model accepts (Opus 4 and 4.1 allow no more,
// the others 64000 and up): a long answer, which the client did not cap,
// is cut as late as the target allows without knowing which it is.
const defaultMaxTokens = 32000

// thinkingBudgets are the thinking budgets (budget_tokens) of OpenAI's
// reasoning efforts; "none" and "minimal" think not at all.
var thinkingBudgets = map[string]int64{"low": 2048, "medium": 8192, "high": 16384, "xhigh": 32000}

// thinkingHeadroom is max_tokens above a thinking budget that the
// client's cap does not exceed (budget_tokens must be below max_tokens):
// room for the answer after the thinking.
const thinkingHeadroom = 8192

// block is a Messages block (content, system or tool) as it is sent: a
// map, so that cache_control goes on whichever comes last.
type block = map[string]any

type turn struct {
	Role    string  `json:"role"`
	Content []block `json:"content"`
}

// messagesBody is the Messages request an OpenAI request becomes.
type messagesBody struct {
	Model         string   `json:"model"`
	MaxTokens     int64    `json:"max_tokens"`
	System        []block  `json:"system,omitempty"`
	Messages      []turn   `json:"messages"`
	Tools         []block  `json:"tools,omitempty"`
	ToolChoice    block    `json:"tool_choice,omitempty"`
	Thinking      block    `json:"thinking,omitempty"`
	Temperature   *float64 `json:"temperature,omitempty"`
	TopP          *float64 `json:"top_p,omitempty"`
	StopSequences []string `json:"stop_sequences,omitempty"`
	Stream        bool     `json:"stream,omitempty"`
}

// builder gathers a Messages request from an OpenAI client's, item by
// item; finish settles what depends on the whole (thinking, the tool
// choice, cache breakpoints).
type builder struct {
	body      messagesBody
	req       Request
	maxTokens *int64
	// effort is the reasoning effort asked, "" for none; effortField is
	// the client's field that asks it, thinkingField the one that carries
	// earlier turns' thinking back.
	effort, effortField, thinkingField string
	choice                             block // tool_choice, nil when the client set none
	forced                             bool  // the choice forces a tool call
	serial                             bool  // parallel_tool_calls: false
}

func (b *builder) drop(field string) {
	if !slices.Contains(b.req.Dropped, field) {
		b.req.Dropped = append(b.req.Dropped, field)
	}
}

func (b *builder) add(role string, blocks ...block) {
	b.body.Messages = appendTurn(b.body.Messages, role, blocks)
}

// appendTurn adds blocks as role's to the conversation: to its last
// message when that is role's too, for Messages alternates user and
// assistant where OpenAI's wires need not.
func appendTurn(msgs []turn, role string, blocks []block) []turn {
	if len(blocks) == 0 {
		return msgs
	}
	if n := len(msgs); n > 0 && msgs[n-1].Role == role {
		msgs[n-1].Content = append(msgs[n-1].Content, blocks...)
		return msgs
	}
	return append(msgs, turn{Role: role, Content: blocks})
}

// finish settles the conversation and writes the request body.
//
// Thinking: Messages refuses it with a forced tool choice, and a
// conversation that ends in tool results continues the assistant turn
// begun after the last prompt, whose first message must then start with
// its thinking as it came (signed). Where it cannot, the turn goes on
// without thinking (the effort is named in Dropped) rather than fail.
// Without thinking, earlier turns' thinking blocks are left out.
func (b *builder) finish(cacheKey string) (Request, error) {
	budget := thinkingBudgets[b.effort]
	msgs := settle(b.body.Messages)
	if budget > 0 && (b.forced || !turnStartsThinking(msgs)) {
		budget = 0
		b.drop(b.effortField)
	}
	if budget == 0 {
		var removed bool
		if msgs, removed = withoutThinking(msgs); removed {
			b.drop(b.thinkingField)
		}
	}
	if len(msgs) == 0 {
		return Request{}, errors.New("no user or assistant message to send")
	}
	if msgs[0].Role != "user" {
		return Request{}, unsupported("a conversation that starts with an assistant turn")
	}
	b.body.Messages = msgs
	b.body.MaxTokens = defaultMaxTokens
	if b.maxTokens != nil {
		b.body.MaxTokens = *b.maxTokens
	}
	if budget > 0 {
		b.body.Thinking = block{"type": "enabled", "budget_tokens": budget}
		if b.body.MaxTokens <= budget {
			b.body.MaxTokens = budget + thinkingHeadroom
		}
		// Messages refuses sampling settings with thinking.
		if b.body.Temperature != nil {
			b.body.Temperature = nil
			b.drop("temperature")
		}
		if b.body.TopP != nil {
			b.body.TopP = nil
			b.drop("top_p")
		}
	}
	// Claude's newer models refuse temperature and top_p together.
	if b.body.Temperature != nil && b.body.TopP != nil {
		b.body.TopP = nil
		b.drop("top_p")
	}
	// Messages refuses a tool choice without tools.
	if len(b.body.Tools) > 0 {
		choice := b.choice
		if b.serial && choice == nil {
			choice = block{"type": "auto"}
		}
		if b.serial && choice["type"] != "none" {
			choice["disable_parallel_tool_use"] = true
		}
		b.body.ToolChoice = choice
	}
	if cacheKey != "" {
		markCache(&b.body)
	}
	body, err := json.Marshal(b.body)
	if err != nil {
		return Request{}, err
	}
	b.req.Body = body
	return b.req, nil
}

// settle is the conversation as Messages takes it: adjacent messages of
// one role merged, a user message's tool results first (they answer the
// assistant message before it) and an assistant message's thinking first.
func settle(msgs []turn) []turn {
	var out []turn
	for _, m := range msgs {
		out = appendTurn(out, m.Role, m.Content)
	}
	for _, m := range out {
		lead := isThinking
		if m.Role == "user" {
			lead = isToolResult
		}
		slices.SortStableFunc(m.Content, func(x, y block) int {
			return boolInt(!lead(x)) - boolInt(!lead(y))
		})
	}
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func isThinking(b block) bool   { return b["type"] == "thinking" || b["type"] == "redacted_thinking" }
func isToolResult(b block) bool { return b["type"] == "tool_result" }

// turnStartsThinking says whether a conversation can go on thinking: one
// that ends in tool results can if the first assistant message after the
// last prompt (a user message without tool results) starts with thinking.
func turnStartsThinking(msgs []turn) bool {
	if n := len(msgs); n == 0 || msgs[n-1].Role != "user" || !slices.ContainsFunc(msgs[n-1].Content, isToolResult) {
		return true
	}
	start := 0
	for i, m := range msgs {
		if m.Role == "user" && !slices.ContainsFunc(m.Content, isToolResult) {
			start = i + 1
		}
	}
	for _, m := range msgs[start:] {
		if m.Role == "assistant" {
			return isThinking(m.Content[0])
		}
	}
	return true
}

// withoutThinking is the conversation with its thinking blocks left out,
// and whether it had any.
func withoutThinking(msgs []turn) ([]turn, bool) {
	var out []turn
	removed := false
	for _, m := range msgs {
		kept := slices.DeleteFunc(slices.Clone(m.Content), isThinking)
		removed = removed || len(kept) < len(m.Content)
		out = appendTurn(out, m.Role, kept)
	}
	return settle(out), removed
}

// markCache marks the prompt for caching (Messages caches only up to a
// cache_control breakpoint): the tools, the system prompt and the whole
// conversation, which the session's next request repeats and so reads
// from the cache. A thinking block takes no breakpoint.
func markCache(body *messagesBody) {
	mark := func(b block) { b["cache_control"] = block{"type": "ephemeral"} }
	if n := len(body.System); n > 0 {
		mark(body.System[n-1])
	}
	if n := len(body.Tools); n > 0 {
		mark(body.Tools[n-1])
	}
	last := body.Messages[len(body.Messages)-1].Content
	for i := len(last) - 1; i >= 0; i-- {
		if !isThinking(last[i]) {
			mark(last[i])
			return
		}
	}
}

// topFields decodes a request's top level and refuses a field known does
// not hold. A field set to null is absent: clients send them so.
func topFields(body []byte, known map[string]bool) (map[string]json.RawMessage, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, fmt.Errorf("request body: %w", err)
	}
	if top == nil {
		return nil, errors.New("request body: not a JSON object")
	}
	for _, k := range slices.Sorted(maps.Keys(top)) {
		if string(top[k]) == "null" {
			delete(top, k)
		} else if !known[k] {
			return nil, unsupported("the %q field", k)
		}
	}
	return top, nil
}

// effortOf checks a reasoning effort.
func effortOf(effort string) (string, error) {
	if _, ok := thinkingBudgets[effort]; ok || effort == "" || effort == "none" || effort == "minimal" {
		return effort, nil
	}
	return "", unsupported("the reasoning effort %q", effort)
}

func textBlocks(text string) []block {
	if text == "" {
		return nil // Messages refuses empty text blocks
	}
	return []block{{"type": "text", "text": text}}
}

// imageBlock is an image given by URL as a Messages image: a base64 data
// URL's data, or an https URL the API fetches itself.
func imageBlock(url string) (block, error) {
	if rest, ok := strings.CutPrefix(url, "data:"); ok {
		meta, data, ok := strings.Cut(rest, ",")
		mediaType, isBase64 := strings.CutSuffix(meta, ";base64")
		if !ok || !isBase64 || mediaType == "" {
			return nil, unsupported("an image data URL that is not base64")
		}
		return block{"type": "image", "source": block{"type": "base64", "media_type": mediaType, "data": data}}, nil
	}
	if strings.HasPrefix(url, "https://") {
		return block{"type": "image", "source": block{"type": "url", "url": url}}, nil
	}
	return nil, unsupported("an image URL that is neither https nor a data URL")
}

// toolUse is a call as a tool_use block, its id kept: the call's result
// names it, in this request and the session's later ones. args is the
// arguments' JSON object as a string; none is an empty object.
func toolUse(id, name, args string) (block, error) {
	if id == "" {
		return nil, errors.New("a tool call without an id")
	}
	input := json.RawMessage("{}")
	if strings.TrimSpace(args) != "" {
		var obj map[string]json.RawMessage
		if json.Unmarshal([]byte(args), &obj) != nil || obj == nil {
			return nil, fmt.Errorf("tool call %s: arguments are not a JSON object", id)
		}
		input = json.RawMessage(args)
	}
	return block{"type": "tool_use", "id": id, "name": name, "input": input}, nil
}

// toolResult is a call's output as a tool_result block; content is a
// string or blocks, none when empty.
func toolResult(id string, content any) (block, error) {
	if id == "" {
		return nil, errors.New("a tool output without a call id")
	}
	b := block{"type": "tool_result", "tool_use_id": id}
	switch c := content.(type) {
	case string:
		if c != "" {
			b["content"] = c
		}
	case []block:
		if len(c) > 0 {
			b["content"] = c
		}
	}
	return b, nil
}

// functionTool is a function tool as a Messages tool. Messages requires
// an object schema: none, or an empty one, is an object of no properties.
func functionTool(name, description string, parameters json.RawMessage) (block, error) {
	if name == "" {
		return nil, errors.New("a function tool without a name")
	}
	schema := any(block{"type": "object", "properties": block{}})
	if len(parameters) > 0 && string(parameters) != "null" {
		var obj map[string]json.RawMessage
		if json.Unmarshal(parameters, &obj) != nil {
			return nil, fmt.Errorf("tool %s: parameters are not a JSON object", name)
		}
		if len(obj) > 0 {
			schema = parameters
		}
	}
	t := block{"name": name, "input_schema": schema}
	if description != "" {
		t["description"] = description
	}
	return t, nil
}

// toolChoice is a tool_choice of either OpenAI wire as a Messages one,
// and whether it forces a call: a string mode, or a named tool
// (Responses {"type":"function","name"}, Chat {"type":"function",
// "function":{"name"}}).
func toolChoice(raw json.RawMessage) (block, bool, error) {
	var mode string
	if json.Unmarshal(raw, &mode) == nil {
		switch mode {
		case "auto":
			return block{"type": "auto"}, false, nil
		case "none":
			return block{"type": "none"}, false, nil
		case "required":
			return block{"type": "any"}, true, nil
		}
		return nil, false, unsupported("tool_choice %q", mode)
	}
	var c struct {
		Type     string `json:"type"`
		Name     string `json:"name"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, false, fmt.Errorf("tool_choice: %w", err)
	}
	name := cmp.Or(c.Name, c.Function.Name)
	if (c.Type == "function" || c.Type == "custom") && name != "" {
		return block{"type": "tool", "name": name}, true, nil
	}
	return nil, false, unsupported("tool_choice %q", c.Type)
}

// thinkingPrefix starts a Responses reasoning item's encrypted_content
// that holds a Messages thinking block: the client sends the item back
// with the turns after it (Codex does), and Messages requires a tool-use
// turn's thinking back as it came, signature and all.
const thinkingPrefix = "weir.thinking."

// thinkingBlock is a thinking or redacted_thinking block as it goes back
// to Messages; nil without the signature (data) that makes it valid.
func thinkingBlock(b answerBlock) block {
	switch {
	case b.Type == "thinking" && b.Signature != "":
		return block{"type": "thinking", "thinking": b.Thinking, "signature": b.Signature}
	case b.Type == "redacted_thinking" && b.Data != "":
		return block{"type": "redacted_thinking", "data": b.Data}
	}
	return nil
}

// sealThinking is a thinking block as a reasoning item's
// encrypted_content; "" for one that cannot go back.
func sealThinking(b answerBlock) string {
	tb := thinkingBlock(b)
	if tb == nil {
		return ""
	}
	j, _ := json.Marshal(tb)
	return thinkingPrefix + base64.RawURLEncoding.EncodeToString(j)
}

// openThinking is the thinking block an encrypted_content holds, if it
// is one sealThinking made.
func openThinking(sealed string) block {
	rest, ok := strings.CutPrefix(sealed, thinkingPrefix)
	if !ok {
		return nil
	}
	var b answerBlock
	j, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || json.Unmarshal(j, &b) != nil {
		return nil
	}
	return thinkingBlock(b)
}

// messagesAnswer is a whole Messages answer, as the answer translators
// read it.
type messagesAnswer struct {
	ID         string         `json:"id"`
	Type       string         `json:"type"`
	Content    []answerBlock  `json:"content"`
	StopReason string         `json:"stop_reason"`
	Usage      *messagesUsage `json:"usage"`
}

// answerBlock is a content block of an answer, or of a stream's
// content_block_start.
type answerBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	Thinking  string          `json:"thinking"`
	Signature string          `json:"signature"`
	Data      string          `json:"data"`
}

// answerBlockTypes are the content blocks an answer to a translated
// request holds; it offers no server tools, so no others come.
var answerBlockTypes = map[string]bool{"text": true, "tool_use": true, "thinking": true, "redacted_thinking": true}

func readAnswer(body []byte) (messagesAnswer, error) {
	var a messagesAnswer
	if err := json.Unmarshal(body, &a); err != nil {
		return a, fmt.Errorf("upstream answer: %w", err)
	}
	if a.Type != "message" {
		return a, fmt.Errorf("upstream answer: of type %q, not a message", a.Type)
	}
	for _, b := range a.Content {
		if !answerBlockTypes[b.Type] {
			return a, fmt.Errorf("upstream answer: a %q content block", b.Type)
		}
	}
	return a, nil
}

// arguments is a tool_use input as a call's arguments string.
func arguments(input json.RawMessage) (string, error) {
	if len(input) == 0 {
		return "{}", nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, input); err != nil {
		return "", fmt.Errorf("tool input: %w", err)
	}
	return buf.String(), nil
}

// messagesUsage is a Messages usage object; a count may be absent or null.
type messagesUsage struct {
	InputTokens              *int64 `json:"input_tokens"`
	OutputTokens             *int64 `json:"output_tokens"`
	CacheCreationInputTokens *int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int64 `json:"cache_read_input_tokens"`
}

// usage is an answer's token counts.
type usage struct{ input, output, cacheRead, cacheWrite int64 }

// merge takes each count m reports above zero: a stream's later reports
// are cumulative, and one that leaves a count out leaves it as it was.
func (u *usage) merge(m *messagesUsage) {
	if m == nil {
		return
	}
	for _, c := range []struct{ to, from *int64 }{
		{&u.input, m.InputTokens}, {&u.output, m.OutputTokens},
		{&u.cacheWrite, m.CacheCreationInputTokens}, {&u.cacheRead, m.CacheReadInputTokens},
	} {
		if c.from != nil && *c.from > 0 {
			*c.to = *c.from
		}
	}
}

// prompt is the whole input: OpenAI counts cached tokens in it, where
// Messages counts cache reads and writes apart.
func (u usage) prompt() int64 { return u.input + u.cacheRead + u.cacheWrite }

func (u usage) responses() map[string]any {
	return map[string]any{"input_tokens": u.prompt(), "input_tokens_details": map[string]any{"cached_tokens": u.cacheRead},
		"output_tokens": u.output, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": u.prompt() + u.output}
}

func (u usage) chat() map[string]any {
	return map[string]any{"prompt_tokens": u.prompt(), "completion_tokens": u.output, "total_tokens": u.prompt() + u.output,
		"prompt_tokens_details": map[string]any{"cached_tokens": u.cacheRead}}
}

// messagesEvent is a Messages stream event, as the stream translators
// read it.
type messagesEvent struct {
	Type    string `json:"type"`
	Message *struct {
		ID    string         `json:"id"`
		Usage *messagesUsage `json:"usage"`
	} `json:"message"`
	Index        *int         `json:"index"`
	ContentBlock *answerBlock `json:"content_block"`
	Delta        *struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		PartialJSON string `json:"partial_json"`
		Thinking    string `json:"thinking"`
		Signature   string `json:"signature"`
		StopReason  string `json:"stop_reason"`
	} `json:"delta"`
	Usage *messagesUsage `json:"usage"`
	Error *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// deltaBlocks are the content block each delta type belongs to.
var deltaBlocks = map[string]string{"text_delta": "text", "input_json_delta": "tool_use", "thinking_delta": "thinking", "signature_delta": "thinking"}

// messagesReader follows a Messages stream through its order:
// message_start; each content block's start, deltas and stop, one block
// at a time; message_delta and message_stop. An event out of that order,
// or not JSON, is an error: the translation cannot go on from it.
type messagesReader struct {
	started, done bool
	id            string
	block         int    // the open block's index
	kind          string // the open block's type, "" when none is open
	stop          string // the stop reason
	usage         usage
}

// read decodes one event and checks its place; typ is its type, "" for
// one with nothing to translate (ping, and types or deltas this package
// does not know, which Messages may add).
func (r *messagesReader) read(name string, data []byte) (ev messagesEvent, typ string, err error) {
	if err := json.Unmarshal(data, &ev); err != nil {
		return ev, "", fmt.Errorf("upstream event %q: %w", name, err)
	}
	typ = cmp.Or(name, ev.Type)
	if r.done {
		return ev, "", fmt.Errorf("upstream event %q after message_stop", typ)
	}
	if !r.started && typ != "message_start" && typ != "error" && slices.Contains(orderedEvents, typ) {
		return ev, "", fmt.Errorf("upstream event %q before message_start", typ)
	}
	switch typ {
	case "error":
		msg := "no detail"
		if ev.Error != nil {
			msg = ev.Error.Type + ": " + ev.Error.Message
		}
		return ev, "", fmt.Errorf("upstream error event: %s", msg)
	case "message_start":
		if r.started || ev.Message == nil {
			return ev, "", errors.New("upstream message_start: a second one, or without its message")
		}
		r.started, r.id = true, ev.Message.ID
		r.usage.merge(ev.Message.Usage)
	case "content_block_start":
		if r.kind != "" || ev.Index == nil || ev.ContentBlock == nil {
			return ev, "", errors.New("upstream content_block_start: while a block is open, or without its index or block")
		}
		if !answerBlockTypes[ev.ContentBlock.Type] {
			return ev, "", fmt.Errorf("upstream content_block_start: a %q block", ev.ContentBlock.Type)
		}
		r.block, r.kind = *ev.Index, ev.ContentBlock.Type
	case "content_block_delta", "content_block_stop":
		if r.kind == "" || ev.Index == nil || *ev.Index != r.block {
			return ev, "", fmt.Errorf("upstream %s: for a block that is not open", typ)
		}
		if typ == "content_block_stop" {
			r.kind = ""
			break
		}
		if ev.Delta == nil {
			return ev, "", errors.New("upstream content_block_delta: without its delta")
		}
		want, known := deltaBlocks[ev.Delta.Type]
		if !known {
			return ev, "", nil
		}
		if want != r.kind {
			return ev, "", fmt.Errorf("upstream content_block_delta: a %s in a %s block", ev.Delta.Type, r.kind)
		}
	case "message_delta", "message_stop":
		if r.kind != "" {
			return ev, "", fmt.Errorf("upstream %s: while block %d is open", typ, r.block)
		}
		if typ == "message_stop" {
			r.done = true
			break
		}
		if ev.Delta != nil && ev.Delta.StopReason != "" {
			r.stop = ev.Delta.StopReason
		}
		r.usage.merge(ev.Usage)
	default:
		return ev, "", nil
	}
	return ev, typ, nil
}

// orderedEvents are the events that come only after message_start.
var orderedEvents = []string{"content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}

// knownChatFields are the Chat Completions request fields
// ChatToMessagesRequest reads; others are refused by name. user,
// metadata, store, safety_identifier and prompt_cache_key (the session's
// cache key is weir's) change nothing the client gets and are left out
// unnamed; service_tier and verbosity change it and are named in Dropped.
// n, logprobs, modalities and the penalties pass at their no-op values.
var knownChatFields = map[string]bool{
	"model": true, "messages": true, "tools": true, "tool_choice": true, "parallel_tool_calls": true,
	"max_tokens": true, "max_completion_tokens": true, "temperature": true, "top_p": true, "stop": true,
	"stream": true, "stream_options": true, "reasoning_effort": true, "user": true, "metadata": true,
	"store": true, "safety_identifier": true, "prompt_cache_key": true, "service_tier": true, "verbosity": true,
	"n": true, "logprobs": true, "response_format": true, "audio": true, "modalities": true,
	"presence_penalty": true, "frequency_penalty": true,
}

// chatInRequest is a Chat Completions request, as ChatToMessagesRequest
// reads it.
type chatInRequest struct {
	Messages []chatInMessage `json:"messages"`
	Tools    []struct {
		Type     string `json:"type"`
		Function struct {
			chatToolFunction
			Strict bool `json:"strict"`
		} `json:"function"`
	} `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	Stop                json.RawMessage `json:"stop"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	ReasoningEffort     string          `json:"reasoning_effort"`
	ServiceTier         string          `json:"service_tier"`
	Verbosity           string          `json:"verbosity"`
	N                   *int64          `json:"n"`
	Logprobs            bool            `json:"logprobs"`
	ResponseFormat      *struct {
		Type string `json:"type"`
	} `json:"response_format"`
	Audio            json.RawMessage `json:"audio"`
	Modalities       []string        `json:"modalities"`
	PresencePenalty  float64         `json:"presence_penalty"`
	FrequencyPenalty float64         `json:"frequency_penalty"`
}

type chatInMessage struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	ToolCalls        []chatToolCall  `json:"tool_calls"`
	ToolCallID       string          `json:"tool_call_id"`
	ReasoningContent string          `json:"reasoning_content"`
	FunctionCall     json.RawMessage `json:"function_call"`
}

type chatInPart struct {
	Type     string        `json:"type"`
	Text     string        `json:"text"`
	Refusal  string        `json:"refusal"`
	ImageURL *chatImageURL `json:"image_url"`
}

// ChatToMessagesRequest translates a Chat Completions request into a
// Messages one for model (the target's): system and developer messages
// become the system prompt, tool calls tool_use blocks (ids kept) and
// tool messages tool_result blocks, reasoning_effort thinking (see
// builder.finish). stream_options.include_usage is kept in the Request
// for the stream. cacheKey set marks the prompt for caching. What Messages
// cannot carry is refused (Unsupported).
func ChatToMessagesRequest(body []byte, model, cacheKey string) (Request, error) {
	top, err := topFields(body, knownChatFields)
	if err != nil {
		return Request{}, err
	}
	var r chatInRequest
	if err := json.Unmarshal(body, &r); err != nil {
		return Request{}, fmt.Errorf("request body: %w", err)
	}
	switch {
	case r.N != nil && *r.N > 1:
		return Request{}, unsupported("n above 1 (several choices)")
	case r.Logprobs:
		return Request{}, unsupported("logprobs")
	case r.ResponseFormat != nil && r.ResponseFormat.Type != "text":
		return Request{}, unsupported("response_format %q", r.ResponseFormat.Type)
	case top["audio"] != nil || slices.ContainsFunc(r.Modalities, func(m string) bool { return m != "text" }):
		return Request{}, unsupported("audio output")
	case r.PresencePenalty != 0:
		return Request{}, unsupported("presence_penalty")
	case r.FrequencyPenalty != 0:
		return Request{}, unsupported("frequency_penalty")
	}
	b := builder{effortField: "reasoning_effort", thinkingField: "reasoning_content",
		maxTokens: cmp.Or(r.MaxCompletionTokens, r.MaxTokens)}
	b.body.Model, b.body.Stream, b.body.Temperature, b.body.TopP = model, r.Stream, r.Temperature, r.TopP
	b.req.IncludeUsage = r.Stream && r.StreamOptions != nil && r.StreamOptions.IncludeUsage
	if b.effort, err = effortOf(r.ReasoningEffort); err != nil {
		return Request{}, err
	}
	if r.ServiceTier != "" && r.ServiceTier != "auto" && r.ServiceTier != "default" {
		b.drop("service_tier")
	}
	if r.Verbosity != "" && r.Verbosity != "medium" {
		b.drop("verbosity")
	}
	if b.body.StopSequences, err = stopSequences(top["stop"]); err != nil {
		return Request{}, err
	}
	for i, m := range r.Messages {
		if err := b.chatMessage(m); err != nil {
			return Request{}, fmt.Errorf("messages[%d]: %w", i, err)
		}
	}
	for _, t := range r.Tools {
		if t.Type != "function" {
			return Request{}, unsupported("a tool of type %q", t.Type)
		}
		tool, err := functionTool(t.Function.Name, t.Function.Description, t.Function.Parameters)
		if err != nil {
			return Request{}, err
		}
		if t.Function.Strict {
			b.drop("tools[].function.strict")
		}
		b.body.Tools = append(b.body.Tools, tool)
	}
	if raw := top["tool_choice"]; raw != nil {
		if b.choice, b.forced, err = toolChoice(raw); err != nil {
			return Request{}, err
		}
	}
	b.serial = r.ParallelToolCalls != nil && !*r.ParallelToolCalls
	return b.finish(cacheKey)
}

// stopSequences is stop, a string or a list, as stop_sequences.
func stopSequences(raw json.RawMessage) ([]string, error) {
	if raw == nil {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		raw, _ = json.Marshal([]string{one})
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, errors.New("stop: a string or a list of strings")
	}
	return slices.DeleteFunc(list, func(s string) bool { return s == "" }), nil
}

func (b *builder) chatMessage(m chatInMessage) error {
	if m.Role == "function" || (len(m.FunctionCall) > 0 && string(m.FunctionCall) != "null") {
		return unsupported("function_call (the deprecated functions API)")
	}
	blocks, err := chatContent(m.Content, m.Role)
	if err != nil {
		return err
	}
	switch m.Role {
	case "system", "developer":
		b.body.System = append(b.body.System, blocks...)
	case "user":
		b.add("user", blocks...)
	case "assistant":
		if m.ReasoningContent != "" {
			b.drop("reasoning_content") // unsigned: Messages cannot take it back
		}
		for _, tc := range m.ToolCalls {
			if tc.Type != "" && tc.Type != "function" {
				return unsupported("a tool call of type %q", tc.Type)
			}
			tu, err := toolUse(tc.ID, tc.Function.Name, tc.Function.Arguments)
			if err != nil {
				return err
			}
			blocks = append(blocks, tu)
		}
		b.add("assistant", blocks...)
	case "tool":
		var content any = blocks
		var text string
		if json.Unmarshal(m.Content, &text) == nil {
			content = text
		}
		tr, err := toolResult(m.ToolCallID, content)
		if err != nil {
			return err
		}
		b.add("user", tr)
	default:
		return fmt.Errorf("a message of role %q", m.Role)
	}
	return nil
}

// chatContent is a message's content as Messages blocks: a string, or
// parts (images only in a user message; refusals, an assistant's own
// words, as text).
func chatContent(raw json.RawMessage, role string) ([]block, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return textBlocks(text), nil
	}
	var parts []chatInPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, errors.New("content: a string or an array of parts")
	}
	var out []block
	for _, p := range parts {
		switch {
		case p.Type == "text":
			out = append(out, textBlocks(p.Text)...)
		case p.Type == "refusal" && role == "assistant":
			out = append(out, textBlocks(p.Refusal)...)
		case p.Type == "image_url" && role == "user" && p.ImageURL != nil:
			img, err := imageBlock(p.ImageURL.URL)
			if err != nil {
				return nil, err
			}
			out = append(out, img)
		default:
			return nil, unsupported("a %q part in a %s message", p.Type, role)
		}
	}
	return out, nil
}

// finishReason is a Messages stop_reason as a Chat finish_reason.
func finishReason(stop string) string {
	switch stop {
	case "max_tokens", "model_context_window_exceeded":
		return "length"
	case "tool_use":
		return "tool_calls"
	case "refusal":
		return "content_filter"
	}
	return "stop"
}

// MessagesToChatAnswer translates a whole Messages answer into the Chat
// completion a client of model expects: the text, tool_use blocks as
// tool calls (ids kept), the stop reason, usage with every prompt token
// in prompt_tokens. Thinking goes in reasoning_content, the field
// DeepSeek's and others' Chat APIs and the clients reading them use: Chat
// Completions has no standard place for it.
func MessagesToChatAnswer(body []byte, model string, _ Request) ([]byte, error) {
	a, err := readAnswer(body)
	if err != nil {
		return nil, err
	}
	var text, thinking strings.Builder
	var calls []any
	for _, b := range a.Content {
		switch b.Type {
		case "text":
			text.WriteString(b.Text)
		case "thinking":
			thinking.WriteString(b.Thinking)
		case "tool_use":
			args, err := arguments(b.Input)
			if err != nil {
				return nil, err
			}
			calls = append(calls, map[string]any{"id": b.ID, "type": "function", "function": map[string]any{"name": b.Name, "arguments": args}})
		}
	}
	msg := map[string]any{"role": "assistant", "content": nil, "refusal": nil}
	if text.Len() > 0 {
		msg["content"] = text.String()
	}
	if len(calls) > 0 {
		msg["tool_calls"] = calls
	}
	if thinking.Len() > 0 {
		msg["reasoning_content"] = thinking.String()
	}
	var u usage
	u.merge(a.Usage)
	return json.Marshal(map[string]any{"id": "chatcmpl-" + strings.TrimPrefix(a.ID, "msg_"), "object": "chat.completion",
		"created": 0, "model": model, "choices": []any{map[string]any{"index": 0, "message": msg,
			"finish_reason": finishReason(a.StopReason), "logprobs": nil}}, "usage": u.chat()})
}

// chatOutStream turns a Messages stream into Chat completion chunks.
type chatOutStream struct {
	r            messagesReader
	model, id    string
	includeUsage bool
	calls        int    // tool calls begun
	open         string // the open block's type
	argsSent     bool   // the open tool_use block's arguments have begun
}

// NewMessagesToChatStream translates a Messages stream into the Chat
// chunks a client of model expects: a role chunk, text as content,
// thinking as reasoning_content, each tool_use block as a tool call
// (indexed from 0) and its input_json_delta pieces as its arguments, the
// finish reason, the usage chunk if req.IncludeUsage, and [DONE].
func NewMessagesToChatStream(model string, req Request) Stream {
	return &chatOutStream{model: model, includeUsage: req.IncludeUsage}
}

func (s *chatOutStream) Event(name string, data []byte) ([]byte, error) {
	ev, typ, err := s.r.read(name, data)
	if err != nil || typ == "" {
		return nil, err
	}
	switch typ {
	case "message_start":
		s.id = "chatcmpl-" + strings.TrimPrefix(s.r.id, "msg_")
		return s.chunk(map[string]any{"role": "assistant", "content": ""}, nil), nil
	case "content_block_start":
		cb := ev.ContentBlock
		s.open = cb.Type
		switch cb.Type {
		case "text":
			return s.content("content", cb.Text), nil
		case "thinking":
			return s.content("reasoning_content", cb.Thinking), nil
		case "tool_use":
			s.calls, s.argsSent = s.calls+1, false
			return s.call(map[string]any{"id": cb.ID, "type": "function", "function": map[string]any{"name": cb.Name, "arguments": ""}}), nil
		}
	case "content_block_delta":
		switch d := ev.Delta; d.Type {
		case "text_delta":
			return s.content("content", d.Text), nil
		case "thinking_delta":
			return s.content("reasoning_content", d.Thinking), nil
		case "input_json_delta":
			if d.PartialJSON == "" {
				return nil, nil
			}
			s.argsSent = true
			return s.call(map[string]any{"function": map[string]any{"arguments": d.PartialJSON}}), nil
		}
	case "content_block_stop":
		// A call without input: its arguments are the empty object the
		// Messages block's input is.
		if s.open == "tool_use" && !s.argsSent {
			s.open = ""
			return s.call(map[string]any{"function": map[string]any{"arguments": "{}"}}), nil
		}
		s.open = ""
	case "message_stop":
		out := s.chunk(map[string]any{}, finishReason(s.r.stop))
		if s.includeUsage {
			out = append(out, sseData(map[string]any{"id": s.id, "object": "chat.completion.chunk", "created": 0,
				"model": s.model, "choices": []any{}, "usage": s.r.usage.chat()})...)
		}
		return append(out, "data: [DONE]\n\n"...), nil
	}
	return nil, nil
}

// content is a delta of text or reasoning_content, none when empty.
func (s *chatOutStream) content(field, text string) []byte {
	if text == "" {
		return nil
	}
	return s.chunk(map[string]any{field: text}, nil)
}

// call is a delta of the current tool call.
func (s *chatOutStream) call(fields map[string]any) []byte {
	fields["index"] = s.calls - 1
	return s.chunk(map[string]any{"tool_calls": []any{fields}}, nil)
}

// chunk is one chunk of the stream; a client that asked the usage gets
// "usage": null on every chunk but the last, as OpenAI sends it.
func (s *chatOutStream) chunk(delta map[string]any, finish any) []byte {
	c := map[string]any{"id": s.id, "object": "chat.completion.chunk", "created": 0, "model": s.model,
		"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}}}
	if s.includeUsage {
		c["usage"] = nil
	}
	return sseData(c)
}

func sseData(v any) []byte {
	b, _ := json.Marshal(v)
	return []byte("data: " + string(b) + "\n\n")
}
