package sim

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// A request that offers tools is answered with a call of one of them
// instead of text, until its turn has had as many tool results as the
// account allows: an agent's task then takes several requests, as it does
// against the real API, and each of them meets the account's faults.

// defaultToolCallsPerTurn is how many tool calls a turn gets before the
// text answer, unless the script says otherwise.
const defaultToolCallsPerTurn = 3

// defaultPreferTools are the tools called first when a request offers
// them, in this order: Claude Code's shell and read-only file tools,
// Codex's shell tools, then Codex's code-mode exec (the custom tool that
// runs the nested tools from JavaScript, all that Codex 0.171 offers its
// default model besides a few function tools). A request offering none of
// them gets its first tool called.
var defaultPreferTools = []string{"Bash", "Read", "LS", "Glob", "exec_command", "shell_command", "shell", "exec"}

// toolWire is the wire format a request's tools and conversation are in.
type toolWire int

const (
	toolWireMessages  toolWire = iota // Anthropic: tools[].input_schema, tool_result blocks
	toolWireResponses                 // OpenAI Responses: function tools, *_call_output items
	toolWireChat                      // Chat Completions: tools[].function, role "tool" messages
)

func (sf openAISurface) toolWire() toolWire {
	if sf == surfaceChat {
		return toolWireChat
	}
	return toolWireResponses
}

// toolSettings is how an account answers requests that offer tools.
type toolSettings struct {
	perTurn int      // tool calls in a turn before the text answer; 0: none
	prefer  []string // tool names called first, in order
}

// defaultToolSettings are the settings of a script that sets none.
var defaultToolSettings = toolSettings{perTurn: defaultToolCallsPerTurn, prefer: defaultPreferTools}

// override is ts with the scripted fields that are set (nil and empty
// are not); the names are copied, since the script belongs to the caller.
func (ts toolSettings) override(perTurn *int, prefer []string) toolSettings {
	if perTurn != nil {
		ts.perTurn = *perTurn
	}
	if len(prefer) > 0 {
		ts.prefer = slices.Clone(prefer)
	}
	return ts
}

// validateToolSettings reports the problems of tool_calls_per_turn and
// prefer_tools, each name prefixed by prefix ("" or "accounts[0].").
func validateToolSettings(prefix string, perTurn *int, prefer []string) []error {
	var errs []error
	if perTurn != nil && *perTurn < 0 {
		errs = append(errs, fmt.Errorf("%stool_calls_per_turn: %d is negative (0 turns tool calls off)", prefix, *perTurn))
	}
	for i, name := range prefer {
		if name == "" {
			errs = append(errs, fmt.Errorf("%sprefer_tools[%d]: empty tool name", prefix, i))
		}
	}
	return errs
}

// toolCall is the tool call a request is answered with.
type toolCall struct {
	name      string
	namespace string // the Responses namespace that declares the tool, if any
	custom    bool   // a Responses custom tool: args is its freeform input
	args      string // the input (arguments) as a JSON object, or a custom tool's text
	callID    string // toolu_… on Messages, call_… on the OpenAI wires
}

func (tc *toolCall) outputTokens() int { return approxTokens(len(tc.args)) }

// pieces splits the arguments for a stream of n deltas (fewer when they
// are shorter).
func (tc *toolCall) pieces(n int) []string { return splitRunes(tc.args, n) }

// planToolCall makes the tool call the request is answered with, if any:
// the request offers a tool and does not turn tools off with tool_choice,
// its conversation waits for the assistant, and its turn has had fewer
// tool results than the account allows. Otherwise x.tool stays nil and
// the answer is text. The model named plays no part.
func (x *exchange) planToolCall(w toolWire) {
	if x.acct == nil || x.acct.tools.perTurn == 0 {
		return
	}
	tools, inInput := offeredTools(x.req, w)
	none, forced := toolChoice(x.req.toolChoice)
	results, waiting, prompted := turnResults(x.req.conversation, w)
	if w == toolWireResponses {
		// A continued conversation keeps its earlier input items, the
		// tools they offered among them (Codex over its WebSocket sends
		// its additional_tools once, then only the items since).
		if x.req.previousResponse != "" {
			prev := x.s.turn(x.req.previousResponse)
			if !prompted {
				results += prev.results
			}
			inInput = slices.Concat(prev.tools, inInput)
			tools = append(tools, prev.tools...)
		}
		if len(tools) == 0 {
			return
		}
		x.respID = newID("resp_", x.s.now())
		x.s.rememberTurn(x.respID, turn{results: results, tools: compactTools(inInput)})
	}
	if len(tools) == 0 || none || !waiting || results >= x.acct.tools.perTurn {
		return
	}
	t := pickTool(tools, forced, x.acct.tools.prefer)
	now := x.s.now()
	x.tool = &toolCall{name: t.name, namespace: t.namespace, custom: t.custom, args: t.args(), callID: newID("call_", now)}
	switch {
	case w == toolWireMessages:
		x.tool.callID = newID("toolu_", now)
	case w == toolWireResponses && t.custom:
		x.itemID = newID("ctc_", now)
	case w == toolWireResponses:
		x.itemID = newID("fc_", now)
	}
}

// offeredTool is a tool a request offers the model.
type offeredTool struct {
	name      string
	namespace string          // the Responses namespace that declares it, if any
	custom    bool            // a Responses custom tool (freeform input, no schema)
	schema    json.RawMessage // the input's JSON Schema
	input     string          // the call's input once made (compactTools); "": from the schema
}

// args is the input of a call of the tool.
func (t offeredTool) args() string {
	switch {
	case t.input != "":
		return t.input
	case t.custom:
		return customInput(t.name)
	}
	return toolInput(t.schema)
}

// compactTools are the tools, each once, with each call's input made and
// the schema dropped, to be kept for later requests without the schemas'
// size.
func compactTools(tools []offeredTool) []offeredTool {
	var out []offeredTool
	for _, t := range tools {
		if !slices.ContainsFunc(out, func(o offeredTool) bool { return o.name == t.name && o.namespace == t.namespace }) {
			out = append(out, offeredTool{name: t.name, namespace: t.namespace, custom: t.custom, input: t.args()})
		}
	}
	return out
}

// toolDefinition is an entry of a request's tools, in any wire's form.
type toolDefinition struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	InputSchema json.RawMessage `json:"input_schema"` // Messages
	Parameters  json.RawMessage `json:"parameters"`   // Responses
	Function    struct {        // Chat Completions
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
	Tools json.RawMessage `json:"tools"` // a Responses namespace's own tools
}

// offeredTools reads a request's tools in its wire's form: its tools and,
// on Responses, those of its input's additional_tools items (where Codex
// 0.171 puts its tools for its default model, with no top-level tools);
// inInput are the latter. Only tools the client runs itself count: server
// tools on Messages (a versioned type such as web_search_20250305) and
// OpenAI's built-in tools are skipped. Responses function and custom tools
// count, also inside a namespace.
func offeredTools(req messagesRequest, w toolWire) (tools, inInput []offeredTool) {
	tools = readTools(req.tools, w, "")
	if w == toolWireResponses {
		var items []struct {
			Type  string          `json:"type"`
			Tools json.RawMessage `json:"tools"`
		}
		json.Unmarshal(req.conversation, &items) //nolint:errcheck // a string input has no items
		for _, it := range items {
			if it.Type == "additional_tools" {
				inInput = append(inInput, readTools(it.Tools, w, "")...)
			}
		}
	}
	return append(tools, inInput...), inInput
}

// readTools reads a list of tool definitions in the wire's form; ns is the
// Responses namespace that holds the list ("" at the top).
func readTools(raw json.RawMessage, w toolWire, ns string) []offeredTool {
	var list []toolDefinition
	json.Unmarshal(raw, &list) //nolint:errcheck // what parses is offered; the rest is not
	var tools []offeredTool
	for _, t := range list {
		var ot offeredTool
		switch {
		case w == toolWireMessages && (t.Type == "" || t.Type == "custom"):
			ot = offeredTool{name: t.Name, schema: t.InputSchema}
		case w == toolWireResponses && t.Type == "function":
			ot = offeredTool{name: t.Name, namespace: ns, schema: t.Parameters}
		case w == toolWireResponses && t.Type == "custom":
			ot = offeredTool{name: t.Name, namespace: ns, custom: true}
		case w == toolWireResponses && t.Type == "namespace" && t.Name != "":
			tools = append(tools, readTools(t.Tools, w, t.Name)...)
		case w == toolWireChat && t.Type == "function":
			ot = offeredTool{name: t.Function.Name, schema: t.Function.Parameters}
		}
		if ot.name != "" {
			tools = append(tools, ot)
		}
	}
	return tools
}

// codeModeInput is the input of a custom tool named exec: Codex's code
// mode, whose input is JavaScript that calls the nested tools. It runs
// "echo weir-sim" through exec_command and returns the output.
const codeModeInput = `const r = await tools.exec_command({cmd: "echo weir-sim"}); text(r.output);`

// customInput is a harmless freeform input for a Responses custom tool:
// codeModeInput for exec, else "weir-sim" (which a client's grammar, such
// as apply_patch's, may refuse; the refusal is the tool's result).
func customInput(name string) string {
	if name == "exec" {
		return codeModeInput
	}
	return "weir-sim"
}

// toolChoice reads tool_choice in any wire's form: "none" or
// {"type":"none"} turns tools off, and a named tool ({"type":"tool",
// "name":…}, {"type":"function","name":…} or {"type":"function",
// "function":{"name":…}}) is called instead of the preferred ones.
func toolChoice(raw json.RawMessage) (none bool, name string) {
	var mode string
	if json.Unmarshal(raw, &mode) == nil {
		return mode == "none", ""
	}
	var c struct {
		Type     string `json:"type"`
		Name     string `json:"name"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	json.Unmarshal(raw, &c) //nolint:errcheck // an unreadable choice is no choice
	return c.Type == "none", cmp.Or(c.Name, c.Function.Name)
}

// pickTool is the tool to call: the forced one, else the first preferred
// one offered, else the first offered.
func pickTool(tools []offeredTool, forced string, prefer []string) offeredTool {
	for _, name := range slices.Concat([]string{forced}, prefer) {
		if i := slices.IndexFunc(tools, func(t offeredTool) bool { return t.name == name }); i >= 0 {
			return tools[i]
		}
	}
	return tools[0]
}

// turnResults counts the tool results in a conversation since its last
// prompt (a user message that answers no tool call), and reports whether
// the conversation waits for the assistant: it ends with a prompt or a
// tool result. A Responses input that is a plain string is one prompt.
//
// prompted says a prompt started a turn within raw.
func turnResults(raw json.RawMessage, w toolWire) (results int, waiting, prompted bool) {
	var prompt string
	if w == toolWireResponses && json.Unmarshal(raw, &prompt) == nil {
		return 0, true, true
	}
	var items []struct {
		Type    string          `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(raw, &items) != nil {
		return 0, false, false
	}
	for _, it := range items {
		if it.Role == "system" || it.Role == "developer" {
			// Instructions between the turns (Claude Code sends a system
			// message after the prompt) leave the conversation waiting.
			continue
		}
		n := 0
		switch {
		case w == toolWireMessages && it.Role == "user":
			n = countToolResults(it.Content)
		case w == toolWireResponses && strings.HasSuffix(it.Type, "_call_output"):
			n = 1
		case w == toolWireChat && it.Role == "tool":
			n = 1
		}
		isPrompt := it.Role == "user" && n == 0
		if isPrompt {
			results, prompted = 0, true
		}
		results += n
		waiting = isPrompt || n > 0
	}
	return results, waiting, prompted
}

// maxTurns bounds the remembered Responses turns: past it they start over
// (a continued conversation then counts from its latest items only).
const maxTurns = 10000

// turn is what a Responses answer leaves for a request that continues it.
type turn struct {
	results int           // the tool results of its turn so far
	tools   []offeredTool // offered by its conversation's input items, compacted
}

// rememberTurn records the turn that Responses answer id ends.
func (s *Server) rememberTurn(id string, t turn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.turns == nil || len(s.turns) >= maxTurns {
		s.turns = map[string]turn{}
	}
	s.turns[id] = t
}

// turn is the turn that Responses answer id ended, zero when it is
// unknown.
func (s *Server) turn(id string) turn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.turns[id]
}

// countToolResults counts the tool_result blocks of a Messages user
// message's content (0 for plain text).
func countToolResults(content json.RawMessage) int {
	var blocks []struct {
		Type string `json:"type"`
	}
	json.Unmarshal(content, &blocks) //nolint:errcheck // text content has no blocks
	n := 0
	for _, b := range blocks {
		if b.Type == "tool_result" {
			n++
		}
	}
	return n
}

// jsonSchema is the part of a tool's JSON Schema that toolInput reads.
// Parts that do not parse (a boolean schema, tuple items) are left out.
type jsonSchema struct {
	Type       json.RawMessage       `json:"type"` // a name, or a list of names
	Properties map[string]jsonSchema `json:"properties"`
	Required   []string              `json:"required"`
	Items      *jsonSchema           `json:"items"`
	Enum       []json.RawMessage     `json:"enum"`
	Const      json.RawMessage       `json:"const"`
	AnyOf      []jsonSchema          `json:"anyOf"`
	OneOf      []jsonSchema          `json:"oneOf"`
}

// toolInput is a harmless input for a tool with this schema: its required
// properties and, where the schema has one, a description (Claude Code's
// Bash shows it to the user). It is always a JSON object.
func toolInput(schema json.RawMessage) string {
	var s jsonSchema
	json.Unmarshal(schema, &s) //nolint:errcheck // what parses is used; an unreadable schema gets {}
	obj := s.object()
	if d, ok := s.Properties["description"]; ok && d.typeName() == "string" {
		obj["description"] = exampleString("description")
	}
	b, _ := json.Marshal(obj)
	return string(b)
}

// object is an example of an object schema: its required properties.
func (s jsonSchema) object() map[string]any {
	obj := map[string]any{}
	for _, p := range s.Required {
		obj[p] = s.Properties[p].example(p)
	}
	return obj
}

// example is a harmless value of the schema for a property named name:
// the const or first enum value, the first alternative, else by type:
// strings by the property's name (see exampleString), numbers 1, booleans
// false, a command array ["echo","weir-sim"], other arrays one example
// item.
func (s jsonSchema) example(name string) any {
	switch {
	case s.Const != nil:
		return s.Const
	case len(s.Enum) > 0:
		return s.Enum[0]
	case len(s.AnyOf) > 0:
		return s.AnyOf[0].example(name)
	case len(s.OneOf) > 0:
		return s.OneOf[0].example(name)
	}
	switch s.typeName() {
	case "object":
		return s.object()
	case "array":
		switch {
		case isCommand(name) && (s.Items == nil || s.Items.typeName() == "string"):
			return []string{"echo", "weir-sim"}
		case s.Items == nil:
			return []any{}
		}
		return []any{s.Items.example(name)}
	case "integer", "number":
		return 1
	case "boolean":
		return false
	case "null":
		return nil
	}
	return exampleString(name)
}

// typeName is the schema's type, the first that is not null of a list.
func (s jsonSchema) typeName() string {
	var name string
	if json.Unmarshal(s.Type, &name) == nil {
		return name
	}
	var names []string
	json.Unmarshal(s.Type, &names) //nolint:errcheck // no type: a string is assumed
	for _, n := range names {
		if n != "null" {
			return n
		}
	}
	return ""
}

// exampleString is a harmless string for a property: a command that only
// prints, a relative file path, the current directory for other paths.
func exampleString(name string) string {
	n := strings.ToLower(name)
	switch {
	case isCommand(n):
		return "echo weir-sim"
	case n == "description":
		return "Print weir-sim"
	case strings.Contains(n, "file"):
		return "README.md"
	case strings.Contains(n, "path") || strings.Contains(n, "dir") || n == "cwd":
		return "."
	}
	return "weir-sim"
}

func isCommand(name string) bool {
	n := strings.ToLower(name)
	return n == "command" || n == "cmd"
}

// rawJSON is JSON written as it is, such as a tool call's input.
type rawJSON string

func (r rawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }

func (r *rawJSON) UnmarshalJSON(b []byte) error {
	*r = rawJSON(b)
	return nil
}

// messagesBlock is the call's tool_use content block; start is the block
// as content_block_start opens it, with an empty input.
func (tc *toolCall) messagesBlock(start bool) contentBlock {
	input := rawJSON(tc.args)
	if start {
		input = "{}"
	}
	return contentBlock{Type: "tool_use", ID: tc.callID, Name: tc.name, Input: input}
}

// Messages stream events of a tool call.
type (
	inputJSONDeltaEvent struct {
		Type  string    `json:"type"`
		Index int       `json:"index"`
		Delta jsonDelta `json:"delta"`
	}
	jsonDelta struct {
		Type        string `json:"type"`
		PartialJSON string `json:"partial_json"`
	}
)

// functionCall is the Responses function_call output item.
type functionCall struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	Status    string `json:"status"`
	Arguments string `json:"arguments"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
}

// customToolCall is the Responses custom_tool_call output item (it has no
// status).
type customToolCall struct {
	ID        string `json:"id"`
	Type      string `json:"type"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
	Input     string `json:"input"`
}

// toolCallItem is the call as a Responses output item, a function_call
// or a custom_tool_call; the arguments (input) are there once it is
// completed.
func (x *exchange) toolCallItem(status string) any {
	args := ""
	if status == "completed" {
		args = x.tool.args
	}
	if x.tool.custom {
		return customToolCall{ID: x.itemID, Type: "custom_tool_call", CallID: x.tool.callID, Name: x.tool.name, Namespace: x.tool.namespace, Input: args}
	}
	return functionCall{ID: x.itemID, Type: "function_call", Status: status, CallID: x.tool.callID, Name: x.tool.name, Namespace: x.tool.namespace, Arguments: args}
}

// responsesToolEvents are the stream events of the call's input: its
// deltas and its done event, and the field the done event carries it in.
func (tc *toolCall) responsesToolEvents() (delta, done, field string) {
	if tc.custom {
		return "response.custom_tool_call_input.delta", "response.custom_tool_call_input.done", "input"
	}
	return "response.function_call_arguments.delta", "response.function_call_arguments.done", "arguments"
}

// Chat Completions shapes of a tool call.
type (
	chatToolCall struct {
		Index    *int             `json:"index,omitempty"` // streams only
		ID       string           `json:"id,omitempty"`
		Type     string           `json:"type,omitempty"`
		Function chatFunctionCall `json:"function"`
	}
	chatFunctionCall struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	}
)

// chatCall is the whole call, as a non-streamed message carries it.
func (tc *toolCall) chatCall() chatToolCall {
	return chatToolCall{ID: tc.callID, Type: "function", Function: chatFunctionCall{Name: tc.name, Arguments: tc.args}}
}

// chatDeltas are the stream deltas of the call: one naming it (id, type,
// name, no arguments yet), then the arguments in up to n pieces. The
// role-only chunk before them is no output, so that a fault before output
// still comes before any of the call.
func (tc *toolCall) chatDeltas(n int) []chatMessage {
	head := chatToolCall{Index: new(int), ID: tc.callID, Type: "function", Function: chatFunctionCall{Name: tc.name}}
	deltas := []chatMessage{{ToolCalls: []chatToolCall{head}}}
	for _, p := range tc.pieces(n) {
		deltas = append(deltas, chatMessage{ToolCalls: []chatToolCall{{Index: new(int), Function: chatFunctionCall{Arguments: p}}}})
	}
	return deltas
}

// outputTokens is the answer's output token count: the text reply's, or
// the tool call's.
func (x *exchange) outputTokens() int {
	if x.tool != nil {
		return x.tool.outputTokens()
	}
	return x.s.reply.outputTokens
}

// clonePtr is a copy of *p, or nil.
func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
