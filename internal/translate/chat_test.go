package translate

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("not JSON: %v: %s", err, b)
	}
	return m
}

// A Claude Code turn after two parallel tool calls: the system blocks,
// the tool calls with their ids, their results as tool messages in
// order, the tools' schemas, the previous turn's thinking left out.
func TestMessagesToChatConversation(t *testing.T) {
	t.Parallel()
	in := `{"model":"claude-sonnet-4-5","max_tokens":4096,"stream":true,"metadata":{"user_id":"u1"},
	"thinking":{"type":"enabled","budget_tokens":1024},
	"system":[{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}},{"type":"text","text":"Be brief."}],
	"tools":[{"name":"Bash","description":"Run a command","input_schema":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}],
	"tool_choice":{"type":"auto"},
	"messages":[
	 {"role":"user","content":"List the files and the date."},
	 {"role":"assistant","content":[{"type":"thinking","thinking":"two commands","signature":"sig"},{"type":"text","text":"Running both."},
	   {"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}},
	   {"type":"tool_use","id":"toolu_2","name":"Bash","input":{"command":"date"}}]},
	 {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"a.go\nb.go"},
	   {"type":"tool_result","tool_use_id":"toolu_2","content":[{"type":"text","text":"Fri Dec 4"}],"is_error":true},
	   {"type":"text","text":"Now summarise."},
	   {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBOR"}}]}
	]}`
	req, err := MessagesToChat([]byte(in), "gpt-4.1", "session-1")
	out := req.Body
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"thinking", "metadata"}; !reflect.DeepEqual(req.Dropped, want) {
		t.Errorf("dropped %v, want %v", req.Dropped, want)
	}
	got := decode(t, out)
	want := decode(t, []byte(`{"model":"gpt-4.1","max_completion_tokens":4096,"stream":true,"stream_options":{"include_usage":true},
	"prompt_cache_key":"session-1","tool_choice":"auto",
	"tools":[{"type":"function","function":{"name":"Bash","description":"Run a command","parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}}],
	"messages":[
	 {"role":"system","content":"You are Claude Code.\n\nBe brief."},
	 {"role":"user","content":"List the files and the date."},
	 {"role":"assistant","content":"Running both.","tool_calls":[
	   {"id":"toolu_1","type":"function","function":{"name":"Bash","arguments":"{\"command\":\"ls\"}"}},
	   {"id":"toolu_2","type":"function","function":{"name":"Bash","arguments":"{\"command\":\"date\"}"}}]},
	 {"role":"tool","tool_call_id":"toolu_1","content":"a.go\nb.go"},
	 {"role":"tool","tool_call_id":"toolu_2","content":"Error: Fri Dec 4"},
	 {"role":"user","content":[{"type":"text","text":"Now summarise."},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBOR"}}]}
	]}`))
	if !reflect.DeepEqual(got, want) {
		a, _ := json.MarshalIndent(got, "", " ")
		b, _ := json.MarshalIndent(want, "", " ")
		t.Errorf("got\n%s\nwant\n%s", a, b)
	}
}

// What Chat Completions cannot carry is refused, naming it.
func TestMessagesToChatRefuses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ name, body, feature string }{
		{"top_k", `{"model":"m","max_tokens":1,"top_k":5,"messages":[{"role":"user","content":"hi"}]}`, `the "top_k" field`},
		{"document", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"document","source":{"type":"base64"}}]}]}`, `a "document" block in a user turn`},
		{"server tool", `{"model":"m","max_tokens":1,"tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"user","content":"hi"}]}`, `the server tool "web_search" (web_search_20250305)`},
		{"tool_choice", `{"model":"m","max_tokens":1,"tool_choice":{"type":"magic"},"messages":[{"role":"user","content":"hi"}]}`, `tool_choice "magic"`},
	} {
		_, err := MessagesToChat([]byte(c.body), "gpt-4.1", "")
		var u *Unsupported
		if !errors.As(err, &u) || u.Feature != c.feature {
			t.Errorf("%s: %v, want Unsupported %q", c.name, err, c.feature)
		}
	}
	if _, err := MessagesToChat([]byte(`{"model":`), "gpt-4.1", ""); err == nil {
		t.Error("malformed JSON accepted")
	}
}

// A whole Chat answer as the Messages answer: text, tool calls as
// tool_use blocks with their ids, stop reasons, cached tokens as reads.
func TestChatToMessages(t *testing.T) {
	t.Parallel()
	in := `{"id":"chatcmpl-abc","choices":[{"message":{"role":"assistant","content":"Two files.","tool_calls":[
	  {"id":"call_1","type":"function","function":{"name":"Bash","arguments":"{\"command\":\"ls\"}"}}]},"finish_reason":"tool_calls"}],
	  "usage":{"prompt_tokens":1200,"completion_tokens":30,"prompt_tokens_details":{"cached_tokens":1024}}}`
	out, err := ChatToMessages([]byte(in), "claude-sonnet-4-5", Request{})
	if err != nil {
		t.Fatal(err)
	}
	got := decode(t, out)
	want := decode(t, []byte(`{"id":"msg_abc","type":"message","role":"assistant","model":"claude-sonnet-4-5",
	  "content":[{"type":"text","text":"Two files."},{"type":"tool_use","id":"call_1","name":"Bash","input":{"command":"ls"}}],
	  "stop_reason":"tool_use","stop_sequence":null,
	  "usage":{"input_tokens":176,"output_tokens":30,"cache_read_input_tokens":1024,"cache_creation_input_tokens":0}}`))
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
	for finish, stop := range map[string]string{"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"} {
		if got := StopReason(finish); got != stop {
			t.Errorf("StopReason(%q) = %q, want %q", finish, got, stop)
		}
	}
	if _, err := ChatToMessages([]byte(`{"choices":[{"message":{"tool_calls":[{"id":"c","function":{"name":"x","arguments":"{not json"}}]}}]}`), "m", Request{}); err == nil {
		t.Error("tool call arguments that are not JSON accepted")
	}
}

// Any input is either a valid Chat Completions request or an error.
func FuzzMessagesToChat(f *testing.F) {
	f.Add([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"model":"m","system":[{"type":"text","text":"s"}],"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"n","input":{}}]}]}`))
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"x"}]}]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := MessagesToChat(body, "gpt-4.1", "k")
		out := req.Body
		if err != nil {
			return
		}
		var m map[string]any
		if json.Unmarshal(out, &m) != nil || m["model"] != "gpt-4.1" {
			t.Fatalf("invalid output for %q: %s", body, out)
		}
	})
}
