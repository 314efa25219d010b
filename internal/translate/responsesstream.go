package translate

import (
	"encoding/json"
	"errors"
	"fmt"
)

// ResponsesStream turns a Responses stream's events into the Messages
// stream a client expects: message_start when the response is created;
// a content block per output item (a reasoning summary as a thinking
// block, a message's text as a text block, a function call as a tool_use
// block whose arguments arrive as input_json_delta), each opened at its
// first content and closed when its item is done; message_delta with the
// stop reason and usage, and message_stop, when the response completes.
// Responses streams output items one after another; a delta for an item
// other than the open one after it began is refused as a broken stream
// rather than reordered. Events no Messages client has a place for
// (codex.rate_limits, in-progress markers, the done events that repeat
// what the deltas said) translate to nothing.
type ResponsesStream struct {
	out messagesOut
	// item is the output item (its output_index) the open block carries.
	item int
	// streamed marks the function call items whose arguments came as
	// deltas (else the done item's arguments are sent whole).
	streamed map[int]bool
	seen     map[int]bool
	called   bool
}

// NewResponsesStream starts a translation for a client that asked model.
func NewResponsesStream(model string, _ Request) Stream {
	return &ResponsesStream{out: newMessagesOut(model), item: -1, streamed: map[int]bool{}, seen: map[int]bool{}}
}

type responsesStreamEvent struct {
	Type        string             `json:"type"`
	OutputIndex int                `json:"output_index"`
	Delta       string             `json:"delta"`
	Item        *fromResponsesItem `json:"item"`
	Response    *struct {
		ID                string          `json:"id"`
		Status            string          `json:"status"`
		Usage             *responsesUsage `json:"usage"`
		IncompleteDetails *struct {
			Reason string `json:"reason"`
		} `json:"incomplete_details"`
	} `json:"response"`
}

// Event translates one Responses event (its type comes in the data; the
// event: name is the same where there is one).
func (s *ResponsesStream) Event(_ string, data []byte) ([]byte, error) {
	if s.out.done {
		return nil, errors.New("an event after the end of the response")
	}
	var e responsesStreamEvent
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("an event that is not JSON: %w", err)
	}
	var out []byte
	switch e.Type {
	case "response.created", "response.in_progress":
		if e.Response != nil {
			out = s.out.start(e.Response.ID, "resp_")
		}
	case "response.output_item.added":
		if e.Item == nil {
			return nil, errors.New("output_item.added without its item")
		}
		if e.Item.Type == "function_call" {
			if err := s.fresh(e.OutputIndex); err != nil {
				return nil, err
			}
			s.called = true
			out = append(s.out.start("", "resp_"), s.open("tool_use", e.OutputIndex, map[string]any{"type": "tool_use", "id": e.Item.CallID,
				"name": e.Item.Name, "input": map[string]any{}})...)
		}
	case "response.output_text.delta", "response.refusal.delta":
		return s.delta(e.OutputIndex, "text", map[string]any{"type": "text", "text": ""},
			map[string]any{"type": "text_delta", "text": e.Delta})
	case "response.reasoning_summary_text.delta":
		return s.delta(e.OutputIndex, "thinking", map[string]any{"type": "thinking", "thinking": "", "signature": ""},
			map[string]any{"type": "thinking_delta", "thinking": e.Delta})
	case "response.function_call_arguments.delta":
		if s.out.kind != "tool_use" || s.item != e.OutputIndex {
			return nil, fmt.Errorf("arguments for output item %d, which is not the open call", e.OutputIndex)
		}
		s.streamed[e.OutputIndex] = true
		if e.Delta != "" {
			out = s.out.delta(map[string]any{"type": "input_json_delta", "partial_json": e.Delta})
		}
	case "response.output_item.done":
		if e.Item != nil && e.Item.Type == "function_call" && s.out.kind == "tool_use" && s.item == e.OutputIndex &&
			!s.streamed[e.OutputIndex] && e.Item.Arguments != "" {
			out = s.out.delta(map[string]any{"type": "input_json_delta", "partial_json": e.Item.Arguments})
		}
		if s.item == e.OutputIndex {
			out = append(out, s.closeItem()...)
		}
	case "response.completed", "response.incomplete":
		if e.Response == nil {
			return nil, errors.New(e.Type + " without its response")
		}
		out = s.out.start(e.Response.ID, "resp_")
		var incomplete string
		if e.Response.IncompleteDetails != nil {
			incomplete = e.Response.IncompleteDetails.Reason
		}
		out = append(out, s.out.finish(responsesStop(e.Response.Status, incomplete, s.called), e.Response.Usage.messagesUsage())...)
	}
	return out, nil
}

// fresh checks that output item index has not had a block yet.
func (s *ResponsesStream) fresh(index int) error {
	if s.seen[index] {
		return fmt.Errorf("output item %d resumed after another began: the stream interleaves items", index)
	}
	s.seen[index] = true
	return nil
}

// delta is a text or thinking delta of output item index, opening its
// block first when it is not the open one.
func (s *ResponsesStream) delta(index int, kind string, block, delta map[string]any) ([]byte, error) {
	out := s.out.start("", "resp_")
	if s.out.kind != kind || s.item != index {
		if err := s.fresh(index); err != nil {
			return nil, err
		}
		out = append(out, s.open(kind, index, block)...)
	}
	return append(out, s.out.delta(delta)...), nil
}

// open opens output item index's block.
func (s *ResponsesStream) open(kind string, index int, block map[string]any) []byte {
	s.item = index
	return s.out.open(kind, block)
}

// closeItem closes the open block, which carries output item index.
func (s *ResponsesStream) closeItem() []byte {
	s.item = -1
	return s.out.closeBlock()
}
