package translate

import "strings"

// messagesOut writes the Messages stream a client expects, whatever the
// upstream's events were: message_start once, content blocks one at a
// time (each opened, given its deltas, closed), then message_delta with
// the stop reason and usage, and message_stop. ChatStream and
// ResponsesStream read their upstream's events into it.
type messagesOut struct {
	model   string
	started bool
	done    bool
	id      string
	// block is the open content block's index, -1 when none; kind is its
	// type ("text", "tool_use", "thinking").
	block, blocks int
	kind          string
}

func newMessagesOut(model string) messagesOut { return messagesOut{model: model, block: -1} }

// start is message_start, the first time only, with the message id made
// of upstreamID less its prefix.
func (m *messagesOut) start(upstreamID, prefix string) []byte {
	if m.started {
		return nil
	}
	m.started, m.id = true, "msg_"+strings.TrimPrefix(upstreamID, prefix)
	return event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": m.id, "type": "message", "role": "assistant", "model": m.model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": (*chatUsage)(nil).messagesUsage()}})
}

// open closes the open block, if any, and opens the next.
func (m *messagesOut) open(kind string, block map[string]any) []byte {
	out := m.closeBlock()
	m.block, m.blocks, m.kind = m.blocks, m.blocks+1, kind
	return append(out, event("content_block_start", map[string]any{"type": "content_block_start", "index": m.block, "content_block": block})...)
}

// delta is a delta of the open block.
func (m *messagesOut) delta(delta map[string]any) []byte {
	return event("content_block_delta", map[string]any{"type": "content_block_delta", "index": m.block, "delta": delta})
}

// closeBlock closes the open block, if any. A thinking block ends with
// its signature: the target's thinking has none a client could check,
// and none is read on the way back (earlier turns' thinking is left out
// of a translated request).
func (m *messagesOut) closeBlock() []byte {
	if m.block < 0 {
		return nil
	}
	var out []byte
	if m.kind == "thinking" {
		out = m.delta(map[string]any{"type": "signature_delta", "signature": ""})
	}
	out = append(out, event("content_block_stop", map[string]any{"type": "content_block_stop", "index": m.block})...)
	m.block, m.kind = -1, ""
	return out
}

// finish ends the stream: the last block, the stop reason and usage,
// message_stop.
func (m *messagesOut) finish(stop string, usage map[string]int64) []byte {
	m.done = true
	out := m.closeBlock()
	out = append(out, event("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": usage})...)
	return append(out, event("message_stop", map[string]any{"type": "message_stop"})...)
}
