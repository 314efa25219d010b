package translate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Responses request as MessagesToResponses writes it for the Codex
// backend: a stateless turn (store false) whose whole conversation is its
// input items.
type toResponsesRequest struct {
	Model             string            `json:"model"`
	Instructions      string            `json:"instructions,omitempty"`
	Input             []json.RawMessage `json:"input"`
	Tools             []toResponsesTool `json:"tools,omitempty"`
	ToolChoice        any               `json:"tool_choice,omitempty"`
	ParallelToolCalls *bool             `json:"parallel_tool_calls,omitempty"`
	Reasoning         *responsesEffort  `json:"reasoning,omitempty"`
	Store             bool              `json:"store"`
	Stream            bool              `json:"stream"`
	PromptCacheKey    string            `json:"prompt_cache_key,omitempty"`
}

type toResponsesTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      bool            `json:"strict"`
}

type responsesEffort struct {
	Effort  string `json:"effort"`
	Summary string `json:"summary,omitempty"`
}

type responsesMessage struct {
	Type    string           `json:"type"`
	Role    string           `json:"role"`
	Content []responsesInput `json:"content"`
}

type responsesInput struct {
	Type     string `json:"type"`
	Text     string `json:"text,omitempty"`
	ImageURL string `json:"image_url,omitempty"`
}

type responsesCall struct {
	Type      string `json:"type"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type responsesCallOutput struct {
	Type   string `json:"type"`
	CallID string `json:"call_id"`
	Output string `json:"output"`
}

// MessagesToResponses translates a Messages request body into a Responses
// one for the Codex backend and model (the target's). cacheKey, when set,
// is its prompt_cache_key. The backend refuses an output cap and sampling
// settings (the plan sets its own): max_tokens, temperature and top_p are
// left out and named in Dropped; a metadata.user_id, which identifies the
// client to Anthropic, is left out too. stop_sequences and top_k have no
// Responses form and are refused. Thinking asks for the target's
// reasoning, with its summary, at an effort from the budget.
func MessagesToResponses(body []byte, model, cacheKey string) (Request, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return Request{}, fmt.Errorf("request body: %w", err)
	}
	extra, err := checkMessagesFields(top)
	if err != nil {
		return Request{}, err
	}
	var req messagesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return Request{}, fmt.Errorf("request body: %w", err)
	}
	if len(req.StopSequences) > 0 {
		return Request{}, unsupported("stop_sequences")
	}
	var dropped []string
	for _, k := range []string{"max_tokens", "temperature", "top_p", "metadata"} {
		if v, ok := top[k]; ok && string(v) != "null" {
			dropped = append(dropped, k)
		}
	}
	dropped = append(dropped, extra...)
	out := toResponsesRequest{Model: model, Input: []json.RawMessage{}, Stream: req.Stream, PromptCacheKey: cacheKey}
	sys, err := systemText(req.System)
	if err != nil {
		return Request{}, err
	}
	out.Instructions = sys
	for i, m := range req.Messages {
		items, err := responsesItems(m)
		if err != nil {
			return Request{}, fmt.Errorf("messages[%d]: %w", i, err)
		}
		out.Input = append(out.Input, items...)
	}
	for _, t := range req.Tools {
		if t.Type != "" && t.Type != "custom" {
			return Request{}, unsupported("the server tool %q (%s)", t.Name, t.Type)
		}
		params := t.InputSchema
		if len(params) == 0 || string(params) == "null" {
			params = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		out.Tools = append(out.Tools, toResponsesTool{Type: "function", Name: t.Name, Description: t.Description, Parameters: params})
	}
	if c := req.ToolChoice; c != nil {
		switch c.Type {
		case "auto":
			out.ToolChoice = "auto"
		case "any":
			out.ToolChoice = "required"
		case "none":
			out.ToolChoice = "none"
		case "tool":
			out.ToolChoice = map[string]string{"type": "function", "name": c.Name}
		default:
			return Request{}, unsupported("tool_choice %q", c.Type)
		}
		if c.DisableParallel {
			f := false
			out.ParallelToolCalls = &f
		}
	}
	effort, err := thinkingEffort(top["thinking"], top["output_config"])
	if err != nil {
		return Request{}, err
	}
	if effort != "" {
		// Carried: the target reasons at that effort, with its summary.
		out.Reasoning = &responsesEffort{Effort: effort, Summary: "auto"}
		dropped = slices.DeleteFunc(dropped, func(k string) bool { return k == "thinking" || k == "output_config" })
	}
	b, err := json.Marshal(out)
	return Request{Body: b, Dropped: dropped}, err
}

// thinkingEffort is a Messages thinking setting as a reasoning effort: ""
// when thinking is off; an output effort (output_config.effort: low,
// medium, high) when the request names one, else the budget's size picks
// low, medium or high (adaptive thinking: medium).
func thinkingEffort(raw, outputConfig json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var t struct {
		Type         string `json:"type"`
		BudgetTokens int64  `json:"budget_tokens"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return "", errors.New("thinking: an object")
	}
	switch t.Type {
	case "disabled", "":
		return "", nil
	case "adaptive", "enabled":
	default:
		return "", unsupported("thinking of type %q", t.Type)
	}
	var oc struct {
		Effort string `json:"effort"`
	}
	if len(outputConfig) > 0 && string(outputConfig) != "null" {
		if err := json.Unmarshal(outputConfig, &oc); err != nil {
			return "", errors.New("output_config: an object")
		}
	}
	switch oc.Effort {
	case "low", "medium", "high":
		return oc.Effort, nil
	case "":
	default:
		return "", unsupported("the output effort %q", oc.Effort)
	}
	if t.Type == "adaptive" {
		return "medium", nil
	}
	switch {
	case t.BudgetTokens < 4096:
		return "low", nil
	case t.BudgetTokens < 16384:
		return "medium", nil
	}
	return "high", nil
}

// responsesItems is one Messages message as Responses input items: a user
// turn's tool results become function_call_output items (in place, in
// their order), its text and images a user message; an assistant turn's
// text an assistant message and its tool_use blocks function_call items,
// ids kept as call ids.
func responsesItems(m messagesMessage) ([]json.RawMessage, error) {
	var items []json.RawMessage
	add := func(v any) {
		b, _ := json.Marshal(v)
		items = append(items, b)
	}
	if m.Role == "system" {
		// A system message between the turns (Claude Code's notes to the
		// model) is the developer's word where it stands.
		text, err := systemText(m.Content)
		if err != nil {
			return nil, err
		}
		add(responsesMessage{Type: "message", Role: "developer", Content: []responsesInput{{Type: "input_text", Text: text}}})
		return items, nil
	}
	var text string
	if json.Unmarshal(m.Content, &text) == nil {
		switch m.Role {
		case "user":
			add(responsesMessage{Type: "message", Role: "user", Content: []responsesInput{{Type: "input_text", Text: text}}})
		case "assistant":
			add(responsesMessage{Type: "message", Role: "assistant", Content: []responsesInput{{Type: "output_text", Text: text}}})
		default:
			return nil, fmt.Errorf("role %q: user, assistant or system", m.Role)
		}
		return items, nil
	}
	var blocks []messagesBlock
	if err := json.Unmarshal(m.Content, &blocks); err != nil {
		return nil, errors.New("content: a string or an array of blocks")
	}
	var parts []responsesInput
	flush := func(role string) {
		if len(parts) > 0 {
			add(responsesMessage{Type: "message", Role: role, Content: parts})
			parts = nil
		}
	}
	switch m.Role {
	case "user":
		for _, b := range blocks {
			switch b.Type {
			case "text":
				parts = append(parts, responsesInput{Type: "input_text", Text: b.Text})
			case "image":
				url, err := imageURL(b)
				if err != nil {
					return nil, err
				}
				parts = append(parts, responsesInput{Type: "input_image", ImageURL: url})
			case "tool_result":
				content, err := toolResultText(b)
				if err != nil {
					return nil, err
				}
				flush("user")
				add(responsesCallOutput{Type: "function_call_output", CallID: b.ToolUseID, Output: content})
			default:
				return nil, unsupported("a %q block in a user turn", b.Type)
			}
		}
		flush("user")
	case "assistant":
		for _, b := range blocks {
			switch b.Type {
			case "text":
				parts = append(parts, responsesInput{Type: "output_text", Text: b.Text})
			case "tool_use":
				args := string(bytes.TrimSpace(b.Input))
				if args == "" {
					args = "{}"
				}
				flush("assistant")
				add(responsesCall{Type: "function_call", CallID: b.ID, Name: b.Name, Arguments: args})
			case "thinking", "redacted_thinking":
				// An earlier turn's thinking: the target keeps its own
				// reasoning, and reads no other's.
			default:
				return nil, unsupported("a %q block in an assistant turn", b.Type)
			}
		}
		flush("assistant")
	default:
		return nil, fmt.Errorf("role %q: user, assistant or system", m.Role)
	}
	return items, nil
}

// Responses answer, as ResponsesToMessages reads it.
type responsesResponse struct {
	ID                string              `json:"id"`
	Status            string              `json:"status"`
	Output            []fromResponsesItem `json:"output"`
	Usage             *responsesUsage     `json:"usage"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
}

type fromResponsesItem struct {
	Type      string `json:"type"`
	ID        string `json:"id"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Input     string `json:"input"`
	Content   []struct {
		Type    string `json:"type"`
		Text    string `json:"text"`
		Refusal string `json:"refusal"`
	} `json:"content"`
	Summary []struct {
		Text string `json:"text"`
	} `json:"summary"`
}

// responsesUsage is a Responses answer's usage.
type responsesUsage struct {
	InputTokens        int64 `json:"input_tokens"`
	OutputTokens       int64 `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

// messagesUsage is it as a Messages usage object: cached input tokens are
// cache reads, and input is the rest. A nil usage is all zeros.
func (u *responsesUsage) messagesUsage() map[string]int64 {
	if u == nil {
		return (*chatUsage)(nil).messagesUsage()
	}
	c := &chatUsage{PromptTokens: u.InputTokens, CompletionTokens: u.OutputTokens}
	if u.InputTokensDetails != nil {
		c.PromptTokensDetails = &struct {
			CachedTokens int64 `json:"cached_tokens"`
		}{u.InputTokensDetails.CachedTokens}
	}
	return c.messagesUsage()
}

// responsesStop is a finished response's Messages stop_reason: tool_use
// when it called a tool, max_tokens when it ran out of output.
func responsesStop(status, incomplete string, called bool) string {
	switch {
	case called:
		return "tool_use"
	case status == "incomplete" && incomplete == "content_filter":
		return "refusal"
	case status == "incomplete":
		return "max_tokens"
	}
	return "end_turn"
}

// ResponsesToMessages translates a whole Responses answer into the
// Messages answer a client of model expects: reasoning summaries as
// thinking blocks, text, function calls as tool_use blocks (call ids kept,
// arguments parsed), the stop reason and usage.
func ResponsesToMessages(body []byte, model string, _ Request) ([]byte, error) {
	var r responsesResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("upstream answer: %w", err)
	}
	content := []map[string]any{}
	called := false
	for _, it := range r.Output {
		switch it.Type {
		case "reasoning":
			var texts []string
			for _, s := range it.Summary {
				texts = append(texts, s.Text)
			}
			if len(texts) > 0 {
				content = append(content, map[string]any{"type": "thinking", "thinking": strings.Join(texts, "\n\n"), "signature": ""})
			}
		case "message":
			for _, c := range it.Content {
				text := c.Text
				if c.Type == "refusal" {
					text = c.Refusal
				}
				if text != "" {
					content = append(content, map[string]any{"type": "text", "text": text})
				}
			}
		case "function_call":
			input := json.RawMessage(it.Arguments)
			if len(bytes.TrimSpace(input)) == 0 {
				input = json.RawMessage("{}")
			}
			if !json.Valid(input) {
				return nil, fmt.Errorf("upstream answer: function call %s: arguments are not JSON", it.CallID)
			}
			called = true
			content = append(content, map[string]any{"type": "tool_use", "id": it.CallID, "name": it.Name, "input": input})
		}
	}
	var incomplete string
	if r.IncompleteDetails != nil {
		incomplete = r.IncompleteDetails.Reason
	}
	return json.Marshal(map[string]any{"id": "msg_" + strings.TrimPrefix(r.ID, "resp_"), "type": "message", "role": "assistant",
		"model": model, "content": content, "stop_reason": responsesStop(r.Status, incomplete, called), "stop_sequence": nil,
		"usage": r.Usage.messagesUsage()})
}
