package translate

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ChatStream turns a Chat Completions stream's chunks into the Messages
// stream a client expects, in its order: message_start; for each content
// block, content_block_start, its deltas (text_delta, or input_json_delta
// for a tool call's arguments) and content_block_stop; then message_delta
// with the stop reason and usage, and message_stop. A Chat stream may
// interleave parallel tool calls' argument deltas (by index); Messages
// blocks do not interleave, so a tool call's block opens when its first
// delta comes and the previous block closes then: deltas of an earlier
// call arriving after a later one started are refused as a broken
// stream rather than reordered.
type ChatStream struct {
	out messagesOut
	// call is the Chat tool call index the open tool_use block carries.
	call      int
	seenCalls map[int]bool
	finish    string
	usage     map[string]int64
}

// NewChatStream starts a translation for a client that asked model.
func NewChatStream(model string) *ChatStream {
	return &ChatStream{out: newMessagesOut(model), seenCalls: map[int]bool{}, usage: (*chatUsage)(nil).messagesUsage()}
}

type chatChunk struct {
	ID      string `json:"id"`
	Choices []struct {
		Delta struct {
			Content   *string `json:"content"`
			ToolCalls []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *chatUsage `json:"usage"`
}

func event(name string, v any) []byte {
	b, _ := json.Marshal(v)
	return []byte("event: " + name + "\ndata: " + string(b) + "\n\n")
}

// Chunk translates one chunk's data (the JSON after "data: "; "[DONE]"
// ends the stream) into the Messages events it stands for, concatenated.
func (s *ChatStream) Chunk(data []byte) ([]byte, error) {
	m := &s.out
	if m.done {
		return nil, errors.New("a chunk after the end of the stream")
	}
	if strings.TrimSpace(string(data)) == "[DONE]" {
		return append(m.start("", "chatcmpl-"), m.finish(StopReason(s.finish), s.usage)...), nil
	}
	var c chatChunk
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("a chunk that is not JSON: %w", err)
	}
	out := m.start(c.ID, "chatcmpl-")
	if c.Usage != nil {
		s.usage = c.Usage.messagesUsage()
	}
	for _, ch := range c.Choices {
		if t := ch.Delta.Content; t != nil && *t != "" {
			if m.kind != "text" {
				out = append(out, m.open("text", map[string]any{"type": "text", "text": ""})...)
			}
			out = append(out, m.delta(map[string]any{"type": "text_delta", "text": *t})...)
		}
		calls := ch.Delta.ToolCalls
		sort.SliceStable(calls, func(i, j int) bool { return calls[i].Index < calls[j].Index })
		for _, tc := range calls {
			if m.kind != "tool_use" || s.call != tc.Index {
				if s.seenCalls[tc.Index] {
					return nil, fmt.Errorf("tool call %d resumed after another began: the stream interleaves calls", tc.Index)
				}
				s.seenCalls[tc.Index] = true
				s.call = tc.Index
				out = append(out, m.open("tool_use", map[string]any{"type": "tool_use", "id": tc.ID,
					"name": tc.Function.Name, "input": map[string]any{}})...)
			}
			if tc.Function.Arguments != "" {
				out = append(out, m.delta(map[string]any{"type": "input_json_delta", "partial_json": tc.Function.Arguments})...)
			}
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			s.finish = *ch.FinishReason
		}
	}
	return out, nil
}

// Event is Chunk: a Chat stream's events have no names.
func (s *ChatStream) Event(_ string, data []byte) ([]byte, error) { return s.Chunk(data) }
