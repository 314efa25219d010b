package translate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// sseEvents splits a Messages stream into its events' names and data.
func sseEvents(t *testing.T, b []byte) (names []string, data []map[string]any) {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			names = append(names, strings.TrimPrefix(line, "event: "))
		case strings.HasPrefix(line, "data: "):
			var m map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &m); err != nil {
				t.Fatalf("event data is not JSON: %q", line)
			}
			if m["type"] != names[len(names)-1] {
				t.Fatalf("event %s carries type %v", names[len(names)-1], m["type"])
			}
			data = append(data, m)
		}
	}
	return names, data
}

// A streamed answer with text and two parallel tool calls, then usage:
// the Messages events in the order a client expects, each tool call's
// arguments whole once its deltas are joined, the stop reason and the
// cached tokens as cache reads.
func TestChatStream(t *testing.T) {
	t.Parallel()
	chunks := []string{
		`{"id":"chatcmpl-9","choices":[{"delta":{"role":"assistant","content":""}}]}`,
		`{"id":"chatcmpl-9","choices":[{"delta":{"content":"Running "}}]}`,
		`{"id":"chatcmpl-9","choices":[{"delta":{"content":"both."}}]}`,
		`{"id":"chatcmpl-9","choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"Bash","arguments":""}}]}}]}`,
		`{"id":"chatcmpl-9","choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"command\":"}}]}}]}`,
		`{"id":"chatcmpl-9","choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"ls\"}"}}]}}]}`,
		`{"id":"chatcmpl-9","choices":[{"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"Bash","arguments":"{\"command\":\"date\"}"}}]}}]}`,
		`{"id":"chatcmpl-9","choices":[{"delta":{},"finish_reason":"tool_calls"}]}`,
		`{"id":"chatcmpl-9","choices":[],"usage":{"prompt_tokens":2000,"completion_tokens":40,"prompt_tokens_details":{"cached_tokens":1536}}}`,
		`[DONE]`,
	}
	s := NewChatStream("claude-sonnet-4-5")
	var out []byte
	for _, c := range chunks {
		b, err := s.Chunk([]byte(c))
		if err != nil {
			t.Fatalf("chunk %s: %v", c, err)
		}
		out = append(out, b...)
	}
	if !s.out.done {
		t.Error("not done after [DONE]")
	}
	names, data := sseEvents(t, out)
	want := []string{"message_start",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_stop",
		"message_delta", "message_stop"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("events\n %v\nwant\n %v", names, want)
	}
	// Each tool call's joined arguments are its input.
	args := map[float64]string{}
	ids := map[float64]string{}
	for _, d := range data {
		switch d["type"] {
		case "content_block_start":
			cb := d["content_block"].(map[string]any)
			if cb["type"] == "tool_use" {
				ids[d["index"].(float64)] = cb["id"].(string)
			}
		case "content_block_delta":
			delta := d["delta"].(map[string]any)
			if delta["type"] == "input_json_delta" {
				args[d["index"].(float64)] += delta["partial_json"].(string)
			}
		case "message_delta":
			if d["delta"].(map[string]any)["stop_reason"] != "tool_use" {
				t.Errorf("stop reason %v", d["delta"])
			}
			u := d["usage"].(map[string]any)
			if u["input_tokens"] != float64(464) || u["cache_read_input_tokens"] != float64(1536) || u["output_tokens"] != float64(40) {
				t.Errorf("usage %v", u)
			}
		}
	}
	if ids[1] != "call_a" || ids[2] != "call_b" || args[1] != `{"command":"ls"}` || args[2] != `{"command":"date"}` {
		t.Errorf("tool calls: ids %v args %v", ids, args)
	}
	if _, err := s.Chunk([]byte(`{"choices":[]}`)); err == nil {
		t.Error("a chunk after the end accepted")
	}
}

// A stream that interleaves two calls' argument deltas is refused, not
// reordered; an empty stream still ends as a Messages stream.
func TestChatStreamEdges(t *testing.T) {
	t.Parallel()
	s := NewChatStream("m")
	for _, c := range []string{
		`{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"x","arguments":"{"}}]}}]}`,
		`{"choices":[{"delta":{"tool_calls":[{"index":1,"id":"b","function":{"name":"y","arguments":"{}"}}]}}]}`,
	} {
		if _, err := s.Chunk([]byte(c)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Chunk([]byte(`{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"}"}}]}}]}`)); err == nil {
		t.Error("interleaved calls accepted")
	}
	empty := NewChatStream("m")
	out, err := empty.Chunk([]byte("[DONE]"))
	if err != nil {
		t.Fatal(err)
	}
	names, _ := sseEvents(t, out)
	if strings.Join(names, " ") != "message_start message_delta message_stop" {
		t.Errorf("an empty stream: %v", names)
	}
}

// Any sequence of chunks yields Messages events whose data is JSON, or an
// error; never a panic.
func FuzzChatStream(f *testing.F) {
	f.Add([]byte(`{"id":"chatcmpl-1","choices":[{"delta":{"content":"hi"}}]}`), []byte(`{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"n","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`), []byte(`[DONE]`))
	f.Add([]byte(`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":9}}}`), []byte(`[DONE]`), []byte(`{}`))
	f.Fuzz(func(t *testing.T, a, b, c []byte) {
		s := NewChatStream("m")
		var out []byte
		for _, ch := range [][]byte{a, b, c} {
			o, err := s.Chunk(ch)
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
