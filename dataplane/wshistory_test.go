package dataplane

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// A WebSocket conversation of three turns, each continuing the last by
// previous_response_id with only its new items: expanded, the third
// request's input is every turn's input and output in order, then its
// own, and it continues nothing. A request that continues nothing is as
// sent; one that continues a response this connection never saw, or one
// the bound dropped, is refused.
func TestWSHistoryExpand(t *testing.T) {
	t.Parallel()
	h := &wsHistory{}
	add := func(body, completed string) {
		if id, output, ok := completedResponse([]byte(completed)); ok {
			h.add([]byte(body), id, output)
		}
	}
	completed := func(id, output string) string {
		return `{"sequence_number":9,"response":{"id":"` + id + `","status":"completed","output":` + output + `},"type":"response.completed"}`
	}
	// A warm-up: the conversation's start, answered with no output.
	h.add([]byte(`{"model":"m","input":[{"type":"message","role":"developer","content":[{"type":"input_text","text":"Be brief."}]}]}`), "resp_w", nil)
	add(`{"model":"m","previous_response_id":"resp_w","input":"List the files.","stream":true}`,
		completed("resp_1", `[{"type":"function_call","call_id":"c1","name":"shell","arguments":"{}"}]`))
	add(`{"model":"m","previous_response_id":"resp_1","input":[{"type":"function_call_output","call_id":"c1","output":"a.go"}]}`,
		completed("resp_2", `[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"a.go"}]}]`))
	// A response that failed is nothing to continue.
	add(`{"model":"m","input":"x"}`, `{"type":"response.failed","response":{"id":"resp_x"}}`)
	got, err := h.expand([]byte(`{"model":"m","previous_response_id":"resp_2","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"Thanks."}]}],"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Input    []map[string]any `json:"input"`
		Previous *string          `json:"previous_response_id"`
		Model    string           `json:"model"`
	}
	if err := json.Unmarshal(got, &body); err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, it := range body.Input {
		types = append(types, it["type"].(string))
	}
	if want := []string{"message", "message", "function_call", "function_call_output", "message", "message"}; !reflect.DeepEqual(types, want) || body.Previous != nil || body.Model != "m" {
		t.Errorf("expanded to %s", got)
	}
	if first := body.Input[1]["content"].([]any)[0].(map[string]any)["text"]; first != "List the files." {
		t.Errorf("the first turn's string input became %v", first)
	}
	same := []byte(`{"model":"m","input":"hi"}`)
	if got, err := h.expand(same); err != nil || string(got) != string(same) {
		t.Errorf("a request continuing nothing: %s %v", got, err)
	}
	for _, prev := range []string{"resp_x", "resp_unknown"} {
		if _, err := h.expand([]byte(`{"previous_response_id":"` + prev + `","input":[]}`)); !errors.Is(err, errHistoryLost) {
			t.Errorf("continuing %s: %v, want errHistoryLost", prev, err)
		}
	}
	// Past its bound the oldest turns go: their continuation is lost.
	big := make([]byte, maxWSHistory)
	for i := range big {
		big[i] = 'a'
	}
	add(`{"input":"`+string(big)+`"}`, completed("resp_big", `[]`))
	if _, err := h.expand([]byte(`{"previous_response_id":"resp_2","input":[]}`)); !errors.Is(err, errHistoryLost) {
		t.Errorf("a continuation past the bound: %v, want errHistoryLost", err)
	}
}
