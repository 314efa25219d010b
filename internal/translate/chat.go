package translate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Messages request, as far as translation reads it. Fields weir does not
// know are refused, not dropped (see knownMessagesFields).
type messagesRequest struct {
	Model         string            `json:"model"`
	MaxTokens     *int64            `json:"max_tokens"`
	System        json.RawMessage   `json:"system"`
	Messages      []messagesMessage `json:"messages"`
	Tools         []messagesTool    `json:"tools"`
	ToolChoice    *messagesChoice   `json:"tool_choice"`
	Temperature   *float64          `json:"temperature"`
	TopP          *float64          `json:"top_p"`
	StopSequences []string          `json:"stop_sequences"`
	Stream        bool              `json:"stream"`
	Metadata      *struct {
		UserID string `json:"user_id"`
	} `json:"metadata"`
}

type messagesMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type messagesBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
	Source    *struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
		URL       string `json:"url"`
	} `json:"source"`
}

type messagesTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type messagesChoice struct {
	Type            string `json:"type"`
	Name            string `json:"name"`
	DisableParallel bool   `json:"disable_parallel_tool_use"`
}

// knownMessagesFields are the request fields the translators from
// Messages carry (cache_control lives inside blocks). Any other is
// refused, but for messagesDroppable's.
var knownMessagesFields = map[string]bool{
	"model": true, "max_tokens": true, "system": true, "messages": true, "tools": true, "tool_choice": true,
	"temperature": true, "top_p": true, "stop_sequences": true, "stream": true, "metadata": true,
}

// messagesDroppable are the request fields Claude Code sends that a
// target may have no place for without the answer changing shape: the
// server's management of earlier turns' thinking and tool results
// (context_management: a translated request carries no earlier thinking),
// the thinking setting and the output effort (the target reasons as it
// does; a translator that can say them does). Left out, they are named
// in Request.Dropped.
var messagesDroppable = map[string]bool{"context_management": true, "thinking": true, "output_config": true}

// checkMessagesFields refuses the fields of a Messages request no
// translator knows, and names the droppable ones present (not null), in
// a stable order: a translator that carries one takes it off.
func checkMessagesFields(top map[string]json.RawMessage) (dropped []string, err error) {
	for k := range top {
		if !knownMessagesFields[k] && !messagesDroppable[k] {
			return nil, unsupported("the %q field", k)
		}
	}
	for _, k := range []string{"context_management", "output_config", "thinking"} {
		if v, ok := top[k]; ok && string(v) != "null" {
			dropped = append(dropped, k)
		}
	}
	return dropped, nil
}

// Chat Completions request as MessagesToChat writes it.
type chatRequest struct {
	Model               string         `json:"model"`
	Messages            []chatMessage  `json:"messages"`
	Tools               []chatTool     `json:"tools,omitempty"`
	ToolChoice          any            `json:"tool_choice,omitempty"`
	MaxCompletionTokens *int64         `json:"max_completion_tokens,omitempty"`
	Temperature         *float64       `json:"temperature,omitempty"`
	TopP                *float64       `json:"top_p,omitempty"`
	Stop                []string       `json:"stop,omitempty"`
	Stream              bool           `json:"stream,omitempty"`
	StreamOptions       *streamOptions `json:"stream_options,omitempty"`
	User                string         `json:"user,omitempty"`
	PromptCacheKey      string         `json:"prompt_cache_key,omitempty"`
	ParallelToolCalls   *bool          `json:"parallel_tool_calls,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role       string         `json:"role"`
	Content    any            `json:"content,omitempty"`
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

type chatPart struct {
	Type     string        `json:"type"`
	Text     string        `json:"text,omitempty"`
	ImageURL *chatImageURL `json:"image_url,omitempty"`
}

type chatImageURL struct {
	URL string `json:"url"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type chatTool struct {
	Type     string           `json:"type"`
	Function chatToolFunction `json:"function"`
}

type chatToolFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// MessagesToChat translates a Messages request body into a Chat
// Completions one for model (the target's). cacheKey, when set, becomes
// the target's prompt_cache_key (derived from the session, so that a
// translated session reads the target's cache). A streamed request asks
// for its usage (stream_options.include_usage), which weir counts.
//
// Thinking: a request's own thinking settings ("thinking", and Claude
// Code's output_config effort) have no form every Chat endpoint takes,
// and are left out, named (Request.Dropped); the thinking blocks of
// earlier assistant turns change nothing the target must read (a
// provider discards earlier turns' thinking itself) and are left out.
// Everything else this package does not know is refused (Unsupported).
func MessagesToChat(body []byte, model, cacheKey string) (Request, error) {
	b, dropped, err := messagesToChat(body, model, cacheKey)
	return Request{Body: b, Dropped: dropped}, err
}

func messagesToChat(body []byte, model, cacheKey string) ([]byte, []string, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, nil, fmt.Errorf("request body: %w", err)
	}
	dropped, err := checkMessagesFields(top)
	if err != nil {
		return nil, nil, err
	}
	var req messagesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, nil, fmt.Errorf("request body: %w", err)
	}
	out := chatRequest{Model: model, MaxCompletionTokens: req.MaxTokens, Temperature: req.Temperature, TopP: req.TopP,
		Stop: req.StopSequences, Stream: req.Stream, PromptCacheKey: cacheKey}
	if req.Stream {
		out.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	if req.Metadata != nil {
		// The client's identity with its own provider (Claude Code's
		// device and session), not the target's to know.
		dropped = append(dropped, "metadata")
	}
	sys, err := systemText(req.System)
	if err != nil {
		return nil, nil, err
	}
	if sys != "" {
		out.Messages = append(out.Messages, chatMessage{Role: "system", Content: sys})
	}
	for i, m := range req.Messages {
		msgs, err := chatMessages(m)
		if err != nil {
			return nil, nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		out.Messages = append(out.Messages, msgs...)
	}
	for _, t := range req.Tools {
		if t.Type != "" && t.Type != "custom" {
			return nil, nil, unsupported("the server tool %q (%s)", t.Name, t.Type)
		}
		out.Tools = append(out.Tools, chatTool{Type: "function", Function: chatToolFunction{Name: t.Name,
			Description: t.Description, Parameters: t.InputSchema}})
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
			out.ToolChoice = map[string]any{"type": "function", "function": map[string]string{"name": c.Name}}
		default:
			return nil, nil, unsupported("tool_choice %q", c.Type)
		}
		if c.DisableParallel {
			f := false
			out.ParallelToolCalls = &f
		}
	}
	b, err := json.Marshal(out)
	return b, dropped, err
}

// systemText is a system prompt as one string: a string, or text blocks
// joined (their cache_control is the source's own caching, which the
// target does on its own).
func systemText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []messagesBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", errors.New("system: a string or an array of text blocks")
	}
	parts := make([]string, 0, len(blocks))
	for _, b := range blocks {
		if b.Type != "text" {
			return "", unsupported("a %q block in the system prompt", b.Type)
		}
		parts = append(parts, b.Text)
	}
	return strings.Join(parts, "\n\n"), nil
}

// chatMessages is one Messages message as Chat messages: a user turn's
// tool results become tool messages (before its other content, in their
// order), an assistant turn's tool_use blocks its tool_calls, ids kept.
func chatMessages(m messagesMessage) ([]chatMessage, error) {
	switch m.Role {
	case "user", "assistant":
	case "system":
		// A system message between the turns (Claude Code's notes to the
		// model) stays where it stands.
		text, err := systemText(m.Content)
		if err != nil {
			return nil, err
		}
		return []chatMessage{{Role: "system", Content: text}}, nil
	default:
		return nil, fmt.Errorf("role %q: user, assistant or system", m.Role)
	}
	var text string
	if json.Unmarshal(m.Content, &text) == nil {
		return []chatMessage{{Role: m.Role, Content: text}}, nil
	}
	var blocks []messagesBlock
	if err := json.Unmarshal(m.Content, &blocks); err != nil {
		return nil, errors.New("content: a string or an array of blocks")
	}
	if m.Role == "user" {
		var out []chatMessage
		var parts []chatPart
		for _, b := range blocks {
			switch b.Type {
			case "text":
				parts = append(parts, chatPart{Type: "text", Text: b.Text})
			case "image":
				url, err := imageURL(b)
				if err != nil {
					return nil, err
				}
				parts = append(parts, chatPart{Type: "image_url", ImageURL: &chatImageURL{URL: url}})
			case "tool_result":
				content, err := toolResultText(b)
				if err != nil {
					return nil, err
				}
				out = append(out, chatMessage{Role: "tool", ToolCallID: b.ToolUseID, Content: content})
			default:
				return nil, unsupported("a %q block in a user turn", b.Type)
			}
		}
		if len(parts) > 0 {
			out = append(out, chatMessage{Role: "user", Content: parts})
		}
		return out, nil
	}
	msg := chatMessage{Role: "assistant"}
	var texts []string
	for _, b := range blocks {
		switch b.Type {
		case "text":
			texts = append(texts, b.Text)
		case "tool_use":
			args := string(b.Input)
			if args == "" {
				args = "{}"
			}
			msg.ToolCalls = append(msg.ToolCalls, chatToolCall{ID: b.ID, Type: "function",
				Function: chatFunction{Name: b.Name, Arguments: args}})
		case "thinking", "redacted_thinking":
			// An earlier turn's thinking: no target reads it (see
			// MessagesToChat).
		default:
			return nil, unsupported("a %q block in an assistant turn", b.Type)
		}
	}
	if len(texts) > 0 {
		msg.Content = strings.Join(texts, "")
	}
	return []chatMessage{msg}, nil
}

// imageURL is an image block as a URL Chat Completions reads: a data URL
// of base64 data, or the image's own URL.
func imageURL(b messagesBlock) (string, error) {
	if b.Source == nil {
		return "", errors.New("an image block without a source")
	}
	switch b.Source.Type {
	case "base64":
		return "data:" + b.Source.MediaType + ";base64," + b.Source.Data, nil
	case "url":
		return b.Source.URL, nil
	}
	return "", unsupported("an image source of type %q", b.Source.Type)
}

// toolResultText is a tool result's content as the tool message's text.
// An error result says so in its text: Chat has no is_error.
func toolResultText(b messagesBlock) (string, error) {
	var text string
	if len(b.Content) > 0 && json.Unmarshal(b.Content, &text) != nil {
		var blocks []messagesBlock
		if err := json.Unmarshal(b.Content, &blocks); err != nil {
			return "", errors.New("tool_result content: a string or an array of blocks")
		}
		var parts []string
		for _, c := range blocks {
			if c.Type != "text" {
				return "", unsupported("a %q block in a tool result", c.Type)
			}
			parts = append(parts, c.Text)
		}
		text = strings.Join(parts, "\n")
	}
	if b.IsError {
		text = "Error: " + text
	}
	return text, nil
}

// Chat Completions answer, as ChatToMessages reads it.
type chatResponse struct {
	ID      string `json:"id"`
	Choices []struct {
		Message struct {
			Content   *string        `json:"content"`
			ToolCalls []chatToolCall `json:"tool_calls"`
			Refusal   *string        `json:"refusal"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *chatUsage `json:"usage"`
}

// chatUsage is a Chat answer's usage.
type chatUsage struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// messagesUsage is it as a Messages usage object: cached prompt tokens
// are cache reads, and input is the rest of the prompt. A nil usage is
// all zeros.
func (u *chatUsage) messagesUsage() map[string]int64 {
	out := map[string]int64{"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}
	if u == nil {
		return out
	}
	var cached int64
	if u.PromptTokensDetails != nil {
		cached = min(u.PromptTokensDetails.CachedTokens, u.PromptTokens)
	}
	out["input_tokens"], out["cache_read_input_tokens"], out["output_tokens"] = u.PromptTokens-cached, cached, u.CompletionTokens
	return out
}

// StopReason is a Chat finish_reason as a Messages stop_reason.
func StopReason(finish string) string {
	switch finish {
	case "length":
		return "max_tokens"
	case "tool_calls", "function_call":
		return "tool_use"
	case "content_filter":
		return "refusal"
	}
	return "end_turn"
}

// ChatToMessages translates a whole (non-streamed) Chat Completions
// answer into the Messages answer a client of model expects: text, tool
// calls as tool_use blocks (ids kept, arguments parsed), the stop reason,
// and usage with cached prompt tokens as cache reads.
func ChatToMessages(body []byte, model string, _ Request) ([]byte, error) {
	var r chatResponse
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("upstream answer: %w", err)
	}
	if len(r.Choices) == 0 {
		return nil, errors.New("upstream answer: no choices")
	}
	c := r.Choices[0]
	content := []map[string]any{}
	if t := c.Message.Content; t != nil && *t != "" {
		content = append(content, map[string]any{"type": "text", "text": *t})
	} else if t := c.Message.Refusal; t != nil && *t != "" {
		content = append(content, map[string]any{"type": "text", "text": *t})
	}
	for _, tc := range c.Message.ToolCalls {
		input := json.RawMessage(tc.Function.Arguments)
		if !json.Valid(input) || len(bytes.TrimSpace(input)) == 0 {
			return nil, fmt.Errorf("upstream answer: tool call %s: arguments are not JSON", tc.ID)
		}
		content = append(content, map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Function.Name, "input": input})
	}
	usage := r.Usage.messagesUsage()
	return json.Marshal(map[string]any{"id": "msg_" + strings.TrimPrefix(r.ID, "chatcmpl-"), "type": "message", "role": "assistant",
		"model": model, "content": content, "stop_reason": StopReason(c.FinishReason), "stop_sequence": nil, "usage": usage})
}
