package translate

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// A multi-turn Messages request with a system prompt, an image, a tool
// call with its result and a parallel pair of calls, tools and a tool
// choice: as the Responses input Codex's backend reads, the call ids kept
// as call ids, the turns in order, the Codex backend's refused fields
// left out and named.
func TestMessagesToResponses(t *testing.T) {
	t.Parallel()
	in := `{"model":"coder","max_tokens":32000,"temperature":1,"metadata":{"user_id":"u"},"stream":true,
	"system":[{"type":"text","text":"You are an agent."},{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],
	"thinking":{"type":"enabled","budget_tokens":10000},
	"tools":[{"name":"Bash","description":"Run","input_schema":{"type":"object","properties":{"command":{"type":"string"}}}},{"name":"Noop"}],
	"tool_choice":{"type":"auto","disable_parallel_tool_use":true},
	"messages":[
	 {"role":"user","content":[{"type":"text","text":"Look:"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}}]},
	 {"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"sig"},{"type":"text","text":"Listing."},{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}}]},
	 {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"a.go"},{"type":"text","text":"and?"}]},
	 {"role":"assistant","content":[{"type":"tool_use","id":"call_2","name":"Bash","input":{"command":"date"}},{"type":"tool_use","id":"call_3","name":"Bash","input":{}}]},
	 {"role":"user","content":[{"type":"tool_result","tool_use_id":"call_2","content":[{"type":"text","text":"today"}]},{"type":"tool_result","tool_use_id":"call_3","content":"x","is_error":true}]}
	]}`
	req, err := MessagesToResponses([]byte(in), "gpt-5-codex", "weir-k")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"max_tokens", "temperature", "metadata"}; !reflect.DeepEqual(req.Dropped, want) {
		t.Errorf("dropped %v, want %v", req.Dropped, want)
	}
	var got map[string]any
	if err := json.Unmarshal(req.Body, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"model": "gpt-5-codex", "instructions": "You are an agent.\n\nBe brief.", "store": false, "stream": true,
		"prompt_cache_key": "weir-k", "reasoning": map[string]any{"effort": "medium", "summary": "auto"},
		"tool_choice": "auto", "parallel_tool_calls": false,
		"tools": []any{
			map[string]any{"type": "function", "name": "Bash", "description": "Run", "strict": false,
				"parameters": map[string]any{"type": "object", "properties": map[string]any{"command": map[string]any{"type": "string"}}}},
			map[string]any{"type": "function", "name": "Noop", "strict": false, "parameters": map[string]any{"type": "object", "properties": map[string]any{}}},
		},
		"input": []any{
			map[string]any{"type": "message", "role": "user", "content": []any{
				map[string]any{"type": "input_text", "text": "Look:"},
				map[string]any{"type": "input_image", "image_url": "data:image/png;base64,iVBO"}}},
			map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "Listing."}}},
			map[string]any{"type": "function_call", "call_id": "toolu_1", "name": "Bash", "arguments": `{"command":"ls"}`},
			map[string]any{"type": "function_call_output", "call_id": "toolu_1", "output": "a.go"},
			map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "and?"}}},
			map[string]any{"type": "function_call", "call_id": "call_2", "name": "Bash", "arguments": `{"command":"date"}`},
			map[string]any{"type": "function_call", "call_id": "call_3", "name": "Bash", "arguments": `{}`},
			map[string]any{"type": "function_call_output", "call_id": "call_2", "output": "today"},
			map[string]any{"type": "function_call_output", "call_id": "call_3", "output": "Error: x"},
		},
	}
	if !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", " ")
		t.Errorf("translated:\n%s", g)
	}
}

// What Responses cannot carry is refused by name.
func TestMessagesToResponsesRefuses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ body, feature string }{
		{`{"model":"m","top_k":5,"messages":[]}`, `"top_k"`},
		{`{"model":"m","stop_sequences":["x"],"messages":[]}`, "stop_sequences"},
		{`{"model":"m","tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":[]}`, "web_search"},
		{`{"model":"m","messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`, `"document"`},
		{`{"model":"m","tool_choice":{"type":"sometimes"},"messages":[]}`, "sometimes"},
		{`{"model":"m","thinking":{"type":"interleaved"},"messages":[]}`, "interleaved"},
	} {
		_, err := MessagesToResponses([]byte(c.body), "gpt-5", "")
		var u *Unsupported
		if !errors.As(err, &u) || !strings.Contains(u.Feature, c.feature) {
			t.Errorf("%s: %v, want Unsupported naming %s", c.body, err, c.feature)
		}
	}
}

// A whole Responses answer with a reasoning summary, text and a function
// call: the Messages answer, call id kept, arguments parsed, cached input
// as cache reads.
func TestResponsesToMessages(t *testing.T) {
	t.Parallel()
	in := `{"id":"resp_7","status":"completed","output":[
	 {"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"Plan."}]},
	 {"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"Listing.","annotations":[]}]},
	 {"type":"function_call","id":"fc_1","call_id":"call_9","name":"Bash","arguments":"{\"command\":\"ls\"}"}],
	 "usage":{"input_tokens":1000,"input_tokens_details":{"cached_tokens":800},"output_tokens":30}}`
	out, err := ResponsesToMessages([]byte(in), "coder", Request{})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	json.Unmarshal(out, &got) //nolint:errcheck // checked below
	want := map[string]any{"id": "msg_7", "type": "message", "role": "assistant", "model": "coder", "stop_reason": "tool_use", "stop_sequence": nil,
		"content": []any{
			map[string]any{"type": "thinking", "thinking": "Plan.", "signature": ""},
			map[string]any{"type": "text", "text": "Listing."},
			map[string]any{"type": "tool_use", "id": "call_9", "name": "Bash", "input": map[string]any{"command": "ls"}}},
		"usage": map[string]any{"input_tokens": 200.0, "cache_read_input_tokens": 800.0, "cache_creation_input_tokens": 0.0, "output_tokens": 30.0}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %s", out)
	}
	for _, c := range []struct{ body, stop string }{
		{`{"id":"r","status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[]}`, "max_tokens"},
		{`{"id":"r","status":"completed","output":[{"type":"message","content":[{"type":"refusal","refusal":"no"}]}]}`, "end_turn"},
	} {
		out, err := ResponsesToMessages([]byte(c.body), "m", Request{})
		if err != nil || !strings.Contains(string(out), `"stop_reason":"`+c.stop+`"`) {
			t.Errorf("%s: %s %v, want stop %s", c.body, out, err, c.stop)
		}
	}
	if _, err := ResponsesToMessages([]byte(`{"output":[{"type":"function_call","call_id":"c","arguments":"{no"}]}`), "m", Request{}); err == nil {
		t.Error("arguments that are not JSON accepted")
	}
}

// A Responses stream as the Codex backend sends it (rate limits, a
// reasoning summary, text, two function calls one after the other, one
// whose arguments come only in its done item, then the completed
// response): the Messages events in the order a client expects.
func TestResponsesStream(t *testing.T) {
	t.Parallel()
	events := []string{
		`{"type":"codex.rate_limits","rate_limits":{}}`,
		`{"type":"response.created","response":{"id":"resp_5","status":"in_progress"}}`,
		`{"type":"response.in_progress","response":{"id":"resp_5","status":"in_progress"}}`,
		`{"type":"response.output_item.added","output_index":0,"item":{"type":"reasoning","id":"rs_1"}}`,
		`{"type":"response.reasoning_summary_text.delta","output_index":0,"delta":"Think"}`,
		`{"type":"response.reasoning_summary_text.delta","output_index":0,"delta":"ing."}`,
		`{"type":"response.output_item.done","output_index":0,"item":{"type":"reasoning","id":"rs_1"}}`,
		`{"type":"response.output_item.added","output_index":1,"item":{"type":"message","id":"msg_1"}}`,
		`{"type":"response.content_part.added","output_index":1}`,
		`{"type":"response.output_text.delta","output_index":1,"delta":"Run"}`,
		`{"type":"response.output_text.delta","output_index":1,"delta":"ning."}`,
		`{"type":"response.output_text.done","output_index":1,"text":"Running."}`,
		`{"type":"response.output_item.done","output_index":1,"item":{"type":"message","id":"msg_1"}}`,
		`{"type":"response.output_item.added","output_index":2,"item":{"type":"function_call","call_id":"call_a","name":"Bash","arguments":""}}`,
		`{"type":"response.function_call_arguments.delta","output_index":2,"delta":"{\"command\":"}`,
		`{"type":"response.function_call_arguments.delta","output_index":2,"delta":"\"ls\"}"}`,
		`{"type":"response.function_call_arguments.done","output_index":2,"arguments":"{\"command\":\"ls\"}"}`,
		`{"type":"response.output_item.done","output_index":2,"item":{"type":"function_call","call_id":"call_a","name":"Bash","arguments":"{\"command\":\"ls\"}"}}`,
		`{"type":"response.output_item.added","output_index":3,"item":{"type":"function_call","call_id":"call_b","name":"Bash","arguments":""}}`,
		`{"type":"response.output_item.done","output_index":3,"item":{"type":"function_call","call_id":"call_b","name":"Bash","arguments":"{\"command\":\"date\"}"}}`,
		`{"type":"response.completed","response":{"id":"resp_5","status":"completed","usage":{"input_tokens":500,"input_tokens_details":{"cached_tokens":100},"output_tokens":20}}}`,
	}
	s := NewResponsesStream("coder", Request{})
	var out []byte
	for _, ev := range events {
		var name struct {
			Type string `json:"type"`
		}
		json.Unmarshal([]byte(ev), &name) //nolint:errcheck // the test's own JSON
		b, err := s.Event(name.Type, []byte(ev))
		if err != nil {
			t.Fatalf("event %s: %v", ev, err)
		}
		out = append(out, b...)
	}
	names, data := sseEvents(t, out)
	want := []string{"message_start",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_stop",
		"message_delta", "message_stop"}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("events %v\nwant %v", names, want)
	}
	if id := data[0]["message"].(map[string]any)["id"]; id != "msg_5" {
		t.Errorf("message id %v", id)
	}
	args := map[float64]string{}
	for _, d := range data {
		if d["type"] == "content_block_delta" {
			if delta := d["delta"].(map[string]any); delta["type"] == "input_json_delta" {
				args[d["index"].(float64)] += delta["partial_json"].(string)
			}
		}
	}
	if args[2] != `{"command":"ls"}` || args[3] != `{"command":"date"}` {
		t.Errorf("tool arguments %v", args)
	}
	if start := data[10]["content_block"].(map[string]any); start["id"] != "call_a" || start["name"] != "Bash" {
		t.Errorf("first tool block %v", start)
	}
	md := data[len(data)-2]
	if md["delta"].(map[string]any)["stop_reason"] != "tool_use" {
		t.Errorf("message_delta %v", md)
	}
	if u := md["usage"].(map[string]any); u["input_tokens"] != 400.0 || u["cache_read_input_tokens"] != 100.0 || u["output_tokens"] != 20.0 {
		t.Errorf("usage %v", u)
	}
	if _, err := s.Event("", []byte(`{"type":"response.output_text.delta"}`)); err == nil {
		t.Error("an event after the end accepted")
	}
	// An item resumed after another began is a broken stream.
	s = NewResponsesStream("m", Request{})
	for i, ev := range []string{
		`{"type":"response.output_text.delta","output_index":0,"delta":"a"}`,
		`{"type":"response.output_item.added","output_index":1,"item":{"type":"function_call","call_id":"c","name":"n"}}`,
		`{"type":"response.output_text.delta","output_index":0,"delta":"b"}`,
	} {
		if _, err := s.Event("", []byte(ev)); (err != nil) != (i == 2) {
			t.Errorf("event %d: %v", i, err)
		}
	}
}

// Any input is either a valid Responses request or an error.
func FuzzMessagesToResponses(f *testing.F) {
	f.Add([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"m","system":"s","thinking":{"type":"enabled","budget_tokens":1},"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"n","input":{}}]}]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"x"}]}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := MessagesToResponses(body, "gpt-5", "k")
		if err != nil {
			return
		}
		var m struct {
			Model string            `json:"model"`
			Input []json.RawMessage `json:"input"`
		}
		if json.Unmarshal(req.Body, &m) != nil || m.Model != "gpt-5" || m.Input == nil {
			t.Fatalf("invalid output for %q: %s", body, req.Body)
		}
	})
}

// Any sequence of events yields Messages events whose data is JSON, or an
// error; never a panic.
func FuzzResponsesStream(f *testing.F) {
	f.Add([]byte(`{"type":"response.created","response":{"id":"r"}}`), []byte(`{"type":"response.output_text.delta","delta":"x"}`),
		[]byte(`{"type":"response.completed","response":{"status":"completed"}}`))
	f.Add([]byte(`{"type":"response.output_item.added","item":{"type":"function_call"}}`), []byte(`{"type":"response.function_call_arguments.delta","delta":"{"}`),
		[]byte(`{"type":"response.output_item.done","item":{"type":"function_call","arguments":"{}"}}`))
	f.Fuzz(func(t *testing.T, a, b, c []byte) {
		s := NewResponsesStream("m", Request{})
		var out []byte
		for _, ev := range [][]byte{a, b, c} {
			o, err := s.Event("", ev)
			if err != nil {
				return
			}
			out = append(out, o...)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok && !json.Valid([]byte(d)) {
				t.Fatalf("event data %q is not JSON", d)
			}
		}
	})
}

// Any whole answer, Responses or Chat, is either a Messages answer (a
// message with content, a stop reason and usage) or an error.
func FuzzAnswersToMessages(f *testing.F) {
	f.Add([]byte(`{"id":"resp_1","status":"completed","output":[{"type":"function_call","call_id":"c","name":"n","arguments":"{}"}],"usage":{"input_tokens":3}}`), true)
	f.Add([]byte(`{"id":"chatcmpl-1","choices":[{"message":{"content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1}}`), false)
	f.Fuzz(func(t *testing.T, body []byte, responses bool) {
		whole := ChatToMessages
		if responses {
			whole = ResponsesToMessages
		}
		out, err := whole(body, "m", Request{})
		if err != nil {
			return
		}
		var m struct {
			Type       string            `json:"type"`
			Content    []json.RawMessage `json:"content"`
			StopReason string            `json:"stop_reason"`
			Usage      map[string]int64  `json:"usage"`
		}
		if json.Unmarshal(out, &m) != nil || m.Type != "message" || m.Content == nil || m.StopReason == "" || m.Usage == nil {
			t.Fatalf("invalid answer for %q: %s", body, out)
		}
	})
}
