// Package translate turns a request and its answer from one provider's
// wire into another's: Anthropic Messages ⇄ OpenAI Chat Completions and
// Messages ⇄ OpenAI Responses, whole and streamed, in both directions.
// It is pure (bytes in, bytes out) so that every translation is tested
// on recorded exchanges and fuzzed without a server. What the target
// cannot carry is refused with an error naming it (Unsupported), never
// dropped silently: what a translation leaves out because the target
// has no place for it and it changes nothing the client relies on (a
// previous turn's thinking, which no target reads; an output cap the
// Codex backend sets itself) is named in Request.Dropped.
package translate

import "fmt"

// Request is a translated request.
type Request struct {
	// Body is the target's request body.
	Body []byte
	// Dropped names the client's fields the target has no place for, left
	// out (the data plane says so in a response header).
	Dropped []string
	// CustomTools are the client's freeform tools (a Responses "custom"
	// tool, whose input is one string) by name: the answer's calls of
	// them go back as custom tool calls, not function calls.
	CustomTools map[string]bool
	// Namespaced are the client's tools declared in a namespace (a
	// Responses "namespace" tool's, as Codex groups some of its tools), by
	// the one name the target knows each by (namespacedName): the
	// answer's calls of them go back with their namespace.
	Namespaced map[string]ToolName
	// IncludeUsage says a Chat Completions client asked its stream's
	// usage (stream_options.include_usage): the stream then ends with a
	// usage chunk, which an upstream that always reports usage does not
	// tell it to send.
	IncludeUsage bool
}

// Stream translates an upstream stream into the client's, event by
// event: each call returns the client's events for one upstream event
// (none, one or several, concatenated, each ending in its blank line).
type Stream interface {
	// Event translates the upstream event named name ("" when it has
	// none) with data (its data: fields joined).
	Event(name string, data []byte) ([]byte, error)
}

// Unsupported is a request feature the target wire lacks: the client is
// answered with a 400 naming it.
type Unsupported struct {
	Feature string
}

func (u *Unsupported) Error() string {
	return "this request uses " + u.Feature + ", which the serving account's API does not support"
}

func unsupported(format string, args ...any) error {
	return &Unsupported{Feature: fmt.Sprintf(format, args...)}
}

// ToolName is a client's tool's name, in its namespace ("" for none).
type ToolName struct{ Namespace, Name string }

// namespacedName is the one name a namespace's tool is known by on a wire
// without namespaces: namespace__name (tool names may hold letters,
// digits, _ and -).
func namespacedName(namespace, name string) string { return namespace + "__" + name }

// clientName is the name, in its namespace, of the tool the target knows
// as name.
func (r Request) clientName(name string) ToolName {
	if tn, ok := r.Namespaced[name]; ok {
		return tn
	}
	return ToolName{Name: name}
}
