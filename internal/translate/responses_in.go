package translate

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// knownResponsesFields are the Responses request fields
// ResponsesToMessagesRequest reads; others are refused by name. Of those
// it leaves out, the ones that change what the client gets are named in
// Dropped: text.verbosity, service_tier (but auto and default) and
// truncation "auto". store, include, prompt_cache_key (the session's
// cache key is weir's), metadata, user, client_metadata (Codex's
// telemetry) and reasoning.summary (Claude's thinking comes summarized
// whatever is asked) change nothing and are not.
var knownResponsesFields = map[string]bool{
	"model": true, "instructions": true, "input": true, "tools": true, "tool_choice": true,
	"parallel_tool_calls": true, "reasoning": true, "store": true, "stream": true, "include": true,
	"prompt_cache_key": true, "text": true, "max_output_tokens": true, "temperature": true, "top_p": true,
	"metadata": true, "user": true, "previous_response_id": true, "service_tier": true, "truncation": true,
	"client_metadata": true,
}

// responsesRequest is a Responses request, as ResponsesToMessagesRequest
// reads it.
type responsesRequest struct {
	Instructions      string          `json:"instructions"`
	Input             json.RawMessage `json:"input"`
	Tools             []responsesTool `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
	Reasoning         *struct {
		Effort string `json:"effort"`
	} `json:"reasoning"`
	MaxOutputTokens *int64   `json:"max_output_tokens"`
	Temperature     *float64 `json:"temperature"`
	TopP            *float64 `json:"top_p"`
	Stream          bool     `json:"stream"`
	Text            *struct {
		Verbosity string `json:"verbosity"`
		Format    *struct {
			Type string `json:"type"`
		} `json:"format"`
	} `json:"text"`
	ServiceTier string `json:"service_tier"`
	Truncation  string `json:"truncation"`
}

type responsesTool struct {
	Type string `json:"type"`
	Name string `json:"name"`
	// Tools are a namespace's own.
	Tools       []responsesTool `json:"tools"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      bool            `json:"strict"`
	Format      *struct {
		Syntax     string `json:"syntax"`
		Definition string `json:"definition"`
	} `json:"format"`
}

// responsesItem is an input item, as ResponsesToMessagesRequest reads it.
type responsesItem struct {
	Type             string          `json:"type"`
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	CallID           string          `json:"call_id"`
	Name             string          `json:"name"`
	Namespace        string          `json:"namespace"`
	Arguments        string          `json:"arguments"`
	Input            string          `json:"input"`
	Output           json.RawMessage `json:"output"`
	EncryptedContent string          `json:"encrypted_content"`
}

type responsesPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Refusal  string `json:"refusal"`
	ImageURL string `json:"image_url"`
}

// hostedSearch are the Responses tools the provider runs itself to
// search the web, which Codex offers by default: left out of a translated
// request and named in Dropped, where any other hosted tool (file
// search, code interpreter, computer use) is refused.
var hostedSearch = map[string]bool{"web_search": true, "web_search_preview": true}

// customToolSchema is a custom (freeform) tool's input as a Messages
// tool's: one string.
var customToolSchema = json.RawMessage(`{"type":"object","properties":{"input":{"type":"string"}},"required":["input"]}`)

// ResponsesToMessagesRequest translates a Responses request (Codex CLI's)
// into a Messages one for model (the target's): instructions and system
// and developer messages become the system prompt; function and custom
// tool calls tool_use blocks and their outputs tool_result blocks, ids
// kept; a custom tool a tool of one string, "input", named in
// CustomTools; reasoning.effort thinking (see builder.finish). A
// reasoning item of an earlier answer goes back as the thinking block it
// carries (see thinkingPrefix); another's, which Messages cannot read, is
// named in Dropped. cacheKey set marks the prompt for caching. What
// Messages cannot carry, or a conversation stored upstream, is refused
// (Unsupported).
func ResponsesToMessagesRequest(body []byte, model, cacheKey string) (Request, error) {
	top, err := topFields(body, knownResponsesFields)
	if err != nil {
		return Request{}, err
	}
	if top["previous_response_id"] != nil {
		return Request{}, unsupported("previous_response_id (a stored conversation)")
	}
	var r responsesRequest
	if err := json.Unmarshal(body, &r); err != nil {
		return Request{}, fmt.Errorf("request body: %w", err)
	}
	b := builder{effortField: "reasoning.effort", thinkingField: "input reasoning items", maxTokens: r.MaxOutputTokens}
	b.body.Model, b.body.Stream, b.body.Temperature, b.body.TopP = model, r.Stream, r.Temperature, r.TopP
	if r.Reasoning != nil {
		if b.effort, err = effortOf(r.Reasoning.Effort); err != nil {
			return Request{}, err
		}
	}
	if t := r.Text; t != nil {
		if t.Format != nil && t.Format.Type != "text" {
			return Request{}, unsupported("text.format %q", t.Format.Type)
		}
		if t.Verbosity != "" && t.Verbosity != "medium" {
			b.drop("text.verbosity")
		}
	}
	if r.ServiceTier != "" && r.ServiceTier != "auto" && r.ServiceTier != "default" {
		b.drop("service_tier")
	}
	if r.Truncation == "auto" {
		b.drop("truncation")
	}
	b.body.System = textBlocks(r.Instructions)
	var prompt string
	if json.Unmarshal(r.Input, &prompt) == nil {
		b.add("user", textBlocks(prompt)...)
	} else {
		var items []responsesItem
		if err := json.Unmarshal(r.Input, &items); err != nil {
			return Request{}, errors.New("input: a string or an array of items")
		}
		for i, it := range items {
			if err := b.responsesItem(it); err != nil {
				return Request{}, fmt.Errorf("input[%d]: %w", i, err)
			}
		}
	}
	for _, t := range r.Tools {
		if hostedSearch[t.Type] {
			// The provider's own web search, run on its side: the target
			// has none in this form, and the model does without (named,
			// never silently).
			b.drop("tools[" + t.Type + "]")
			continue
		}
		if t.Type != "namespace" {
			tool, err := b.responsesTool(t)
			if err != nil {
				return Request{}, err
			}
			b.body.Tools = append(b.body.Tools, tool)
			continue
		}
		// A namespace's tools are tools of their own on the Messages
		// wire, each under its one name (namespacedName); its
		// description goes with each.
		if t.Name == "" {
			return Request{}, errors.New("a namespace tool without a name")
		}
		for _, nt := range t.Tools {
			flat := namespacedName(t.Name, nt.Name)
			if b.req.Namespaced == nil {
				b.req.Namespaced = map[string]ToolName{}
			}
			b.req.Namespaced[flat] = ToolName{Namespace: t.Name, Name: nt.Name}
			nt.Name = flat
			if t.Description != "" {
				nt.Description = strings.TrimSpace(t.Description + "\n\n" + nt.Description)
			}
			tool, err := b.responsesTool(nt)
			if err != nil {
				return Request{}, fmt.Errorf("namespace %s: %w", t.Name, err)
			}
			b.body.Tools = append(b.body.Tools, tool)
		}
	}
	if raw := top["tool_choice"]; raw != nil {
		if b.choice, b.forced, err = toolChoice(raw); err != nil {
			return Request{}, err
		}
	}
	b.serial = r.ParallelToolCalls != nil && !*r.ParallelToolCalls
	return b.finish(cacheKey)
}

func (b *builder) responsesItem(it responsesItem) error {
	if (it.Type == "function_call" || it.Type == "custom_tool_call") && it.Namespace != "" {
		it.Name = namespacedName(it.Namespace, it.Name)
	}
	switch it.Type {
	case "message", "":
		blocks, err := responsesContent(it.Content, it.Role)
		if err != nil {
			return err
		}
		switch it.Role {
		case "system", "developer":
			b.body.System = append(b.body.System, blocks...)
		case "user", "assistant":
			b.add(it.Role, blocks...)
		default:
			return fmt.Errorf("a message of role %q", it.Role)
		}
	case "function_call", "custom_tool_call":
		args := it.Arguments
		if it.Type == "custom_tool_call" {
			j, _ := json.Marshal(map[string]string{"input": it.Input})
			args = string(j)
		}
		tu, err := toolUse(it.CallID, it.Name, args)
		if err != nil {
			return err
		}
		b.add("assistant", tu)
	case "function_call_output", "custom_tool_call_output":
		var content any
		var text string
		if json.Unmarshal(it.Output, &text) == nil {
			content = text
		} else {
			blocks, err := responsesContent(it.Output, "tool")
			if err != nil {
				return err
			}
			content = blocks
		}
		tr, err := toolResult(it.CallID, content)
		if err != nil {
			return err
		}
		b.add("user", tr)
	case "reasoning":
		if tb := openThinking(it.EncryptedContent); tb != nil {
			b.add("assistant", tb)
		} else {
			b.drop(b.thinkingField)
		}
	default:
		return unsupported("an input item of type %q", it.Type)
	}
	return nil
}

// responsesContent is a message's content (or a tool output's parts) as
// Messages blocks: a string, or parts, images only from the user or a
// tool.
func responsesContent(raw json.RawMessage, role string) ([]block, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var text string
	if json.Unmarshal(raw, &text) == nil {
		return textBlocks(text), nil
	}
	var parts []responsesPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, errors.New("content: a string or an array of parts")
	}
	var out []block
	for _, p := range parts {
		switch {
		case p.Type == "input_text" || p.Type == "output_text":
			out = append(out, textBlocks(p.Text)...)
		case p.Type == "refusal" && role == "assistant":
			out = append(out, textBlocks(p.Refusal)...)
		case p.Type == "input_image" && (role == "user" || role == "tool"):
			if p.ImageURL == "" {
				return nil, unsupported("an input_image given by file_id")
			}
			img, err := imageBlock(p.ImageURL)
			if err != nil {
				return nil, err
			}
			out = append(out, img)
		case p.Type == "input_file":
			return nil, unsupported("an input_file part")
		default:
			return nil, unsupported("a %q part in a %s message", p.Type, role)
		}
	}
	return out, nil
}

// responsesTool is a client tool as a Messages tool. A custom tool's
// input is one string; its grammar, which Messages cannot enforce, is
// told the model in the description.
func (b *builder) responsesTool(t responsesTool) (block, error) {
	switch t.Type {
	case "function":
		if t.Strict {
			b.drop("tools[].strict")
		}
		return functionTool(t.Name, t.Description, t.Parameters)
	case "custom":
		if t.Name == "" {
			return nil, errors.New("a custom tool without a name")
		}
		desc := t.Description
		if f := t.Format; f != nil && f.Definition != "" {
			grammar := fmt.Sprintf("The input must follow this %s grammar:\n%s", f.Syntax, f.Definition)
			desc = strings.TrimSpace(desc + "\n\n" + grammar)
		}
		if b.req.CustomTools == nil {
			b.req.CustomTools = map[string]bool{}
		}
		b.req.CustomTools[t.Name] = true
		tool := block{"name": t.Name, "input_schema": customToolSchema}
		if desc != "" {
			tool["description"] = desc
		}
		return tool, nil
	case "namespace":
		return nil, errors.New("a namespace inside a namespace") // responsesTools flattens the first level
	}
	return nil, unsupported("the tool type %q", t.Type)
}

// itemID is an output item's id: derived from the Messages answer's id
// and the item's place, so that a translation is a pure function.
func itemID(prefix, base string, index int) string {
	return fmt.Sprintf("%s_%s_%d", prefix, base, index)
}

func outputText(text string) map[string]any {
	return map[string]any{"type": "output_text", "text": text, "annotations": []any{}}
}

func summaryText(text string) map[string]any {
	return map[string]any{"type": "summary_text", "text": text}
}

// messageItem is an assistant message item with one output_text part per
// text (none while it is in progress).
func messageItem(id, status string, texts ...string) map[string]any {
	content := []any{}
	for _, t := range texts {
		content = append(content, outputText(t))
	}
	return map[string]any{"type": "message", "id": id, "role": "assistant", "status": status, "content": content}
}

// reasoningItem is a reasoning item: the thinking as its summary, and in
// encrypted_content the block to send back (see thinkingPrefix).
func reasoningItem(id string, summary []any, sealed string) map[string]any {
	it := map[string]any{"type": "reasoning", "id": id, "summary": summary}
	if sealed != "" {
		it["encrypted_content"] = sealed
	}
	return it
}

func functionCallItem(id, callID string, name ToolName, args, status string) map[string]any {
	return withNamespace(map[string]any{"type": "function_call", "id": id, "call_id": callID, "name": name.Name, "arguments": args, "status": status}, name)
}

// withNamespace names a call item's namespace, when it has one.
func withNamespace(item map[string]any, name ToolName) map[string]any {
	if name.Namespace != "" {
		item["namespace"] = name.Namespace
	}
	return item
}

// customCallItem is a custom tool call item (it has no status).
func customCallItem(id, callID string, name ToolName, input string) map[string]any {
	return withNamespace(map[string]any{"type": "custom_tool_call", "id": id, "call_id": callID, "name": name.Name, "input": input}, name)
}

// customInput is a custom tool's input string out of the tool_use input
// Messages gave it.
func customInput(input json.RawMessage) (string, error) {
	var in struct {
		Input *string `json:"input"`
	}
	if json.Unmarshal(input, &in) != nil || in.Input == nil {
		return "", errors.New("upstream answer: a custom tool's call without its input string")
	}
	return *in.Input, nil
}

// incompleteReason is why a response with this stop reason is
// incomplete, "" when it is complete.
func incompleteReason(stop string) string {
	switch stop {
	case "max_tokens", "model_context_window_exceeded":
		return "max_output_tokens"
	case "refusal":
		return "content_filter"
	}
	return ""
}

// responseObject is a Responses response object; in progress while u is
// nil, else finished with u.
func responseObject(id, model, stop string, output []any, u *usage) map[string]any {
	r := map[string]any{"id": id, "object": "response", "created_at": 0, "status": "in_progress", "error": nil,
		"incomplete_details": nil, "model": model, "output": output, "usage": nil}
	if output == nil {
		r["output"] = []any{}
	}
	if u != nil {
		r["status"], r["usage"] = "completed", u.responses()
		if reason := incompleteReason(stop); reason != "" {
			r["status"], r["incomplete_details"] = "incomplete", map[string]any{"reason": reason}
		}
	}
	return r
}

// MessagesToResponsesAnswer translates a whole Messages answer into the
// Responses response a client of model expects: thinking as reasoning
// items, each run of text blocks as one message item, tool_use blocks as
// function calls (custom tool calls for req.CustomTools), ids kept; the
// status, incomplete when the answer was cut; usage with every input
// token in input_tokens.
func MessagesToResponsesAnswer(body []byte, model string, req Request) ([]byte, error) {
	a, err := readAnswer(body)
	if err != nil {
		return nil, err
	}
	base := strings.TrimPrefix(a.ID, "msg_")
	output := []any{}
	var texts []string
	flush := func() {
		if len(texts) > 0 {
			output = append(output, messageItem(itemID("msg", base, len(output)), "completed", texts...))
			texts = nil
		}
	}
	for _, b := range a.Content {
		if b.Type == "text" {
			texts = append(texts, b.Text)
			continue
		}
		flush()
		n := len(output)
		switch {
		case b.Type == "thinking":
			output = append(output, reasoningItem(itemID("rs", base, n), []any{summaryText(b.Thinking)}, sealThinking(b)))
		case b.Type == "redacted_thinking":
			output = append(output, reasoningItem(itemID("rs", base, n), []any{}, sealThinking(b)))
		case req.CustomTools[b.Name]:
			input, err := customInput(b.Input)
			if err != nil {
				return nil, err
			}
			output = append(output, customCallItem(itemID("ctc", base, n), b.ID, req.clientName(b.Name), input))
		default:
			args, err := arguments(b.Input)
			if err != nil {
				return nil, err
			}
			output = append(output, functionCallItem(itemID("fc", base, n), b.ID, req.clientName(b.Name), args, "completed"))
		}
	}
	flush()
	var u usage
	u.merge(a.Usage)
	return json.Marshal(responseObject("resp_"+base, model, a.StopReason, output, &u))
}

// responsesOutStream turns a Messages stream into Responses events.
type responsesOutStream struct {
	r        messagesReader
	model    string
	req      Request
	custom   map[string]bool
	seq      int
	id, base string
	output   []any       // the finished output items
	cur      *streamItem // the open block's item
}

// streamItem is the output item of the open content block.
type streamItem struct {
	kind         string // message, function_call, custom_tool_call or reasoning
	id           string
	index        int
	callID, name string
	text         strings.Builder // the text, arguments, custom input JSON or thinking
	block        answerBlock     // a thinking block's type, signature or data
}

// NewMessagesToResponsesStream translates a Messages stream into the
// Responses events a client of model expects, numbered in sequence:
// response.created and in_progress; per content block its output item
// added, its deltas (output_text, function_call_arguments or
// reasoning_summary_text) and done events, a custom tool's call
// (req.CustomTools) whole at the block's end; then response.completed,
// or response.incomplete for an answer cut short, with every item and the
// usage.
func NewMessagesToResponsesStream(model string, req Request) Stream {
	return &responsesOutStream{model: model, req: req, custom: req.CustomTools}
}

func (s *responsesOutStream) Event(name string, data []byte) ([]byte, error) {
	ev, typ, err := s.r.read(name, data)
	if err != nil || typ == "" {
		return nil, err
	}
	switch typ {
	case "message_start":
		s.base = strings.TrimPrefix(s.r.id, "msg_")
		s.id = "resp_" + s.base
		resp := responseObject(s.id, s.model, "", nil, nil)
		return append(s.emit("response.created", map[string]any{"response": resp}),
			s.emit("response.in_progress", map[string]any{"response": resp})...), nil
	case "content_block_start":
		return s.start(ev.ContentBlock), nil
	case "content_block_delta":
		d := ev.Delta
		text := map[string]string{"text_delta": d.Text, "input_json_delta": d.PartialJSON,
			"thinking_delta": d.Thinking, "signature_delta": d.Signature}[d.Type]
		return s.delta(d.Type, text), nil
	case "content_block_stop":
		return s.stop()
	case "message_stop":
		u := s.r.usage
		resp := responseObject(s.id, s.model, s.r.stop, s.output, &u)
		return s.emit("response."+resp["status"].(string), map[string]any{"response": resp}), nil
	}
	return nil, nil
}

// emit is one event, numbered.
func (s *responsesOutStream) emit(typ string, fields map[string]any) []byte {
	fields["type"], fields["sequence_number"] = typ, s.seq
	s.seq++
	return event(typ, fields)
}

// at is an event's fields about the open item, with more.
func (s *responsesOutStream) at(more map[string]any) map[string]any {
	more["item_id"], more["output_index"] = s.cur.id, s.cur.index
	return more
}

func (s *responsesOutStream) start(cb *answerBlock) []byte {
	n := len(s.output)
	it := &streamItem{index: n, callID: cb.ID, name: cb.Name, block: answerBlock{Type: cb.Type, Signature: cb.Signature, Data: cb.Data}}
	s.cur = it
	var out []byte
	switch {
	case cb.Type == "text":
		it.kind, it.id = "message", itemID("msg", s.base, n)
		out = s.emit("response.output_item.added", map[string]any{"output_index": n, "item": messageItem(it.id, "in_progress")})
		out = append(out, s.emit("response.content_part.added", s.at(map[string]any{"content_index": 0, "part": outputText("")}))...)
		return append(out, s.delta("text_delta", cb.Text)...)
	case cb.Type == "tool_use" && s.custom[cb.Name]:
		// Sent whole at the block's end: its input is a string inside
		// the JSON the deltas build.
		it.kind, it.id = "custom_tool_call", itemID("ctc", s.base, n)
		return nil
	case cb.Type == "tool_use":
		it.kind, it.id = "function_call", itemID("fc", s.base, n)
		return s.emit("response.output_item.added", map[string]any{"output_index": n,
			"item": functionCallItem(it.id, it.callID, s.req.clientName(it.name), "", "in_progress")})
	}
	it.kind, it.id = "reasoning", itemID("rs", s.base, n)
	out = s.emit("response.output_item.added", map[string]any{"output_index": n, "item": reasoningItem(it.id, []any{}, "")})
	if cb.Type == "thinking" {
		out = append(out, s.emit("response.reasoning_summary_part.added", s.at(map[string]any{"summary_index": 0, "part": summaryText("")}))...)
		out = append(out, s.delta("thinking_delta", cb.Thinking)...)
	}
	return out
}

// delta is the events of one delta of the open block; none for an empty
// one.
func (s *responsesOutStream) delta(typ, text string) []byte {
	it := s.cur
	if text == "" {
		return nil
	}
	switch {
	case typ == "signature_delta":
		it.block.Signature += text
	case typ == "text_delta":
		it.text.WriteString(text)
		return s.emit("response.output_text.delta", s.at(map[string]any{"content_index": 0, "delta": text, "logprobs": []any{}}))
	case typ == "thinking_delta":
		it.text.WriteString(text)
		return s.emit("response.reasoning_summary_text.delta", s.at(map[string]any{"summary_index": 0, "delta": text}))
	case it.kind == "function_call":
		it.text.WriteString(text)
		return s.emit("response.function_call_arguments.delta", s.at(map[string]any{"delta": text}))
	default: // a custom tool's input JSON, sent whole at the end
		it.text.WriteString(text)
	}
	return nil
}

// stop is the events that finish the open block's item.
func (s *responsesOutStream) stop() ([]byte, error) {
	it := s.cur
	text := it.text.String()
	var out []byte
	var item map[string]any
	switch it.kind {
	case "message":
		out = s.emit("response.output_text.done", s.at(map[string]any{"content_index": 0, "text": text, "logprobs": []any{}}))
		out = append(out, s.emit("response.content_part.done", s.at(map[string]any{"content_index": 0, "part": outputText(text)}))...)
		item = messageItem(it.id, "completed", text)
	case "function_call":
		if text == "" {
			// A call without input: its arguments are the empty object
			// the Messages block's input is.
			out, text = s.delta("input_json_delta", "{}"), "{}"
		}
		out = append(out, s.emit("response.function_call_arguments.done", s.at(map[string]any{"arguments": text}))...)
		item = functionCallItem(it.id, it.callID, s.req.clientName(it.name), text, "completed")
	case "custom_tool_call":
		input, err := customInput(json.RawMessage(text))
		if err != nil {
			return nil, err
		}
		out = s.emit("response.output_item.added", map[string]any{"output_index": it.index, "item": customCallItem(it.id, it.callID, s.req.clientName(it.name), "")})
		out = append(out, s.emit("response.custom_tool_call_input.delta", s.at(map[string]any{"delta": input}))...)
		out = append(out, s.emit("response.custom_tool_call_input.done", s.at(map[string]any{"input": input}))...)
		item = customCallItem(it.id, it.callID, s.req.clientName(it.name), input)
	default:
		it.block.Thinking = text
		summary := []any{}
		if it.block.Type == "thinking" {
			out = s.emit("response.reasoning_summary_text.done", s.at(map[string]any{"summary_index": 0, "text": text}))
			out = append(out, s.emit("response.reasoning_summary_part.done", s.at(map[string]any{"summary_index": 0, "part": summaryText(text)}))...)
			summary = []any{summaryText(text)}
		}
		item = reasoningItem(it.id, summary, sealThinking(it.block))
	}
	s.output = append(s.output, item)
	s.cur = nil
	return append(out, s.emit("response.output_item.done", map[string]any{"output_index": it.index, "item": item})...), nil
}
