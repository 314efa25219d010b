package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Tools as the real clients offer them, trimmed: Claude Code's (with a
// server tool, which the simulator must not call), Codex's on the
// Responses wire (with its custom and built-in tools), and a function
// tool on Chat Completions.
const (
	claudeTools = `[
	 {"name":"Task","description":"Launch an agent","input_schema":{"type":"object","properties":{"description":{"type":"string"},"prompt":{"type":"string"}},"required":["description","prompt"]}},
	 {"name":"Bash","description":"Executes a bash command","input_schema":{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","properties":{"command":{"type":"string"},"timeout":{"type":"number"},"description":{"type":"string"},"run_in_background":{"type":"boolean"}},"required":["command"],"additionalProperties":false}},
	 {"name":"Read","description":"Reads a file","input_schema":{"type":"object","properties":{"file_path":{"type":"string"},"offset":{"type":"number"},"limit":{"type":"number"}},"required":["file_path"],"additionalProperties":false}},
	 {"type":"web_search_20250305","name":"web_search","max_uses":5}
	]`
	codexTools = `[
	 {"type":"function","name":"update_plan","description":"Updates the plan","strict":false,"parameters":{"type":"object","properties":{"explanation":{"type":"string"},"plan":{"type":"array","items":{"type":"object","properties":{"step":{"type":"string"},"status":{"type":"string","enum":["pending","in_progress","completed"]}},"required":["step","status"]}}},"required":["plan"]}},
	 {"type":"function","name":"shell","description":"Runs a shell command","strict":false,"parameters":{"type":"object","properties":{"command":{"type":"array","items":{"type":"string"}},"workdir":{"type":"string"},"timeout_ms":{"type":"number"}},"required":["command"],"additionalProperties":false}},
	 {"type":"custom","name":"apply_patch","description":"Edits files","format":{"type":"grammar","syntax":"lark","definition":"start: patch"}},
	 {"type":"web_search"}
	]`
	chatTools = `[{"type":"function","function":{"name":"exec_command","description":"Runs a command","parameters":{"type":"object","properties":{"cmd":{"type":"string"},"workdir":{"type":"string"},"yield_time_ms":{"type":"number"}},"required":["cmd"]}}}]`
)

const (
	claudePrompt = `[{"role":"user","content":[{"type":"text","text":"List the files."}]}]`
	codexPrompt  = `[{"type":"message","role":"developer","content":[{"type":"input_text","text":"You are Codex."}]},{"type":"message","role":"user","content":[{"type":"input_text","text":"List the files."}]}]`
	chatPrompt   = `[{"role":"system","content":"You are helpful."},{"role":"user","content":"List the files."}]`
)

func toolMessagesBody(stream bool, tools, messages string) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":1024,"stream":%t,"tools":%s,"messages":%s}`, sonnet, stream, tools, messages)
}

func toolResponsesBody(stream bool, tools, input string) string {
	return fmt.Sprintf(`{"model":%q,"stream":%t,"tools":%s,"tool_choice":"auto","parallel_tool_calls":false,"input":%s}`, gptModel, stream, tools, input)
}

// toolChatBody is a Chat Completions body offering tools; a stream asks
// for its usage.
func toolChatBody(stream bool, tools, messages string) string {
	opts := ""
	if stream {
		opts = `,"stream_options":{"include_usage":true}`
	}
	return fmt.Sprintf(`{"model":%q,"stream":%t%s,"tools":%s,"messages":%s}`, gptModel, stream, opts, tools, messages)
}

// toolAnswer is what a client reads of a tool call, on any wire.
type toolAnswer struct {
	name, id, args string
	namespace      string // a Responses call's namespace
	custom         bool   // a Responses custom tool call: args is its input
	outputTokens   int
}

// toolSchema is the schema of the named tool among the offered ones.
func toolSchema(t *testing.T, tools, name string) json.RawMessage {
	t.Helper()
	var list []toolDefinition
	if err := json.Unmarshal([]byte(tools), &list); err != nil {
		t.Fatal(err)
	}
	for _, tl := range list {
		switch name {
		case tl.Name:
			if tl.InputSchema != nil {
				return tl.InputSchema
			}
			return tl.Parameters
		case tl.Function.Name:
			return tl.Function.Parameters
		}
	}
	t.Fatalf("no tool %q", name)
	return nil
}

// conforms checks v against the parts of a JSON Schema the simulator
// fills: types, required properties, enums, items.
func conforms(t *testing.T, v any, schema json.RawMessage, path string) {
	t.Helper()
	var s struct {
		Type       string                     `json:"type"`
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
		Items      json.RawMessage            `json:"items"`
		Enum       []any                      `json:"enum"`
	}
	if err := json.Unmarshal(schema, &s); err != nil {
		t.Fatalf("%s: schema %s: %v", path, schema, err)
	}
	if len(s.Enum) > 0 && !slices.Contains(s.Enum, v) {
		t.Errorf("%s: %v is not one of %v", path, v, s.Enum)
	}
	ok := true
	switch s.Type {
	case "object":
		obj, isObj := v.(map[string]any)
		ok = isObj
		for _, p := range s.Required {
			if _, has := obj[p]; !has {
				t.Errorf("%s: lacks required %q", path, p)
			}
		}
		for p, pv := range obj {
			if ps, known := s.Properties[p]; known {
				conforms(t, pv, ps, path+"."+p)
			} else {
				t.Errorf("%s: property %q is not in the schema", path, p)
			}
		}
	case "array":
		list, isList := v.([]any)
		ok = isList
		for i, item := range list {
			conforms(t, item, s.Items, fmt.Sprintf("%s[%d]", path, i))
		}
	case "string":
		_, ok = v.(string)
	case "number", "integer":
		_, ok = v.(float64)
	case "boolean":
		_, ok = v.(bool)
	}
	if !ok {
		t.Errorf("%s: %#v is not a %s", path, v, s.Type)
	}
}

// readMessagesTool reads a Messages tool answer, checking its shape and,
// streamed, the real event order.
func readMessagesTool(t *testing.T, data []byte, stream bool) toolAnswer {
	t.Helper()
	if !stream {
		m := decode[message](t, data)
		if m.StopReason == nil || *m.StopReason != "tool_use" || len(m.Content) != 1 || m.Content[0].Type != "tool_use" {
			t.Fatalf("message %s", data)
		}
		var raw struct {
			Content []map[string]json.RawMessage `json:"content"`
		}
		json.Unmarshal(data, &raw) //nolint:errcheck // decoded above
		if _, hasText := raw.Content[0]["text"]; hasText || len(raw.Content[0]) != 4 {
			t.Errorf("tool_use block %v, want type, id, name and input only", raw.Content[0])
		}
		c := m.Content[0]
		return toolAnswer{name: c.Name, id: c.ID, args: string(c.Input), outputTokens: m.Usage.OutputTokens}
	}
	events, err := readEvents(strings.NewReader(string(data)))
	if err != nil {
		t.Fatalf("%v in %s", err, data)
	}
	names := eventNames(events)
	n := len(names) - 6
	if n < 2 || !slices.Equal(names, streamNames(n)) {
		t.Fatalf("events %v", names)
	}
	var start messageStartEvent
	json.Unmarshal([]byte(events[0].data), &start) //nolint:errcheck // checked by readEvents
	if start.Message.Usage.OutputTokens != 1 || len(start.Message.Content) != 0 {
		t.Errorf("message_start %s", events[0].data)
	}
	var open contentBlockStartEvent
	json.Unmarshal([]byte(events[1].data), &open) //nolint:errcheck // as above
	c := open.ContentBlock
	if want := fmt.Sprintf(`{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":%q,"name":%q,"input":{}}}`, c.ID, c.Name); events[1].data != want {
		t.Errorf("content_block_start %s, want %s", events[1].data, want)
	}
	var args strings.Builder
	for i, e := range events[3 : 3+n] {
		var d inputJSONDeltaEvent
		json.Unmarshal([]byte(e.data), &d) //nolint:errcheck // as above
		if d.Type != "content_block_delta" || d.Index != 0 || d.Delta.Type != "input_json_delta" || (i == 0) != (d.Delta.PartialJSON == "") {
			t.Errorf("delta %d: %s", i, e.data)
		}
		args.WriteString(d.Delta.PartialJSON)
	}
	var md struct {
		Delta stopDelta    `json:"delta"`
		Usage outputTokens `json:"usage"`
	}
	json.Unmarshal([]byte(events[len(events)-2].data), &md) //nolint:errcheck // as above
	if md.Delta.StopReason != "tool_use" {
		t.Errorf("message_delta %s", events[len(events)-2].data)
	}
	return toolAnswer{name: c.Name, id: c.ID, args: args.String(), outputTokens: md.Usage.OutputTokens}
}

// functionCallJSON is a Responses function_call or custom_tool_call item
// as a client reads it.
type functionCallJSON struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	Status    string `json:"status"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Arguments string `json:"arguments"`
	Input     string `json:"input"`
}

// args is the call's arguments, or a custom tool's input.
func (fc functionCallJSON) args() string {
	if fc.Type == "custom_tool_call" {
		return fc.Input
	}
	return fc.Arguments
}

// completedCall checks a completed response holding one tool call: a
// function_call (fc_…, status completed) or a custom_tool_call (ctc_…,
// no status).
func completedCall(t *testing.T, data []byte) (functionCallJSON, int) {
	t.Helper()
	var r struct {
		Status string             `json:"status"`
		Output []functionCallJSON `json:"output"`
		Usage  responseUsage      `json:"usage"`
	}
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	if r.Status != "completed" || len(r.Output) != 1 {
		t.Fatalf("response %s", data)
	}
	fc := r.Output[0]
	switch {
	case fc.Type == "function_call" && fc.Status == "completed" && strings.HasPrefix(fc.ID, "fc_") && fc.Input == "":
	case fc.Type == "custom_tool_call" && fc.Status == "" && strings.HasPrefix(fc.ID, "ctc_") && fc.Arguments == "":
	default:
		t.Errorf("item %+v", fc)
	}
	if !strings.HasPrefix(fc.CallID, "call_") {
		t.Errorf("item %+v", fc)
	}
	if r.Usage.TotalTokens != r.Usage.InputTokens+r.Usage.OutputTokens {
		t.Errorf("usage %+v", r.Usage)
	}
	return fc, r.Usage.OutputTokens - r.Usage.OutputTokensDetails.ReasoningTokens
}

// readResponsesTool reads a Responses tool answer, checking its shape and,
// streamed, the real event order: function_call_arguments events for a
// function, custom_tool_call_input events for a custom tool.
func readResponsesTool(t *testing.T, data []byte, stream bool) toolAnswer {
	t.Helper()
	if !stream {
		fc, out := completedCall(t, data)
		return toolAnswer{name: fc.Name, namespace: fc.Namespace, custom: fc.Type == "custom_tool_call", id: fc.CallID, args: fc.args(), outputTokens: out}
	}
	events, err := readEvents(strings.NewReader(string(data)))
	if err != nil {
		t.Fatalf("%v in %s", err, data)
	}
	checkSequence(t, events)
	if len(events) < 2 {
		t.Fatalf("events %v", eventNames(events))
	}
	var added struct {
		OutputIndex int              `json:"output_index"`
		Item        functionCallJSON `json:"item"`
	}
	json.Unmarshal([]byte(events[1].data), &added) //nolint:errcheck // checked by readEvents
	custom := added.Item.Type == "custom_tool_call"
	deltaName, doneName, field := "response.function_call_arguments.delta", "response.function_call_arguments.done", "arguments"
	if custom {
		deltaName, doneName, field = "response.custom_tool_call_input.delta", "response.custom_tool_call_input.done", "input"
	}
	names := eventNames(events)
	n := len(names) - 5
	want := []string{"response.created", "response.output_item.added"}
	for range n {
		want = append(want, deltaName)
	}
	want = append(want, doneName, "response.output_item.done", "response.completed")
	if n < 1 || !slices.Equal(names, want) {
		t.Fatalf("events %v, want %v", names, want)
	}
	wantStatus := "in_progress"
	if custom {
		wantStatus = ""
	}
	if it := added.Item; it.Status != wantStatus || it.args() != "" || it.Name == "" {
		t.Errorf("output_item.added %s", events[1].data)
	}
	var args strings.Builder
	for _, e := range events[2 : 2+n] {
		var d map[string]any
		json.Unmarshal([]byte(e.data), &d) //nolint:errcheck // as above
		if d["item_id"] != added.Item.ID || d["output_index"] != 0.0 || len(d) != 5 {
			t.Errorf("delta %s", e.data)
		}
		args.WriteString(d["delta"].(string))
	}
	var done map[string]any
	json.Unmarshal([]byte(events[2+n].data), &done) //nolint:errcheck // as above
	var itemDone struct {
		Item functionCallJSON `json:"item"`
	}
	json.Unmarshal([]byte(events[3+n].data), &itemDone) //nolint:errcheck // as above
	var completed struct {
		Response json.RawMessage `json:"response"`
	}
	json.Unmarshal([]byte(events[4+n].data), &completed) //nolint:errcheck // as above
	fc, out := completedCall(t, completed.Response)
	whole := added.Item
	if custom {
		whole.Input = args.String()
	} else {
		whole.Status, whole.Arguments = "completed", args.String()
	}
	if done["item_id"] != whole.ID || done[field] != whole.args() || itemDone.Item != whole || fc != whole {
		t.Errorf("%s %v, item done %+v, completed %+v; want %+v", doneName, done, itemDone.Item, fc, whole)
	}
	return toolAnswer{name: whole.Name, namespace: whole.Namespace, custom: custom, id: whole.CallID, args: whole.args(), outputTokens: out}
}

// chatToolJSON is a chat completion's tool call as a client reads it.
type chatToolJSON struct {
	Index    *int   `json:"index"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string  `json:"name"`
		Arguments *string `json:"arguments"`
	} `json:"function"`
}

type chatChoiceJSON struct {
	Message *struct {
		Role      string         `json:"role"`
		Content   *string        `json:"content"`
		ToolCalls []chatToolJSON `json:"tool_calls"`
	} `json:"message"`
	Delta *struct {
		Role      string         `json:"role"`
		Content   *string        `json:"content"`
		ToolCalls []chatToolJSON `json:"tool_calls"`
	} `json:"delta"`
	FinishReason *string `json:"finish_reason"`
}

// readChatTool reads a Chat Completions tool answer, checking its shape
// and, streamed, the real chunk order.
func readChatTool(t *testing.T, data []byte, stream bool) toolAnswer {
	t.Helper()
	type completion struct {
		Choices []chatChoiceJSON `json:"choices"`
		Usage   *chatUsage       `json:"usage"`
	}
	if !stream {
		c := decode[completion](t, data)
		if len(c.Choices) != 1 || c.Choices[0].Message == nil || c.Usage == nil {
			t.Fatalf("completion %s", data)
		}
		ch := c.Choices[0]
		m := ch.Message
		if m.Role != "assistant" || m.Content != nil || len(m.ToolCalls) != 1 || ch.FinishReason == nil || *ch.FinishReason != "tool_calls" {
			t.Fatalf("completion %s", data)
		}
		tc := m.ToolCalls[0]
		if tc.Index != nil || tc.Type != "function" || tc.Function.Arguments == nil {
			t.Errorf("tool call %s", data)
		}
		return toolAnswer{name: tc.Function.Name, id: tc.ID, args: *tc.Function.Arguments,
			outputTokens: c.Usage.CompletionTokens - c.Usage.CompletionTokensDetails.ReasoningTokens}
	}
	payloads := chatLines(t, data)
	if len(payloads) < 6 || payloads[len(payloads)-1] != "[DONE]" {
		t.Fatalf("payloads %q", payloads)
	}
	// The usage chunk (asked for) comes last: no choices, the usage.
	last := decode[completion](t, []byte(payloads[len(payloads)-2]))
	if len(last.Choices) != 0 || last.Usage == nil {
		t.Fatalf("usage chunk %s", payloads[len(payloads)-2])
	}
	var ans toolAnswer
	ans.outputTokens = last.Usage.CompletionTokens - last.Usage.CompletionTokensDetails.ReasoningTokens
	var args strings.Builder
	payloads = payloads[:len(payloads)-1]
	for i, p := range payloads[:len(payloads)-1] {
		c := decode[completion](t, []byte(p))
		if len(c.Choices) != 1 || c.Choices[0].Delta == nil {
			t.Fatalf("chunk %d: %s", i, p)
		}
		d, finish := c.Choices[0].Delta, c.Choices[0].FinishReason
		switch i {
		case 0:
			if d.Role != "assistant" || d.ToolCalls != nil || finish != nil {
				t.Fatalf("first chunk %s, want the role only", p)
			}
		case 1:
			if d.Role != "" || len(d.ToolCalls) != 1 || finish != nil {
				t.Fatalf("second chunk %s", p)
			}
			tc := d.ToolCalls[0]
			if tc.Index == nil || *tc.Index != 0 || tc.Type != "function" || tc.Function.Name == "" || tc.Function.Arguments == nil || *tc.Function.Arguments != "" {
				t.Errorf("second chunk %s", p)
			}
			ans.name, ans.id = tc.Function.Name, tc.ID
		case len(payloads) - 2:
			if finish == nil || *finish != "tool_calls" || d.ToolCalls != nil || c.Usage != nil {
				t.Errorf("last chunk %s", p)
			}
		default:
			if len(d.ToolCalls) != 1 || finish != nil || d.Role != "" {
				t.Fatalf("chunk %d: %s", i, p)
			}
			tc := d.ToolCalls[0]
			if tc.Index == nil || *tc.Index != 0 || tc.ID != "" || tc.Type != "" || tc.Function.Name != "" || tc.Function.Arguments == nil {
				t.Errorf("chunk %d: %s", i, p)
			}
			args.WriteString(*tc.Function.Arguments)
		}
	}
	ans.args = args.String()
	return ans
}

// TestToolCallAnswers: a request offering tools is answered with a call
// of the preferred tool, in each wire's real shape, streamed and not; the
// arguments (their pieces joined) are JSON that fits the tool's schema,
// and the usage counts them.
func TestToolCallAnswers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		path  string
		h     http.Header
		body  func(stream bool) string
		read  func(*testing.T, []byte, bool) toolAnswer
		tools string
		tool  string
		args  string
		idPfx string
	}{
		{"messages", "/v1/messages", apiKeyHeaders(keyA), func(s bool) string { return toolMessagesBody(s, claudeTools, claudePrompt) }, readMessagesTool,
			claudeTools, "Bash", `{"command":"echo weir-sim","description":"Print weir-sim"}`, "toolu_"},
		{"codex", codexPath, chatgptHeaders(tokChatGPT), func(s bool) string { return toolResponsesBody(s, codexTools, codexPrompt) }, readResponsesTool,
			codexTools, "shell", `{"command":["echo","weir-sim"]}`, "call_"},
		{"responses", responsesURL, openAIKeyHeaders(keyOpenAI), func(s bool) string { return toolResponsesBody(s, codexTools, `"List the files."`) }, readResponsesTool,
			codexTools, "shell", `{"command":["echo","weir-sim"]}`, "call_"},
		{"chat", chatURL, openAIKeyHeaders(keyOpenAI), func(s bool) string { return toolChatBody(s, chatTools, chatPrompt) }, readChatTool,
			chatTools, "exec_command", `{"cmd":"echo weir-sim"}`, "call_"},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s stream=%t", tc.name, stream), func(t *testing.T) {
				t.Parallel()
				b := setup(t, Config{Script: openAIScript(), Deltas: 5})
				body := tc.body(stream)
				resp, data := b.call(t, "POST", tc.path, tc.h, body)
				if resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, data)
				}
				got := tc.read(t, data, stream)
				if got.name != tc.tool || !strings.HasPrefix(got.id, tc.idPfx) {
					t.Errorf("called %q (id %q), want %q (%s…)", got.name, got.id, tc.tool, tc.idPfx)
				}
				var v, want any
				if err := json.Unmarshal([]byte(got.args), &v); err != nil {
					t.Fatalf("arguments %q are not JSON: %v", got.args, err)
				}
				json.Unmarshal([]byte(tc.args), &want) //nolint:errcheck // a constant
				if !reflect.DeepEqual(v, want) {
					t.Errorf("arguments %s, want %s", got.args, tc.args)
				}
				conforms(t, v, toolSchema(t, tc.tools, tc.tool), "input")
				if got.outputTokens != approxTokens(len(got.args)) {
					t.Errorf("output tokens %d, want %d", got.outputTokens, approxTokens(len(got.args)))
				}
				if a := b.nextAttempt(t); a.Outcome != outcomeOK || a.Status != 200 || a.Stream != stream || a.BodySHA256 != bodyHash(body) {
					t.Errorf("attempt %+v", a)
				}
			})
		}
	}
}

// Codex 0.171's request for its default model (gpt-6.2-sol), trimmed: no
// top-level tools; they come in an additional_tools input item, grouped in
// namespaces, with the shell reachable only through exec, a custom tool
// whose input is JavaScript (code mode). Captured from codex exec.
const (
	codexDefaultModel = "gpt-6.2-sol"
	codeModeTools     = `{"type":"additional_tools","id":"at_1","role":"developer","tools":[
	 {"type":"namespace","name":"functions","description":"","tools":[
	  {"type":"custom","name":"exec","description":"Run JavaScript code to orchestrate/compose tool calls","format":{"type":"grammar","syntax":"lark","definition":"start: SOURCE\nSOURCE: /[\\s\\S]+/\n"}},
	  {"type":"function","name":"wait","description":"Waits","strict":false,"parameters":{"type":"object","properties":{"cell_id":{"type":"string"}},"required":["cell_id"]}}]},
	 {"type":"namespace","name":"clock","description":"Tools for reading and waiting on time.","tools":[
	  {"type":"function","name":"sleep","description":"Sleeps","strict":false,"parameters":{"type":"object","properties":{"duration_ms":{"type":"number"}},"required":["duration_ms"],"additionalProperties":false}}]}]}`
	codeModePrompt = `{"type":"message","role":"developer","content":[{"type":"input_text","text":"You are Codex."}]},{"type":"message","role":"user","content":[{"type":"input_text","text":"hello"}]}`
)

// codeModeBody is a Responses Lite body: the tools in the input.
func codeModeBody(model string, stream bool, items ...string) string {
	return fmt.Sprintf(`{"model":%q,"stream":%t,"store":false,"tool_choice":"auto","parallel_tool_calls":false,"input":[%s]}`, model, stream, strings.Join(items, ","))
}

// TestToolCallCodexDefaultModel: Codex 0.171's default model offers its
// tools only in the input's additional_tools, in namespaces; the first
// turn still gets a tool call: exec, the custom tool of code mode, with
// JavaScript that runs echo through exec_command, as a custom_tool_call
// naming its namespace, streamed and not, on both OpenAI paths. A request
// offering only a namespaced function gets a function_call naming the
// namespace (Codex answers "unsupported call" to one without).
func TestToolCallCodexDefaultModel(t *testing.T) {
	t.Parallel()
	clockOnly := `{"type":"additional_tools","role":"developer","tools":[{"type":"namespace","name":"clock","tools":[{"type":"function","name":"sleep","parameters":{"type":"object","properties":{"duration_ms":{"type":"number"}},"required":["duration_ms"]}}]}]}`
	for _, tc := range []struct {
		name, path string
		h          http.Header
		tools      string
		want       toolAnswer // name, namespace, custom, args
	}{
		{"codex code mode", codexPath, chatgptHeaders(tokChatGPT), codeModeTools, toolAnswer{name: "exec", namespace: "functions", custom: true, args: codeModeInput}},
		{"responses code mode", responsesURL, openAIKeyHeaders(keyOpenAI), codeModeTools, toolAnswer{name: "exec", namespace: "functions", custom: true, args: codeModeInput}},
		{"namespaced function", codexPath, chatgptHeaders(tokChatGPT), clockOnly, toolAnswer{name: "sleep", namespace: "clock", args: `{"duration_ms":1}`}},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s stream=%t", tc.name, stream), func(t *testing.T) {
				t.Parallel()
				b := setup(t, Config{Script: openAIScript(), Deltas: 5})
				resp, data := b.call(t, "POST", tc.path, tc.h, codeModeBody(codexDefaultModel, stream, tc.tools, codeModePrompt))
				if resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, data)
				}
				got := readResponsesTool(t, data, stream)
				if got.name != tc.want.name || got.namespace != tc.want.namespace || got.custom != tc.want.custom || got.args != tc.want.args {
					t.Errorf("called %q in %q (custom %t) with %q, want %q in %q (custom %t) with %q",
						got.name, got.namespace, got.custom, got.args, tc.want.name, tc.want.namespace, tc.want.custom, tc.want.args)
				}
				if got.outputTokens != approxTokens(len(got.args)) {
					t.Errorf("output tokens %d, want %d", got.outputTokens, approxTokens(len(got.args)))
				}
			})
		}
	}
}

// TestToolCallAnyModel: whether the first turn of a request offering tools
// gets a tool call does not depend on the model it names, on any wire.
func TestToolCallAnyModel(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Script: openAIScript()})
	for _, model := range []string{gptModel, codexDefaultModel, "claude-opus-4-8", sonnet, "no-such-model"} {
		for _, tc := range []struct {
			wire, path string
			h          http.Header
			body       string
		}{
			{"messages", "/v1/messages", apiKeyHeaders(keyA), toolMessagesBody(false, claudeTools, claudePrompt)},
			{"codex", codexPath, chatgptHeaders(tokChatGPT), toolResponsesBody(false, codexTools, codexPrompt)},
			{"codex code mode", codexPath, chatgptHeaders(tokChatGPT), codeModeBody(gptModel, false, codeModeTools, codeModePrompt)},
			{"responses", responsesURL, openAIKeyHeaders(keyOpenAI), toolResponsesBody(false, codexTools, `"List the files."`)},
			{"chat", chatURL, openAIKeyHeaders(keyOpenAI), toolChatBody(false, chatTools, chatPrompt)},
		} {
			body := strings.Replace(strings.Replace(tc.body, `"`+sonnet+`"`, `"`+model+`"`, 1), `"`+gptModel+`"`, `"`+model+`"`, 1)
			if !strings.Contains(body, `"model":"`+model+`"`) {
				t.Fatalf("%s: the body does not name %s: %s", tc.wire, model, body)
			}
			resp, data := b.call(t, "POST", tc.path, tc.h, body)
			if resp.StatusCode != 200 {
				t.Fatalf("%s, %s: status %d: %s", tc.wire, model, resp.StatusCode, data)
			}
			if !isToolAnswer(t, data) {
				t.Errorf("%s, %s: text, want a tool call: %s", tc.wire, model, data)
			}
		}
	}
}

// isToolAnswer tells a tool answer from a text one on any wire.
func isToolAnswer(t *testing.T, data []byte) bool {
	t.Helper()
	s := string(data)
	tool := strings.Contains(s, `"tool_use"`) || strings.Contains(s, `"function_call"`) || strings.Contains(s, `"custom_tool_call"`) || strings.Contains(s, `"tool_calls"`)
	if text := strings.Contains(s, replyText); tool == text {
		t.Fatalf("neither a tool call nor the text: %s", data)
	}
	return tool
}

// TestToolCallsPerTurn: a turn gets tool calls until it holds
// tool_calls_per_turn results, then the text; a new prompt starts a new
// turn; a conversation that does not wait for the assistant, tool_choice
// none, and requests without client tools get text.
func TestToolCallsPerTurn(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Script: openAIScript()})
	use := `{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls"}}]}`
	result := `{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":"README.md"}]}`
	prompt := `{"role":"user","content":"And now?"}`
	turn := func(items ...string) string { return "[" + strings.Join(items, ",") + "]" }
	call := `{"type":"function_call","call_id":"call_1","name":"shell","arguments":"{}"}`
	output := `{"type":"function_call_output","call_id":"call_1","output":"README.md"}`
	user := `{"role":"user","content":"List the files."}`
	asked := `{"role":"assistant","tool_calls":[{"id":"call_1","type":"function","function":{"name":"exec_command","arguments":"{}"}}]}`
	answered := `{"role":"tool","tool_call_id":"call_1","content":"README.md"}`
	ccall := `{"type":"custom_tool_call","call_id":"call_1","name":"exec","input":"text(1)"}`
	coutput := `{"type":"custom_tool_call_output","call_id":"call_1","output":[{"type":"input_text","text":"weir-sim"}]}`
	for _, tc := range []struct {
		name, path string
		h          http.Header
		body       string
		tool       bool
	}{
		{"prompt", "/v1/messages", apiKeyHeaders(keyA), toolMessagesBody(false, claudeTools, claudePrompt), true},
		{"one result", "/v1/messages", apiKeyHeaders(keyA), toolMessagesBody(false, claudeTools, turn(user, use, result)), true},
		{"two results", "/v1/messages", apiKeyHeaders(keyA), toolMessagesBody(false, claudeTools, turn(user, use, result, use, result)), true},
		{"three results", "/v1/messages", apiKeyHeaders(keyA), toolMessagesBody(false, claudeTools, turn(user, use, result, use, result, use, result)), false},
		{"three results in one message", "/v1/messages", apiKeyHeaders(keyA), toolMessagesBody(false, claudeTools,
			turn(user, use, `{"role":"user","content":[{"type":"tool_result","tool_use_id":"a"},{"type":"tool_result","tool_use_id":"b"},{"type":"tool_result","tool_use_id":"c"},{"type":"text","text":"<system-reminder/>"}]}`)), false},
		{"a new prompt", "/v1/messages", apiKeyHeaders(keyA), toolMessagesBody(false, claudeTools, turn(user, use, result, use, result, use, result, `{"role":"assistant","content":"Done."}`, prompt)), true},
		{"a system message after the prompt", "/v1/messages", apiKeyHeaders(keyA), toolMessagesBody(false, claudeTools, turn(user, `{"role":"system","content":"Available agent types: claude"}`)), true},
		{"ends with the assistant", "/v1/messages", apiKeyHeaders(keyA), toolMessagesBody(false, claudeTools, turn(user, `{"role":"assistant","content":"Sure"}`)), false},
		{"tool_choice none", "/v1/messages", apiKeyHeaders(keyA), strings.Replace(toolMessagesBody(false, claudeTools, claudePrompt), `"tools"`, `"tool_choice":{"type":"none"},"tools"`, 1), false},
		{"no tools", "/v1/messages", apiKeyHeaders(keyA), toolMessagesBody(false, `[]`, claudePrompt), false},
		{"server tools only", "/v1/messages", apiKeyHeaders(keyA), toolMessagesBody(false, `[{"type":"web_search_20250305","name":"web_search"}]`, claudePrompt), false},
		{"responses two outputs", responsesURL, openAIKeyHeaders(keyOpenAI), toolResponsesBody(false, codexTools, turn(user, call, output, call, output)), true},
		{"responses three outputs", responsesURL, openAIKeyHeaders(keyOpenAI), toolResponsesBody(false, codexTools, turn(user, call, output, call, output, call, output)), false},
		{"responses tool_choice none", responsesURL, openAIKeyHeaders(keyOpenAI), strings.Replace(toolResponsesBody(false, codexTools, codexPrompt), `"auto"`, `"none"`, 1), false},
		{"responses built-in tools only", responsesURL, openAIKeyHeaders(keyOpenAI), toolResponsesBody(false, `[{"type":"web_search"}]`, codexPrompt), false},
		{"code mode two outputs", codexPath, chatgptHeaders(tokChatGPT), codeModeBody(codexDefaultModel, false, codeModeTools, codeModePrompt, ccall, coutput, ccall, coutput), true},
		{"code mode three outputs", codexPath, chatgptHeaders(tokChatGPT), codeModeBody(codexDefaultModel, false, codeModeTools, codeModePrompt, ccall, coutput, ccall, coutput, ccall, coutput), false},
		{"code mode ends with the assistant", codexPath, chatgptHeaders(tokChatGPT), codeModeBody(codexDefaultModel, false, codeModeTools, codeModePrompt, `{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Hi"}]}`), false},
		{"additional_tools of built-in tools only", codexPath, chatgptHeaders(tokChatGPT), codeModeBody(codexDefaultModel, false, `{"type":"additional_tools","tools":[{"type":"web_search"}]}`, codeModePrompt), false},
		{"chat two tool messages", chatURL, openAIKeyHeaders(keyOpenAI), toolChatBody(false, chatTools, turn(user, asked, answered, asked, answered)), true},
		{"chat three tool messages", chatURL, openAIKeyHeaders(keyOpenAI), toolChatBody(false, chatTools, turn(user, asked, answered, asked, answered, asked, answered)), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, data := b.call(t, "POST", tc.path, tc.h, tc.body)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, data)
			}
			if got := isToolAnswer(t, data); got != tc.tool {
				t.Errorf("tool call %t, want %t: %s", got, tc.tool, data)
			}
		})
	}
}

// TestToolCallsPerTurnContinued: a Responses request that continues an
// answer by previous_response_id (Codex over its WebSocket) sends only the
// items since; the turn's earlier results still count, so the turn ends
// with text after three calls instead of calling tools forever. The tools
// that the conversation's input items offered (Codex's additional_tools,
// sent once) are still offered; top-level tools are sent again each time.
func TestToolCallsPerTurnContinued(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		first, later func(input string) string
		output       string
		tool         string
	}{
		{"top-level tools",
			func(in string) string { return toolResponsesBody(false, codexTools, "["+in+"]") },
			func(in string) string { return toolResponsesBody(false, codexTools, "["+in+"]") },
			`{"type":"function_call_output","call_id":"call_1","output":"README.md"}`, `"name":"shell"`},
		{"tools in the input",
			func(in string) string { return codeModeBody(codexDefaultModel, false, codeModeTools, in) },
			func(in string) string { return codeModeBody(codexDefaultModel, false, in) },
			`{"type":"custom_tool_call_output","call_id":"call_1","output":[{"type":"input_text","text":"weir-sim"}]}`, `"name":"exec"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{Script: openAIScript()})
			continued := func(prev, body string) string {
				return strings.Replace(body, `{`, `{"previous_response_id":"`+prev+`",`, 1)
			}
			body := tc.first(strings.Trim(codexPrompt, "[]"))
			for i, want := range []bool{true, true, true, false} {
				resp, data := b.call(t, "POST", responsesURL, openAIKeyHeaders(keyOpenAI), body)
				if resp.StatusCode != 200 {
					t.Fatalf("request %d: status %d: %s", i+1, resp.StatusCode, data)
				}
				if got := isToolAnswer(t, data); got != want {
					t.Fatalf("request %d: tool call %t, want %t: %s", i+1, got, want, data)
				}
				if want && !strings.Contains(string(data), tc.tool) {
					t.Errorf("request %d: not a call of %s: %s", i+1, tc.tool, data)
				}
				var ro struct {
					ID string `json:"id"`
				}
				if err := json.Unmarshal(data, &ro); err != nil || ro.ID == "" {
					t.Fatalf("request %d: no response id: %v %s", i+1, err, data)
				}
				body = continued(ro.ID, tc.later(tc.output))
			}
			// A new prompt on the chain starts a new turn.
			body = strings.Replace(body, tc.output, `{"role":"user","content":"And now?"}`, 1)
			resp, data := b.call(t, "POST", responsesURL, openAIKeyHeaders(keyOpenAI), body)
			if resp.StatusCode != 200 || !isToolAnswer(t, data) {
				t.Fatalf("a new prompt after the chain: %d, want a tool call: %s", resp.StatusCode, data)
			}
		})
	}
}

// TestToolSettings: tool_calls_per_turn and prefer_tools of the script,
// overridden by an account's own; a forced tool_choice names the tool; the
// settings come back in the script as they were set.
func TestToolSettings(t *testing.T) {
	t.Parallel()
	const script = `{
	  "accept_unknown": true,
	  "tool_calls_per_turn": 1,
	  "prefer_tools": ["Read"],
	  "accounts": [
	    {"name": "a", "credential": "sk-ant-api03-aaaaaaaaaaaaaaaa"},
	    {"name": "b", "credential": "sk-ant-api03-bbbbbbbbbbbbbbbb", "tool_calls_per_turn": 0},
	    {"name": "c", "credential": "sk-ant-api03-cccccccccccccccc", "tool_calls_per_turn": 2, "prefer_tools": ["Task", "Bash"]}
	  ]
	}`
	b := setup(t, Config{})
	if resp, data := b.call(t, "PUT", "/_sim/script", nil, script); resp.StatusCode != 200 {
		t.Fatalf("PUT script: %d %s", resp.StatusCode, data)
	}
	oneResult := `[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"Read","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t"}]}]`
	called := func(key, body string) string {
		t.Helper()
		resp, data := b.call(t, "POST", "/v1/messages", apiKeyHeaders(key), body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, data)
		}
		if !isToolAnswer(t, data) {
			return ""
		}
		return decode[message](t, data).Content[0].Name
	}
	for _, tc := range []struct {
		name, key, messages, want string
	}{
		{"script prefers Read", "sk-ant-api03-aaaaaaaaaaaaaaaa", claudePrompt, "Read"},
		{"script allows one call", "sk-ant-api03-aaaaaaaaaaaaaaaa", oneResult, ""},
		{"a discovered account has the script's settings", "sk-ant-api03-dddddddddddddddd", claudePrompt, "Read"},
		{"account turns tools off", "sk-ant-api03-bbbbbbbbbbbbbbbb", claudePrompt, ""},
		{"account prefers Task", "sk-ant-api03-cccccccccccccccc", claudePrompt, "Task"},
		{"account allows two calls", "sk-ant-api03-cccccccccccccccc", oneResult, "Task"},
	} {
		if got := called(tc.key, toolMessagesBody(false, claudeTools, tc.messages)); got != tc.want {
			t.Errorf("%s: called %q, want %q", tc.name, got, tc.want)
		}
	}
	forced := strings.Replace(toolMessagesBody(false, claudeTools, claudePrompt), `"tools"`, `"tool_choice":{"type":"tool","name":"Bash"},"tools"`, 1)
	if got := called("sk-ant-api03-aaaaaaaaaaaaaaaa", forced); got != "Bash" {
		t.Errorf("forced Bash: called %q", got)
	}
	_, data := b.call(t, "POST", "/v1/messages", apiKeyHeaders("sk-ant-api03-cccccccccccccccc"), toolMessagesBody(false, claudeTools, claudePrompt))
	if m := decode[message](t, data); m.Content[0].Input != `{"description":"Print weir-sim","prompt":"weir-sim"}` {
		t.Errorf("Task input %s", m.Content[0].Input)
	}

	_, data = b.call(t, "GET", "/_sim/script", nil, "")
	got := decode[Script](t, data)
	if got.ToolCallsPerTurn == nil || *got.ToolCallsPerTurn != 1 || !slices.Equal(got.PreferTools, []string{"Read"}) ||
		got.Accounts[0].ToolCallsPerTurn != nil || got.Accounts[0].PreferTools != nil ||
		got.Accounts[1].ToolCallsPerTurn == nil || *got.Accounts[1].ToolCallsPerTurn != 0 ||
		!slices.Equal(got.Accounts[2].PreferTools, []string{"Task", "Bash"}) {
		t.Errorf("script %s", data)
	}
	for _, bad := range []struct{ body, want string }{
		{`{"accounts":[],"tool_calls_per_turn":-1}`, "tool_calls_per_turn: -1 is negative"},
		{`{"accounts":[{"name":"a","credential":"k1","prefer_tools":["Bash",""]}]}`, "accounts[0].prefer_tools[1]: empty tool name"},
	} {
		resp, data := b.call(t, "PUT", "/_sim/script", nil, bad.body)
		if resp.StatusCode != 400 || !strings.Contains(string(data), bad.want) {
			t.Errorf("PUT %s: %d %s, want 400 naming %q", bad.body, resp.StatusCode, data, bad.want)
		}
	}
}

// TestToolCallFaults: faults apply to requests answered with a tool call
// as to text ones: an error event before any output, an error after some
// argument pieces, a plain error; each uses the fault up.
func TestToolCallFaults(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{Script: openAIScript(), Deltas: 5})
	for _, tc := range []struct {
		name, acct, path string
		h                http.Header
		body             string
		fault            Fault
		want             []string // event names, or chat payload kinds
	}{
		{"messages overloaded event", "key-a", "/v1/messages", apiKeyHeaders(keyA), toolMessagesBody(true, claudeTools, claudePrompt),
			Fault{Kind: FaultOverloadedEvent}, []string{"message_start", "error"}},
		{"messages error after content", "key-a", "/v1/messages", apiKeyHeaders(keyA), toolMessagesBody(true, claudeTools, claudePrompt),
			Fault{Kind: FaultErrorAfterContent, AfterDeltas: 3}, []string{"message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta", "content_block_delta", "error"}},
		{"responses at capacity event", "codex", codexPath, chatgptHeaders(tokChatGPT), toolResponsesBody(true, codexTools, codexPrompt),
			Fault{Kind: FaultAtCapacityEvent}, []string{"response.created", "response.failed"}},
		{"responses at capacity after output", "codex", codexPath, chatgptHeaders(tokChatGPT), toolResponsesBody(true, codexTools, codexPrompt),
			Fault{Kind: FaultAtCapacityAfterOutput}, []string{"response.created", "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta", "response.failed"}},
		{"chat at capacity after output", "oai", chatURL, openAIKeyHeaders(keyOpenAI), toolChatBody(true, chatTools, chatPrompt),
			Fault{Kind: FaultAtCapacityAfterOutput}, []string{"role", "head", "arguments", "error"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := b.sim.AddFaults(tc.acct, tc.fault); err != nil {
				t.Fatal(err)
			}
			resp, data := b.call(t, "POST", tc.path, tc.h, tc.body)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, data)
			}
			var got []string
			var pieces strings.Builder
			if tc.path == chatURL {
				for _, p := range chatLines(t, data) {
					var ch struct {
						Error   json.RawMessage  `json:"error"`
						Choices []chatChoiceJSON `json:"choices"`
					}
					json.Unmarshal([]byte(p), &ch) //nolint:errcheck // an error line has no choices
					switch {
					case ch.Error != nil:
						got = append(got, "error")
					case ch.Choices[0].Delta.Role == "assistant":
						got = append(got, "role")
					case ch.Choices[0].Delta.ToolCalls[0].ID != "":
						got = append(got, "head")
					default:
						got = append(got, "arguments")
						pieces.WriteString(*ch.Choices[0].Delta.ToolCalls[0].Function.Arguments)
					}
				}
			} else {
				events, err := readEvents(strings.NewReader(string(data)))
				if err != nil {
					t.Fatalf("%v in %s", err, data)
				}
				got = eventNames(events)
				for _, e := range events {
					var d struct {
						Delta json.RawMessage `json:"delta"`
					}
					json.Unmarshal([]byte(e.data), &d) //nolint:errcheck // checked by readEvents
					var jd jsonDelta
					var s string
					switch {
					case json.Unmarshal(d.Delta, &s) == nil:
						pieces.WriteString(s)
					case json.Unmarshal(d.Delta, &jd) == nil && jd.Type == "input_json_delta":
						pieces.WriteString(jd.PartialJSON)
					}
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("events %v, want %v", got, tc.want)
			}
			if p := pieces.String(); strings.Contains(tc.name, "after") && !strings.HasPrefix(p, `{"`) {
				t.Errorf("pieces before the error %q, want the start of the arguments", p)
			}
			if a := b.nextAttempt(t); a.Outcome != tc.fault.Kind || a.Status != 200 {
				t.Errorf("attempt %+v", a)
			}
			// The fault is used up: the same request now gets its tool call.
			if _, data := b.call(t, "POST", tc.path, tc.h, tc.body); !isToolAnswer(t, data) {
				t.Errorf("after the fault: %s", data)
			}
			b.nextAttempt(t)
		})
	}
	// Without a stream, a tool request gets the same 529 as a text one.
	if err := b.sim.AddFaults("key-a", Fault{Kind: FaultOverloaded}); err != nil {
		t.Fatal(err)
	}
	resp, data := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), toolMessagesBody(false, claudeTools, claudePrompt))
	wantError(t, resp, data, statusOverloaded, "overloaded_error", "Overloaded")
}

// TestToolInput: a tool's input is built from its schema's required
// properties with harmless values.
func TestToolInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, schema, want string
	}{
		{"Claude Code Bash", `{"type":"object","properties":{"command":{"type":"string"},"timeout":{"type":"number"},"description":{"type":"string"}},"required":["command"]}`,
			`{"command":"echo weir-sim","description":"Print weir-sim"}`},
		{"Codex shell", `{"type":"object","properties":{"command":{"type":"array","items":{"type":"string"}},"workdir":{"type":"string"}},"required":["command"]}`,
			`{"command":["echo","weir-sim"]}`},
		{"Codex shell_command", `{"type":"object","properties":{"command":{"type":"string"},"workdir":{"type":"string"}},"required":["command"]}`,
			`{"command":"echo weir-sim"}`},
		{"Codex exec_command", `{"type":"object","properties":{"cmd":{"type":"string"}},"required":["cmd"]}`, `{"cmd":"echo weir-sim"}`},
		{"Read", `{"type":"object","properties":{"file_path":{"type":"string"}},"required":["file_path"]}`, `{"file_path":"README.md"}`},
		{"LS", `{"type":"object","properties":{"path":{"type":"string"},"ignore":{"type":"array"}},"required":["path"]}`, `{"path":"."}`},
		{"nested", `{"type":"object","properties":{"plan":{"type":"array","items":{"type":"object","properties":{"step":{"type":"string"},"status":{"enum":["pending","done"]}},"required":["step","status"]}}},"required":["plan"]}`,
			`{"plan":[{"status":"pending","step":"weir-sim"}]}`},
		{"kinds", `{"type":"object","properties":{"n":{"type":"integer"},"f":{"type":"number"},"b":{"type":"boolean"},"s":{"type":["null","string"]},"c":{"const":{"k":1}},"a":{"anyOf":[{"type":"boolean"},{"type":"string"}]},"o":{"oneOf":[{"type":"object"}]},"l":{"type":"array"},"z":{"type":"null"}},"required":["n","f","b","s","c","a","o","l","z","undeclared"]}`,
			`{"a":false,"b":false,"c":{"k":1},"f":1,"l":[],"n":1,"o":{},"s":"weir-sim","undeclared":"weir-sim","z":null}`},
		{"no schema", ``, `{}`},
		{"not an object", `"string"`, `{}`},
		{"boolean property schema", `{"type":"object","properties":{"x":true},"required":["x"]}`, `{"x":"weir-sim"}`},
	} {
		if got := toolInput(json.RawMessage(tc.schema)); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
