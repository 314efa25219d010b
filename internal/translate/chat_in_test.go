package translate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Helpers shared with responses_in_test.go.

// readCase decodes the testdata file path into v.
func readCase(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func casePaths(t *testing.T, pattern string) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", pattern))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no testdata %s: %v", pattern, err)
	}
	return paths
}

// sameJSON fails t unless got and want are the same JSON, whatever the
// order of their objects' keys.
func sameJSON(t *testing.T, name string, got, want []byte) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("%s: output is not JSON: %v: %s", name, err, got)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatalf("%s: want is not JSON: %v", name, err)
	}
	if !reflect.DeepEqual(g, w) {
		a, _ := json.MarshalIndent(g, "", " ")
		b, _ := json.MarshalIndent(w, "", " ")
		t.Errorf("%s: got\n%s\nwant\n%s", name, a, b)
	}
}

// sseEvent is one server-sent event: its name ("" for none) and data.
type sseEvent struct {
	name string
	data []byte
}

// splitSSE splits a stream into its events, as the data plane hands them
// to a Stream: data lines joined; an event without data is left out.
func splitSSE(b []byte) []sseEvent {
	var out []sseEvent
	for _, chunk := range strings.Split(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n\n") {
		var ev sseEvent
		var data []string
		for _, line := range strings.Split(chunk, "\n") {
			if v, ok := strings.CutPrefix(line, "event:"); ok {
				ev.name = strings.TrimSpace(v)
			} else if v, ok := strings.CutPrefix(line, "data:"); ok {
				data = append(data, strings.TrimPrefix(v, " "))
			}
		}
		if data != nil {
			ev.data = []byte(strings.Join(data, "\n"))
			out = append(out, ev)
		}
	}
	return out
}

func upstream(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "messages", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// runStream feeds a recorded upstream stream to s.
func runStream(s Stream, upstream []byte) ([]byte, error) {
	var out []byte
	for _, ev := range splitSSE(upstream) {
		b, err := s.Event(ev.name, ev.data)
		if err != nil {
			return out, err
		}
		out = append(out, b...)
	}
	return out, nil
}

// clientEvents splits a translated stream into its events, checking
// each is framed whole: an optional event line, one data line, a blank
// line.
func clientEvents(out []byte) ([]sseEvent, error) {
	var evs []sseEvent
	rest := string(out)
	for rest != "" {
		frame, after, ok := strings.Cut(rest, "\n\n")
		if !ok {
			return nil, fmt.Errorf("an event without its blank line: %q", rest)
		}
		rest = after
		var ev sseEvent
		if name, r, ok := strings.Cut(frame, "\n"); ok && strings.HasPrefix(name, "event: ") {
			ev.name, frame = strings.TrimPrefix(name, "event: "), r
		}
		data, ok := strings.CutPrefix(frame, "data: ")
		if !ok || strings.Contains(data, "\n") {
			return nil, fmt.Errorf("an event that is not one data line: %q", frame)
		}
		ev.data = []byte(data)
		evs = append(evs, ev)
	}
	return evs, nil
}

// checkMessagesBody says what is wrong with a translated request body: it
// must be a JSON object with the target's model, max_tokens and messages
// that alternate from a user one, none empty, tool results only in user
// messages and first there.
func checkMessagesBody(body []byte, model string) error {
	var m struct {
		Model     string `json:"model"`
		MaxTokens *int64 `json:"max_tokens"`
		Messages  []struct {
			Role    string `json:"role"`
			Content []struct {
				Type string `json:"type"`
			} `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &m); err != nil {
		return err
	}
	if m.Model != model || m.MaxTokens == nil || len(m.Messages) == 0 {
		return errors.New("no model, max_tokens or messages")
	}
	for i, msg := range m.Messages {
		if want := []string{"user", "assistant"}[i%2]; msg.Role != want || len(msg.Content) == 0 {
			return fmt.Errorf("messages[%d]: %s with %d blocks, want %s and some", i, msg.Role, len(msg.Content), want)
		}
		results := true
		for _, b := range msg.Content {
			if b.Type == "tool_result" && (msg.Role != "user" || !results) {
				return fmt.Errorf("messages[%d]: a tool result out of place", i)
			}
			results = b.Type == "tool_result"
		}
	}
	return nil
}

// A recorded Chat Completions agent's request as the Messages request.
func TestChatToMessagesRequestRecorded(t *testing.T) {
	t.Parallel()
	for _, path := range casePaths(t, "chat_in/request_*.json") {
		var c struct {
			Model        string          `json:"model"`
			CacheKey     string          `json:"cache_key"`
			Request      json.RawMessage `json:"request"`
			Want         json.RawMessage `json:"want"`
			Dropped      []string        `json:"dropped"`
			IncludeUsage bool            `json:"include_usage"`
		}
		readCase(t, path, &c)
		req, err := ChatToMessagesRequest(c.Request, c.Model, c.CacheKey)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		sameJSON(t, path, req.Body, c.Want)
		if !slices.Equal(req.Dropped, c.Dropped) || req.IncludeUsage != c.IncludeUsage {
			t.Errorf("%s: dropped %q include_usage %v, want %q %v", path, req.Dropped, req.IncludeUsage, c.Dropped, c.IncludeUsage)
		}
		if err := checkMessagesBody(req.Body, c.Model); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
}

// Settings that depend on each other: thinking and a forced tool choice,
// thinking and max_tokens, temperature and top_p, stop, the usage a
// stream asks.
func TestChatToMessagesRequestSettings(t *testing.T) {
	t.Parallel()
	const hi = `"messages":[{"role":"user","content":"hi"}]`
	const tool = `"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}]`
	for _, c := range []struct{ name, body, want, dropped string }{
		{"defaults", `{"model":"gpt-4.1",` + hi + `}`,
			`{"model":"claude","max_tokens":32000,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, ""},
		{"forced tool, no thinking", `{"reasoning_effort":"high","tool_choice":"required","parallel_tool_calls":false,` + tool + `,` + hi + `}`,
			`{"model":"claude","max_tokens":32000,"tools":[{"name":"f","input_schema":{"type":"object","properties":{}}}],
			  "tool_choice":{"type":"any","disable_parallel_tool_use":true},"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
			"reasoning_effort"},
		{"named tool", `{"tool_choice":{"type":"function","function":{"name":"f"}},` + tool + `,` + hi + `}`,
			`{"model":"claude","max_tokens":32000,"tools":[{"name":"f","input_schema":{"type":"object","properties":{}}}],
			  "tool_choice":{"type":"tool","name":"f"},"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, ""},
		{"none, not parallel", `{"tool_choice":"none","parallel_tool_calls":false,` + tool + `,` + hi + `}`,
			`{"model":"claude","max_tokens":32000,"tools":[{"name":"f","input_schema":{"type":"object","properties":{}}}],
			  "tool_choice":{"type":"none"},"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, ""},
		{"choice without tools", `{"tool_choice":"auto","parallel_tool_calls":false,` + hi + `}`,
			`{"model":"claude","max_tokens":32000,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`, ""},
		{"xhigh over max_completion_tokens", `{"reasoning_effort":"xhigh","max_tokens":5,"max_completion_tokens":40000,"top_p":0.9,` + hi + `}`,
			`{"model":"claude","max_tokens":40000,"thinking":{"type":"enabled","budget_tokens":32000},"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
			"top_p"},
		{"minimal thinks not", `{"reasoning_effort":"minimal","temperature":0.1,"top_p":0.5,"stop":["a",""],` + hi + `}`,
			`{"model":"claude","max_tokens":32000,"temperature":0.1,"stop_sequences":["a"],"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
			"top_p"},
		{"service tier and verbosity", `{"service_tier":"flex","verbosity":"high","stream":true,"stream_options":{"include_usage":false},` + hi + `}`,
			`{"model":"claude","max_tokens":32000,"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
			"service_tier verbosity"},
	} {
		req, err := ChatToMessagesRequest([]byte(c.body), "claude", "")
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		sameJSON(t, c.name, req.Body, []byte(c.want))
		if got := strings.Join(req.Dropped, " "); got != c.dropped {
			t.Errorf("%s: dropped %q, want %q", c.name, got, c.dropped)
		}
		if req.IncludeUsage {
			t.Errorf("%s: include_usage set", c.name)
		}
	}
}

// What Messages cannot carry is refused, naming it.
func TestChatToMessagesRequestRefuses(t *testing.T) {
	t.Parallel()
	const hi = `"messages":[{"role":"user","content":"hi"}]`
	for _, c := range []struct{ body, feature string }{
		{`{"n":2,` + hi + `}`, "n above 1 (several choices)"},
		{`{"logprobs":true,` + hi + `}`, "logprobs"},
		{`{"response_format":{"type":"json_schema","json_schema":{}},` + hi + `}`, `response_format "json_schema"`},
		{`{"response_format":{"type":"json_object"},` + hi + `}`, `response_format "json_object"`},
		{`{"audio":{"voice":"alloy"},` + hi + `}`, "audio output"},
		{`{"modalities":["text","audio"],` + hi + `}`, "audio output"},
		{`{"presence_penalty":0.5,` + hi + `}`, "presence_penalty"},
		{`{"frequency_penalty":-1,` + hi + `}`, "frequency_penalty"},
		{`{"seed":7,` + hi + `}`, `the "seed" field`},
		{`{"functions":[],` + hi + `}`, `the "functions" field`},
		{`{"reasoning_effort":"max",` + hi + `}`, `the reasoning effort "max"`},
		{`{"tool_choice":{"type":"allowed_tools"},` + hi + `}`, `tool_choice "allowed_tools"`},
		{`{"tool_choice":"sometimes",` + hi + `}`, `tool_choice "sometimes"`},
		{`{"tools":[{"type":"custom","custom":{"name":"x"}}],` + hi + `}`, `a tool of type "custom"`},
		{`{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]}`, `a "input_audio" part in a user message`},
		{`{"messages":[{"role":"user","content":[{"type":"file","file":{}}]}]}`, `a "file" part in a user message`},
		{`{"messages":[{"role":"system","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"}}]},{"role":"user","content":"hi"}]}`, `a "image_url" part in a system message`},
		{`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]}`, "an image URL that is neither https nor a data URL"},
		{`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png,abc"}}]}]}`, "an image data URL that is not base64"},
		{`{"messages":[{"role":"user","content":"hi"},{"role":"function","name":"f","content":"x"}]}`, "function_call (the deprecated functions API)"},
		{`{"messages":[{"role":"assistant","content":"hello"},{"role":"user","content":"hi"}]}`, "a conversation that starts with an assistant turn"},
		{`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"c","type":"custom","custom":{}}]}]}`, `a tool call of type "custom"`},
	} {
		_, err := ChatToMessagesRequest([]byte(c.body), "claude", "")
		var u *Unsupported
		if !errors.As(err, &u) || u.Feature != c.feature {
			t.Errorf("%s: %v, want Unsupported %q", c.body, err, c.feature)
		}
	}
	for _, body := range []string{
		`{"messages":`,
		`[]`,
		`{"messages":[]}`,
		`{"messages":[{"role":"system","content":"only instructions"}]}`,
		`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{not json"}}]}]}`,
		`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f","arguments":"[1]"}}]}]}`,
		`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}]}`,
		`{"messages":[{"role":"tool","content":"x"}]}`,
		`{"messages":[{"role":"robot","content":"x"}]}`,
		`{"tools":[{"type":"function","function":{"parameters":{}}}],"messages":[{"role":"user","content":"hi"}]}`,
		`{"stop":5,"messages":[{"role":"user","content":"hi"}]}`,
	} {
		if _, err := ChatToMessagesRequest([]byte(body), "claude", ""); err == nil {
			t.Errorf("%s: accepted", body)
		}
	}
}

// A recorded whole Messages answer as the Chat completion.
func TestMessagesToChatAnswerRecorded(t *testing.T) {
	t.Parallel()
	for _, path := range casePaths(t, "chat_in/answer_*.json") {
		var c struct {
			Model    string          `json:"model"`
			Upstream string          `json:"upstream"`
			Want     json.RawMessage `json:"want"`
		}
		readCase(t, path, &c)
		out, err := MessagesToChatAnswer(upstream(t, c.Upstream), c.Model, Request{})
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		sameJSON(t, path, out, c.Want)
	}
}

// Stop reasons, an answer of no text, answers that are not one.
func TestMessagesToChatAnswerEdges(t *testing.T) {
	t.Parallel()
	for stop, finish := range map[string]string{"end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop",
		"max_tokens": "length", "model_context_window_exceeded": "length", "tool_use": "tool_calls", "refusal": "content_filter"} {
		out, err := MessagesToChatAnswer([]byte(`{"id":"msg_1","type":"message","content":[],"stop_reason":"`+stop+`"}`), "m", Request{})
		if err != nil {
			t.Fatal(err)
		}
		sameJSON(t, stop, out, []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,
		  "message":{"role":"assistant","content":null,"refusal":null},"finish_reason":"`+finish+`","logprobs":null}],
		  "usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0,"prompt_tokens_details":{"cached_tokens":0}}}`))
	}
	for _, body := range []string{`{"type":"error","error":{"type":"overloaded_error"}}`, `{"type":"message","content":[{"type":"server_tool_use"}]}`, `[`} {
		if _, err := MessagesToChatAnswer([]byte(body), "m", Request{}); err == nil {
			t.Errorf("%s: accepted", body)
		}
	}
}

// A recorded Messages stream as Chat chunks.
func TestMessagesToChatStreamRecorded(t *testing.T) {
	t.Parallel()
	for _, path := range casePaths(t, "chat_in/stream_*.json") {
		var c struct {
			Model        string            `json:"model"`
			IncludeUsage bool              `json:"include_usage"`
			Upstream     string            `json:"upstream"`
			Want         []json.RawMessage `json:"want"`
		}
		readCase(t, path, &c)
		out, err := runStream(NewMessagesToChatStream(c.Model, Request{IncludeUsage: c.IncludeUsage}), upstream(t, c.Upstream))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		evs, err := clientEvents(out)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(evs) != len(c.Want) {
			t.Fatalf("%s: %d chunks, want %d:\n%s", path, len(evs), len(c.Want), out)
		}
		for i, ev := range evs {
			if ev.name != "" {
				t.Errorf("%s: chunk %d has an event name", path, i)
			}
			if string(ev.data) == "[DONE]" {
				ev.data = []byte(`"[DONE]"`)
			}
			sameJSON(t, fmt.Sprintf("%s chunk %d", path, i), ev.data, c.Want[i])
		}
	}
}

// A stream cut by max_tokens without the usage asked: finish_reason
// length and no usage anywhere; a call without input gets "{}".
func TestMessagesToChatStreamEdges(t *testing.T) {
	t.Parallel()
	in := []byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_2\",\"usage\":{\"input_tokens\":5}}}\n\n" +
		"data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"now\",\"input\":{}}}\n\n" +
		"data: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"Cut\"}}\n\n" +
		"data: {\"type\":\"content_block_stop\",\"index\":1}\n\n" +
		"data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":9}}\n\n" +
		"data: {\"type\":\"message_stop\"}\n\n")
	out, err := runStream(NewMessagesToChatStream("m", Request{}), in)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(out, []byte(`"usage"`)) {
		t.Errorf("usage sent unasked:\n%s", out)
	}
	evs, err := clientEvents(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`{"role":"assistant","content":""}`,
		`{"tool_calls":[{"index":0,"id":"t","type":"function","function":{"name":"now","arguments":""}}]}`,
		`{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}`,
		`{"content":"Cut"}`,
		`{}`,
	}
	if len(evs) != len(want)+1 || string(evs[len(evs)-1].data) != "[DONE]" {
		t.Fatalf("chunks:\n%s", out)
	}
	for i, w := range want {
		var c struct {
			Choices []struct {
				Delta        json.RawMessage `json:"delta"`
				FinishReason *string         `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(evs[i].data, &c); err != nil || len(c.Choices) != 1 {
			t.Fatalf("chunk %d: %s", i, evs[i].data)
		}
		sameJSON(t, fmt.Sprint("chunk ", i), c.Choices[0].Delta, []byte(w))
		if last := i == len(want)-1; last != (c.Choices[0].FinishReason != nil) || last && *c.Choices[0].FinishReason != "length" {
			t.Errorf("chunk %d: finish_reason %v", i, c.Choices[0].FinishReason)
		}
	}
}

// outOfOrder are Messages streams a translator cannot follow.
var outOfOrder = map[string][]string{
	"not JSON":              {`{"type":"message_start","message":{"id":"m"}}`, `{"type":`},
	"delta before start":    {`{"type":"message_start","message":{"id":"m"}}`, `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}}`},
	"stop before start":     {`{"type":"message_stop"}`},
	"block before message":  {`{"type":"content_block_start","index":0,"content_block":{"type":"text"}}`},
	"second message_start":  {`{"type":"message_start","message":{"id":"m"}}`, `{"type":"message_start","message":{"id":"m"}}`},
	"message without body":  {`{"type":"message_start"}`},
	"two blocks open":       {`{"type":"message_start","message":{"id":"m"}}`, `{"type":"content_block_start","index":0,"content_block":{"type":"text"}}`, `{"type":"content_block_start","index":1,"content_block":{"type":"text"}}`},
	"wrong index":           {`{"type":"message_start","message":{"id":"m"}}`, `{"type":"content_block_start","index":0,"content_block":{"type":"text"}}`, `{"type":"content_block_stop","index":1}`},
	"delta of another kind": {`{"type":"message_start","message":{"id":"m"}}`, `{"type":"content_block_start","index":0,"content_block":{"type":"text"}}`, `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{"}}`},
	"server tool block":     {`{"type":"message_start","message":{"id":"m"}}`, `{"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"s","name":"web_search"}}`},
	"stop with block open":  {`{"type":"message_start","message":{"id":"m"}}`, `{"type":"content_block_start","index":0,"content_block":{"type":"text"}}`, `{"type":"message_stop"}`},
	"after the end":         {`{"type":"message_start","message":{"id":"m"}}`, `{"type":"message_stop"}`, `{"type":"ping"}`},
	"error event":           {`{"type":"message_start","message":{"id":"m"}}`, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`},
}

// A stream out of order is an error, never a panic; pings and event
// types this package does not know pass.
func TestMessagesToChatStreamOutOfOrder(t *testing.T) {
	t.Parallel()
	for name, events := range outOfOrder {
		s := NewMessagesToChatStream("m", Request{IncludeUsage: true})
		var err error
		for _, data := range events {
			if _, err = s.Event("", []byte(data)); err != nil {
				break
			}
		}
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	s := NewMessagesToChatStream("m", Request{})
	for _, data := range []string{`{"type":"ping"}`, `{"type":"message_start","message":{"id":"m"}}`, `{"type":"future_event"}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"text"}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"citations_delta","citation":{}}}`} {
		if out, err := s.Event("", []byte(data)); err != nil || (data != `{"type":"message_start","message":{"id":"m"}}` && out != nil) {
			t.Errorf("%s: %q %v", data, out, err)
		}
	}
}

// Any input is either an error or a Messages request of the shape
// checkMessagesBody asks (never one of no messages: that is an error).
func FuzzChatToMessagesRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	f.Add([]byte(`{"messages":[{"role":"assistant","content":"x","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}]}`))
	f.Add([]byte(`{"reasoning_effort":"low","messages":[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"id":"c","function":{"name":"f"}}]},{"role":"tool","tool_call_id":"c","content":[{"type":"text","text":"r"}]}]}`))
	f.Add([]byte(`{"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}}]}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, key := range []string{"", "k"} {
			req, err := ChatToMessagesRequest(body, "claude", key)
			if err != nil {
				return
			}
			if err := checkMessagesBody(req.Body, "claude"); err != nil {
				t.Fatalf("%v for %s: %s", err, body, req.Body)
			}
		}
	})
}

// Any input is either an error or chunks of JSON (or [DONE]), each framed
// whole.
func FuzzMessagesToChatStream(f *testing.F) {
	seedMessagesStreams(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		out, _ := runStream(NewMessagesToChatStream("m", Request{IncludeUsage: true}), in)
		evs, err := clientEvents(out)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.name != "" || string(ev.data) != "[DONE]" && !json.Valid(ev.data) {
				t.Fatalf("a chunk that is not JSON: %q", ev.data)
			}
		}
	})
}

// Any input is either an error or a Chat completion.
func FuzzMessagesToChatAnswer(f *testing.F) {
	b, err := os.ReadFile(filepath.Join("testdata", "messages", "answer_tools.json"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte(`{"type":"message","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":1}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		out, err := MessagesToChatAnswer(body, "m", Request{})
		if err != nil {
			return
		}
		var c struct {
			Object  string `json:"object"`
			Choices []any  `json:"choices"`
		}
		if json.Unmarshal(out, &c) != nil || c.Object != "chat.completion" || len(c.Choices) != 1 {
			t.Fatalf("not a completion: %s", out)
		}
	})
}

// seedMessagesStreams seeds a fuzz target with the recorded Messages
// streams and the shortest one.
func seedMessagesStreams(f *testing.F) {
	for _, name := range []string{"stream_tools.sse", "stream_custom.sse"} {
		b, err := os.ReadFile(filepath.Join("testdata", "messages", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\"}}\n\ndata: {\"type\":\"message_stop\"}\n\n"))
}
