package dataplane

import (
	"bytes"
	"encoding/json"
	"errors"
	"sync"
)

// wsHistory is a Responses WebSocket connection's conversation as weir
// saw it. Over the socket Codex sends, after the first turn, only the new
// input items and previous_response_id: an upstream that speaks
// Responses keeps the rest, but a translated request (the Messages wire
// stores nothing) needs the whole conversation. Each turn's request and
// the output of the response it got are kept, and the whole input is put
// together from them only for a translated attempt (expand). A
// connection keeps at most maxWSHistory bytes of it; past that, a
// translated continuation is refused (errHistoryLost) and the client can
// start over or send its conversation over HTTP.
type wsHistory struct {
	mu    sync.Mutex
	turns []wsTurn
	size  int
}

type wsTurn struct {
	// body is the request as proxied (its input and previous_response_id).
	body []byte
	// respID and output are the completed response's id and output items.
	respID string
	output json.RawMessage
}

// maxWSHistory bounds what one connection keeps.
const maxWSHistory = 8 << 20

var errHistoryLost = errors.New("this WebSocket request continues a response whose conversation weir no longer holds; start a new conversation, or send the whole conversation over HTTP")

// completedResponse reads a response.completed event's data: the
// response's id and output items; ok is false for any other event.
func completedResponse(data []byte) (id string, output json.RawMessage, ok bool) {
	if data == nil {
		return "", nil, false
	}
	var ev struct {
		Type     string `json:"type"`
		Response struct {
			ID     string          `json:"id"`
			Output json.RawMessage `json:"output"`
		} `json:"response"`
	}
	if json.Unmarshal(data, &ev) != nil || ev.Type != "response.completed" || ev.Response.ID == "" {
		return "", nil, false
	}
	return ev.Response.ID, ev.Response.Output, true
}

// add records a turn: body (the history's own copy) and the response id
// and output it got. Only a completed response is one a later turn can
// continue (completedResponse), and a warm-up, answered by weir with no
// output.
func (h *wsHistory) add(body []byte, respID string, output json.RawMessage) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := wsTurn{body: body, respID: respID, output: output}
	h.size += len(t.body) + len(t.output)
	h.turns = append(h.turns, t)
	for h.size > maxWSHistory && len(h.turns) > 0 {
		h.size -= len(h.turns[0].body) + len(h.turns[0].output)
		h.turns = h.turns[1:]
	}
}

// expand is body with its whole conversation as its input: when it
// continues a response (previous_response_id), every earlier turn's
// input and output in order, then its own, and no previous_response_id;
// body itself when it continues none.
func (h *wsHistory) expand(body []byte) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, err
	}
	var prev string
	if raw, ok := top["previous_response_id"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &prev); err != nil {
			return nil, errors.New("previous_response_id: a string")
		}
	}
	if prev == "" {
		return body, nil
	}
	h.mu.Lock()
	items, err := h.items(len(h.turns), prev)
	h.mu.Unlock()
	if err != nil {
		return nil, err
	}
	own, err := inputItems(top["input"])
	if err != nil {
		return nil, err
	}
	top["input"], _ = json.Marshal(append(items, own...))
	delete(top, "previous_response_id")
	return json.Marshal(top)
}

// items is the whole conversation up to and including the response id,
// among the first n turns: the chain of turns that led to it.
func (h *wsHistory) items(n int, id string) ([]json.RawMessage, error) {
	for i := n - 1; i >= 0; i-- {
		t := h.turns[i]
		if t.respID != id {
			continue
		}
		var top struct {
			Input    json.RawMessage `json:"input"`
			Previous string          `json:"previous_response_id"`
		}
		if err := json.Unmarshal(t.body, &top); err != nil {
			return nil, err
		}
		var before []json.RawMessage
		if top.Previous != "" {
			var err error
			if before, err = h.items(i, top.Previous); err != nil {
				return nil, err
			}
		}
		own, err := inputItems(top.Input)
		if err != nil {
			return nil, err
		}
		var out []json.RawMessage
		if len(t.output) > 0 && !bytes.Equal(t.output, []byte("null")) {
			if err := json.Unmarshal(t.output, &out); err != nil {
				return nil, err
			}
		}
		return append(append(before, own...), out...), nil
	}
	return nil, errHistoryLost
}

// inputItems is a Responses input as items: a string is one user
// message.
func inputItems(raw json.RawMessage) ([]json.RawMessage, error) {
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		b, _ := json.Marshal(map[string]any{"type": "message", "role": "user",
			"content": []map[string]string{{"type": "input_text", "text": s}}})
		return []json.RawMessage{b}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, errors.New("input: a string or an array of items")
	}
	return items, nil
}
