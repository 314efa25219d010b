package translate

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Recorded Codex requests as Messages requests.
func TestResponsesToMessagesRequestRecorded(t *testing.T) {
	t.Parallel()
	for _, path := range casePaths(t, "responses_in/request_*.json") {
		var c struct {
			Model       string          `json:"model"`
			CacheKey    string          `json:"cache_key"`
			Request     json.RawMessage `json:"request"`
			Want        json.RawMessage `json:"want"`
			Dropped     []string        `json:"dropped"`
			CustomTools []string        `json:"custom_tools"`
		}
		readCase(t, path, &c)
		req, err := ResponsesToMessagesRequest(c.Request, c.Model, c.CacheKey)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		sameJSON(t, path, req.Body, c.Want)
		if !slices.Equal(req.Dropped, c.Dropped) {
			t.Errorf("%s: dropped %q, want %q", path, req.Dropped, c.Dropped)
		}
		if got := slices.Sorted(maps.Keys(req.CustomTools)); !slices.Equal(got, c.CustomTools) {
			t.Errorf("%s: custom tools %q, want %q", path, got, c.CustomTools)
		}
		if err := checkMessagesBody(req.Body, c.Model); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
}

// Settings that depend on each other, and a string input.
func TestResponsesToMessagesRequestSettings(t *testing.T) {
	t.Parallel()
	const tool = `"tools":[{"type":"function","name":"f"}]`
	const hi = `{"role":"user","content":[{"type":"text","text":"hi"}]}`
	const f = `{"name":"f","input_schema":{"type":"object","properties":{}}}`
	for _, c := range []struct{ name, body, want, dropped string }{
		{"string input, thinking over max_output_tokens", `{"input":"hi","reasoning":{"effort":"high","summary":"detailed"},"max_output_tokens":4096,"temperature":0.2}`,
			`{"model":"claude","max_tokens":24576,"thinking":{"type":"enabled","budget_tokens":16384},"messages":[` + hi + `]}`, "temperature"},
		{"xhigh at the default cap", `{"input":"hi","reasoning":{"effort":"xhigh"},"top_p":0.9}`,
			`{"model":"claude","max_tokens":40192,"thinking":{"type":"enabled","budget_tokens":32000},"messages":[` + hi + `]}`, "top_p"},
		{"forced tool", `{"input":"hi","reasoning":{"effort":"low"},"tool_choice":"required","parallel_tool_calls":false,` + tool + `}`,
			`{"model":"claude","max_tokens":32000,"tools":[` + f + `],"tool_choice":{"type":"any","disable_parallel_tool_use":true},"messages":[` + hi + `]}`,
			"reasoning.effort"},
		{"named tool", `{"input":"hi","tool_choice":{"type":"function","name":"f"},` + tool + `}`,
			`{"model":"claude","max_tokens":32000,"tools":[` + f + `],"tool_choice":{"type":"tool","name":"f"},"messages":[` + hi + `]}`, ""},
		{"no thinking, sampling", `{"input":"hi","reasoning":{"effort":"none"},"temperature":1,"top_p":0.5,"text":{"format":{"type":"text"},"verbosity":"medium"}}`,
			`{"model":"claude","max_tokens":32000,"temperature":1,"messages":[` + hi + `]}`, "top_p"},
		{"system only from input", `{"input":[{"role":"system","content":"s"},{"role":"user","content":"hi"}],"service_tier":"auto","truncation":"disabled"}`,
			`{"model":"claude","max_tokens":32000,"system":[{"type":"text","text":"s"}],"messages":[` + hi + `]}`, ""},
		{"cache key on a short prompt", `{"input":"hi","instructions":"be brief"}`,
			`{"model":"claude","max_tokens":32000,"system":[{"type":"text","text":"be brief","cache_control":{"type":"ephemeral"}}],
			  "messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}]}`, ""},
	} {
		key := ""
		if strings.HasPrefix(c.name, "cache key") {
			key = "sess"
		}
		req, err := ResponsesToMessagesRequest([]byte(c.body), "claude", key)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		sameJSON(t, c.name, req.Body, []byte(c.want))
		if got := strings.Join(req.Dropped, " "); got != c.dropped {
			t.Errorf("%s: dropped %q, want %q", c.name, got, c.dropped)
		}
	}
}

// The thinking of a translated answer comes back with the next turn as
// it came: the reasoning item's sealed block restores it, and the turn
// goes on thinking.
func TestResponsesThinkingRoundTrip(t *testing.T) {
	t.Parallel()
	req := Request{CustomTools: map[string]bool{"apply_patch": true}}
	out, err := MessagesToResponsesAnswer(upstream(t, "answer_tools.json"), "gpt-5-codex", req)
	if err != nil {
		t.Fatal(err)
	}
	var answer struct {
		Output []json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal(out, &answer); err != nil {
		t.Fatal(err)
	}
	input := append([]json.RawMessage{json.RawMessage(`{"role":"user","content":"List the files."}`)}, answer.Output...)
	input = append(input, json.RawMessage(`{"type":"function_call_output","call_id":"toolu_01","output":"a.go"}`),
		json.RawMessage(`{"type":"custom_tool_call_output","call_id":"toolu_02","output":"Done."}`))
	body, _ := json.Marshal(map[string]any{"input": input, "reasoning": map[string]string{"effort": "medium"},
		"tools": []any{map[string]string{"type": "function", "name": "shell"}, map[string]string{"type": "custom", "name": "apply_patch"}}})
	next, err := ResponsesToMessagesRequest(body, "claude", "")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Thinking json.RawMessage `json:"thinking"`
		Messages []struct {
			Content []json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(next.Body, &m); err != nil || len(m.Messages) != 3 || len(m.Messages[1].Content) != 5 {
		t.Fatalf("%v: %s", err, next.Body)
	}
	sameJSON(t, "thinking", m.Thinking, []byte(`{"type":"enabled","budget_tokens":8192}`))
	sameJSON(t, "restored block", m.Messages[1].Content[0], []byte(`{"type":"thinking","thinking":"The user wants files listed.","signature":"sig-W"}`))
	sameJSON(t, "custom call", m.Messages[1].Content[4], []byte(`{"type":"tool_use","id":"toolu_02","name":"apply_patch","input":{"input":"*** Begin Patch\n*** End Patch\n"}}`))
	if len(next.Dropped) != 0 {
		t.Errorf("dropped %q", next.Dropped)
	}
}

// What Messages cannot carry is refused, naming it.
func TestResponsesToMessagesRequestRefuses(t *testing.T) {
	t.Parallel()
	const hi = `"input":"hi"`
	item := func(it string) string { return `{"input":[{"role":"user","content":"hi"},` + it + `]}` }
	tool := func(typ string) string { return `{"input":"hi","tools":[{"type":"` + typ + `"}]}` }
	cases := []struct{ body, feature string }{
		{`{"previous_response_id":"resp_1",` + hi + `}`, "previous_response_id (a stored conversation)"},
		{`{"background":true,` + hi + `}`, `the "background" field`},
		{`{"conversation":"conv_1",` + hi + `}`, `the "conversation" field`},
		{`{"text":{"format":{"type":"json_schema","schema":{}}},` + hi + `}`, `text.format "json_schema"`},
		{`{"reasoning":{"effort":"max"},` + hi + `}`, `the reasoning effort "max"`},
		{`{"tool_choice":{"type":"allowed_tools","tools":[]},` + hi + `}`, `tool_choice "allowed_tools"`},
		{`{"tool_choice":{"type":"web_search_preview"},` + hi + `}`, `tool_choice "web_search_preview"`},
		{`{"input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}`, "an input_file part"},
		{`{"input":[{"role":"user","content":[{"type":"input_image","file_id":"f"}]}]}`, "an input_image given by file_id"},
		{`{"input":[{"role":"user","content":[{"type":"input_audio"}]}]}`, `a "input_audio" part in a user message`},
		{`{"input":[{"role":"user","content":[{"type":"input_image","image_url":"ftp://x"}]}]}`, "an image URL that is neither https nor a data URL"},
		{item(`{"type":"function_call_output","call_id":"c","output":[{"type":"input_file","file_data":"x"}]}`), "an input_file part"},
		{item(`{"type":"local_shell_call","call_id":"c","action":{}}`), `an input item of type "local_shell_call"`},
		{item(`{"type":"web_search_call","action":{}}`), `an input item of type "web_search_call"`},
		{item(`{"type":"item_reference","id":"msg_1"}`), `an input item of type "item_reference"`},
		{item(`{"type":"compaction","encrypted_content":"x"}`), `an input item of type "compaction"`},
		{`{"input":[{"type":"additional_tools","role":"developer","tools":[]},{"role":"user","content":"hi"}]}`, `an input item of type "additional_tools"`},
		{`{"input":[{"role":"assistant","content":"hello"},{"role":"user","content":"hi"}]}`, "a conversation that starts with an assistant turn"},
	}
	for _, typ := range []string{"local_shell", "file_search", "computer_use_preview", "image_generation", "code_interpreter", "mcp"} {
		cases = append(cases, struct{ body, feature string }{tool(typ), fmt.Sprintf("the tool type %q", typ)})
	}
	for _, c := range cases {
		_, err := ResponsesToMessagesRequest([]byte(c.body), "claude", "")
		var u *Unsupported
		if !errors.As(err, &u) || u.Feature != c.feature {
			t.Errorf("%s: %v, want Unsupported %q", c.body, err, c.feature)
		}
	}
	for _, body := range []string{
		`{"input":`,
		`null`,
		`{"input":""}`,
		`{"input":[]}`,
		`{"input":5}`,
		`{"instructions":"only instructions","input":[{"role":"developer","content":"more"}]}`,
		item(`{"type":"function_call","name":"f","call_id":"c","arguments":"{not json"}`),
		item(`{"type":"function_call","name":"f","arguments":"{}"}`),
		item(`{"type":"function_call_output","output":"x"}`),
		`{"input":[{"role":"tool","content":"x"}]}`,
		`{"input":[{"content":"x"}]}`,
		`{"input":"hi","tools":[{"type":"custom"}]}`,
		`{"input":"hi","tools":[{"type":"function","name":"f","parameters":[]}]}`,
	} {
		if _, err := ResponsesToMessagesRequest([]byte(body), "claude", ""); err == nil {
			t.Errorf("%s: accepted", body)
		}
	}
}

// A recorded whole Messages answer as the Responses response.
func TestMessagesToResponsesAnswerRecorded(t *testing.T) {
	t.Parallel()
	for _, path := range casePaths(t, "responses_in/answer_*.json") {
		var c struct {
			Model       string          `json:"model"`
			CustomTools []string        `json:"custom_tools"`
			Upstream    string          `json:"upstream"`
			Want        json.RawMessage `json:"want"`
		}
		readCase(t, path, &c)
		req := Request{CustomTools: map[string]bool{}}
		for _, name := range c.CustomTools {
			req.CustomTools[name] = true
		}
		out, err := MessagesToResponsesAnswer(upstream(t, c.Upstream), c.Model, req)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		sameJSON(t, path, out, c.Want)
	}
}

// Answers cut short are incomplete; an answer of nothing has no output;
// answers that are not one, or a custom call without its input, are
// errors.
func TestMessagesToResponsesAnswerEdges(t *testing.T) {
	t.Parallel()
	for stop, details := range map[string]string{"max_tokens": `{"reason":"max_output_tokens"}`, "model_context_window_exceeded": `{"reason":"max_output_tokens"}`,
		"refusal": `{"reason":"content_filter"}`, "end_turn": `null`} {
		out, err := MessagesToResponsesAnswer([]byte(`{"id":"msg_9","type":"message","content":[],"stop_reason":"`+stop+`","usage":{"input_tokens":3,"output_tokens":4}}`), "m", Request{})
		if err != nil {
			t.Fatal(err)
		}
		status := "incomplete"
		if details == "null" {
			status = "completed"
		}
		sameJSON(t, stop, out, []byte(`{"id":"resp_9","object":"response","created_at":0,"status":"`+status+`","error":null,"incomplete_details":`+details+`,
		  "model":"m","output":[],"usage":{"input_tokens":3,"input_tokens_details":{"cached_tokens":0},"output_tokens":4,
		  "output_tokens_details":{"reasoning_tokens":0},"total_tokens":7}}`))
	}
	custom := Request{CustomTools: map[string]bool{"apply_patch": true}}
	for _, body := range []string{
		`{"type":"error","error":{"type":"overloaded_error"}}`,
		`{"type":"message","content":[{"type":"web_search_tool_result"}]}`,
		`{"type":"message","content":[{"type":"tool_use","id":"t","name":"apply_patch","input":{"patch":"x"}}]}`,
		`{"type":"message","content":[{"type":"tool_use","id":"t","name":"apply_patch"}]}`,
		`{`,
	} {
		if _, err := MessagesToResponsesAnswer([]byte(body), "m", custom); err == nil {
			t.Errorf("%s: accepted", body)
		}
	}
}

// Recorded Messages streams as Responses events.
func TestMessagesToResponsesStreamRecorded(t *testing.T) {
	t.Parallel()
	for _, path := range casePaths(t, "responses_in/stream_*.json") {
		var c struct {
			Model       string   `json:"model"`
			CustomTools []string `json:"custom_tools"`
			Upstream    string   `json:"upstream"`
			Want        []struct {
				Event string          `json:"event"`
				Data  json.RawMessage `json:"data"`
			} `json:"want"`
		}
		readCase(t, path, &c)
		req := Request{CustomTools: map[string]bool{}}
		for _, name := range c.CustomTools {
			req.CustomTools[name] = true
		}
		out, err := runStream(NewMessagesToResponsesStream(c.Model, req), upstream(t, c.Upstream))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		evs, err := clientEvents(out)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		var names, want []string
		for _, ev := range evs {
			names = append(names, ev.name)
		}
		for _, w := range c.Want {
			want = append(want, w.Event)
		}
		if !slices.Equal(names, want) {
			t.Fatalf("%s: events\n %q\nwant\n %q", path, names, want)
		}
		for i, ev := range evs {
			sameJSON(t, fmt.Sprintf("%s event %d", path, i), ev.data, c.Want[i].Data)
		}
	}
}

// A stream cut by max_tokens ends in response.incomplete; a call without
// input has arguments "{}"; a redacted thinking block is a reasoning item
// without summary; a custom call without its input string is an error.
func TestMessagesToResponsesStreamEdges(t *testing.T) {
	t.Parallel()
	in := []byte("data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_3\",\"usage\":{\"input_tokens\":5}}}\n\n" +
		"data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"redacted_thinking\",\"data\":\"opaque\"}}\n\n" +
		"data: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
		"data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"now\",\"input\":{}}}\n\n" +
		"data: {\"type\":\"content_block_stop\",\"index\":1}\n\n" +
		"data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":9}}\n\n" +
		"data: {\"type\":\"message_stop\"}\n\n")
	out, err := runStream(NewMessagesToResponsesStream("m", Request{}), in)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := clientEvents(out)
	if err != nil {
		t.Fatal(err)
	}
	last := evs[len(evs)-1]
	if last.name != "response.incomplete" {
		t.Fatalf("last event %s:\n%s", last.name, out)
	}
	var end struct {
		Response json.RawMessage `json:"response"`
	}
	if err := json.Unmarshal(last.data, &end); err != nil {
		t.Fatal(err)
	}
	sameJSON(t, "incomplete", end.Response, []byte(`{"id":"resp_3","object":"response","created_at":0,"status":"incomplete","error":null,
	  "incomplete_details":{"reason":"max_output_tokens"},"model":"m","output":[
	   {"type":"reasoning","id":"rs_3_0","summary":[],"encrypted_content":"weir.thinking.eyJkYXRhIjoib3BhcXVlIiwidHlwZSI6InJlZGFjdGVkX3RoaW5raW5nIn0"},
	   {"type":"function_call","id":"fc_3_1","call_id":"t","name":"now","arguments":"{}","status":"completed"}],
	  "usage":{"input_tokens":5,"input_tokens_details":{"cached_tokens":0},"output_tokens":9,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":14}}`))

	s := NewMessagesToResponsesStream("m", Request{CustomTools: map[string]bool{"apply_patch": true}})
	var failed error
	for _, data := range []string{`{"type":"message_start","message":{"id":"m"}}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"apply_patch","input":{}}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"patch\":\"x\"}"}}`,
		`{"type":"content_block_stop","index":0}`} {
		if _, failed = s.Event("", []byte(data)); failed != nil {
			break
		}
	}
	if failed == nil {
		t.Error("a custom call without its input string accepted")
	}
}

// A stream out of order is an error, never a panic.
func TestMessagesToResponsesStreamOutOfOrder(t *testing.T) {
	t.Parallel()
	for name, events := range outOfOrder {
		s := NewMessagesToResponsesStream("m", Request{})
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
}

// Any input is either an error or a Messages request of the shape
// checkMessagesBody asks (never one of no messages: that is an error).
func FuzzResponsesToMessagesRequest(f *testing.F) {
	for _, path := range []string{"responses_in/request_codex.json", "responses_in/request_unsigned.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", path))
		if err != nil {
			f.Fatal(err)
		}
		var c struct {
			Request json.RawMessage `json:"request"`
		}
		if err := json.Unmarshal(b, &c); err != nil {
			f.Fatal(err)
		}
		f.Add([]byte(c.Request))
	}
	f.Add([]byte(`{"input":"hi"}`))
	f.Add([]byte(`{"input":[{"type":"reasoning","encrypted_content":"weir.thinking.eyJzaWduYXR1cmUiOiJzIiwidHlwZSI6InRoaW5raW5nIn0"},{"role":"user","content":"x"}],"reasoning":{"effort":"low"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, key := range []string{"", "k"} {
			req, err := ResponsesToMessagesRequest(body, "claude", key)
			if err != nil {
				return
			}
			if err := checkMessagesBody(req.Body, "claude"); err != nil {
				t.Fatalf("%v for %s: %s", err, body, req.Body)
			}
		}
	})
}

// Any input is either an error or Responses events, each framed whole,
// its data a JSON object of its type, numbered in sequence.
func FuzzMessagesToResponsesStream(f *testing.F) {
	seedMessagesStreams(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		out, _ := runStream(NewMessagesToResponsesStream("m", Request{CustomTools: map[string]bool{"apply_patch": true}}), in)
		evs, err := clientEvents(out)
		if err != nil {
			t.Fatal(err)
		}
		for i, ev := range evs {
			var d struct {
				Type string `json:"type"`
				Seq  *int   `json:"sequence_number"`
			}
			if json.Unmarshal(ev.data, &d) != nil || d.Type != ev.name || d.Seq == nil || *d.Seq != i {
				t.Fatalf("event %d %s: %s", i, ev.name, ev.data)
			}
		}
	})
}

// Any input is either an error or a Responses response.
func FuzzMessagesToResponsesAnswer(f *testing.F) {
	b, err := os.ReadFile(filepath.Join("testdata", "messages", "answer_tools.json"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte(`{"type":"message","content":[{"type":"text","text":"hi"}],"stop_reason":"max_tokens"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		out, err := MessagesToResponsesAnswer(body, "m", Request{CustomTools: map[string]bool{"apply_patch": true}})
		if err != nil {
			return
		}
		var r struct {
			Object string `json:"object"`
			Output []any  `json:"output"`
		}
		if json.Unmarshal(out, &r) != nil || r.Object != "response" || r.Output == nil {
			t.Fatalf("not a response: %s", out)
		}
	})
}

// Codex's namespaced tools (multi_agent_v1, functions) are tools of their
// own on the Messages wire, each as namespace__name with the namespace's
// description; an earlier call of one goes back under that name, and the
// answer's call of one comes back to Codex in its namespace, whole and
// streamed.
func TestResponsesNamespacedTools(t *testing.T) {
	t.Parallel()
	in := `{"model":"team-coder","input":[{"role":"user","content":"wait"},
	 {"type":"function_call","namespace":"functions","name":"wait","call_id":"c1","arguments":"{\"ms\":1}"},
	 {"type":"function_call_output","call_id":"c1","output":"ok"}],
	 "tools":[{"type":"function","name":"shell","parameters":{"type":"object","properties":{}}},
	  {"type":"namespace","name":"functions","description":"Helpers.","tools":[
	   {"type":"function","name":"wait","description":"Wait.","parameters":{"type":"object","properties":{"ms":{"type":"integer"}}}},
	   {"type":"custom","name":"exec","description":"Run JavaScript."}]}]}`
	req, err := ResponsesToMessagesRequest([]byte(in), "claude-sonnet-4-5", "")
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Tools []struct {
			Name        string `json:"name"`
			Description string `json:"description"`
		} `json:"tools"`
		Messages []struct {
			Content []map[string]any `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(req.Body, &body); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range body.Tools {
		names = append(names, tl.Name)
	}
	if want := []string{"shell", "functions__wait", "functions__exec"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}
	if d := body.Tools[1].Description; d != "Helpers.\n\nWait." {
		t.Errorf("namespaced tool description %q", d)
	}
	if call := body.Messages[1].Content[0]; call["name"] != "functions__wait" || call["id"] != "c1" {
		t.Errorf("the earlier call went back as %v", call)
	}
	if !req.CustomTools["functions__exec"] || req.Namespaced["functions__exec"] != (ToolName{"functions", "exec"}) {
		t.Errorf("request %+v", req)
	}
	answer := `{"id":"msg_1","type":"message","role":"assistant","content":[
	 {"type":"tool_use","id":"toolu_1","name":"functions__wait","input":{"ms":2}},
	 {"type":"tool_use","id":"toolu_2","name":"functions__exec","input":{"input":"1+1"}},
	 {"type":"tool_use","id":"toolu_3","name":"shell","input":{}}],
	 "stop_reason":"tool_use","usage":{"input_tokens":1,"output_tokens":1}}`
	out, err := MessagesToResponsesAnswer([]byte(answer), "team-coder", req)
	if err != nil {
		t.Fatal(err)
	}
	var resp struct {
		Output []map[string]any `json:"output"`
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatal(err)
	}
	want := []ToolName{{"functions", "wait"}, {"functions", "exec"}, {"", "shell"}}
	for i, it := range resp.Output {
		ns, _ := it["namespace"].(string)
		if got := (ToolName{ns, it["name"].(string)}); got != want[i] {
			t.Errorf("output[%d] %v, want %v", i, it, want[i])
		}
	}
	// Streamed: the done items name their namespace too.
	s := NewMessagesToResponsesStream("team-coder", req)
	var streamed []byte
	for _, ev := range [][2]string{
		{"message_start", `{"type":"message_start","message":{"id":"msg_2","usage":{"input_tokens":1}}}`},
		{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_4","name":"functions__wait","input":{}}}`},
		{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"ms\":3}"}}`},
		{"content_block_stop", `{"type":"content_block_stop","index":0}`},
		{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":5}}`},
		{"message_stop", `{"type":"message_stop"}`},
	} {
		b, err := s.Event(ev[0], []byte(ev[1]))
		if err != nil {
			t.Fatalf("%s: %v", ev[0], err)
		}
		streamed = append(streamed, b...)
	}
	if !strings.Contains(string(streamed), `"namespace":"functions"`) || strings.Contains(string(streamed), `functions__wait`) {
		t.Errorf("stream %s, want the call in its namespace", streamed)
	}
}

// The provider's own web search, which Codex offers by default, is left
// out of a translated request and named; the request is served without.
func TestResponsesHostedSearchDropped(t *testing.T) {
	t.Parallel()
	for _, typ := range []string{"web_search", "web_search_preview"} {
		req, err := ResponsesToMessagesRequest([]byte(`{"input":"hi","tools":[{"type":"`+typ+`"},{"type":"function","name":"shell"}]}`), "claude-sonnet-4-5", "")
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		if !slices.Contains(req.Dropped, "tools["+typ+"]") || strings.Contains(string(req.Body), "web_search") ||
			!strings.Contains(string(req.Body), `"name":"shell"`) {
			t.Errorf("%s: dropped %v, body %s", typ, req.Dropped, req.Body)
		}
	}
}
