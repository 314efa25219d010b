package translate

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// Recorded exchanges (testdata/recorded): the real clients' requests,
// captured from Claude Code 2.1.197 and Codex CLI 0.171.0 against a
// capturing server (their ids zeroed), and weir's simulator's answers on
// the Codex and Chat Completions wires, which it speaks as the providers
// do.

func recorded(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "recorded", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Claude Code's real turn (24 tools, adaptive thinking, the output
// effort, context management, a system message after the prompt,
// metadata naming its device) onto Codex and onto Chat Completions: every
// tool carried as a function, the system message in its place, the
// effort carried where the target has one and what is left out named,
// nothing of the client's identity passed on.
func TestRecordedClaudeCodeRequest(t *testing.T) {
	t.Parallel()
	in := recorded(t, "claude_code_2.1.197.json")
	var src struct {
		Tools    []json.RawMessage `json:"tools"`
		Messages []struct {
			Role string `json:"role"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(in, &src); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name        string
		translate   func([]byte, string, string) (Request, error)
		dropped     []string
		toolsKey    string
		systemRoles []string
	}{
		{"responses", MessagesToResponses, []string{"max_tokens", "metadata", "context_management"}, "tools", []string{"developer"}},
		{"chat", MessagesToChat, []string{"context_management", "output_config", "thinking", "metadata"}, "tools", []string{"system"}},
	} {
		req, err := c.translate(in, "gpt-5-codex", "weir-k")
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !reflect.DeepEqual(req.Dropped, c.dropped) {
			t.Errorf("%s: dropped %v, want %v", c.name, req.Dropped, c.dropped)
		}
		if strings.Contains(string(req.Body), "device_id") || strings.Contains(string(req.Body), "00000000-0000-4000-8000-000000000001") {
			t.Errorf("%s: the client's identity went on", c.name)
		}
		var out struct {
			Tools []struct {
				Type string `json:"type"`
			} `json:"tools"`
			Input     []map[string]any `json:"input"`
			Messages  []map[string]any `json:"messages"`
			Reasoning *struct {
				Effort string `json:"effort"`
			} `json:"reasoning"`
			Key string `json:"prompt_cache_key"`
		}
		if err := json.Unmarshal(req.Body, &out); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(out.Tools) != len(src.Tools) {
			t.Errorf("%s: %d tools, want all %d", c.name, len(out.Tools), len(src.Tools))
		}
		for _, tl := range out.Tools {
			if tl.Type != "function" {
				t.Errorf("%s: a tool of type %q", c.name, tl.Type)
			}
		}
		items := append(out.Input, out.Messages...)
		var roles []string
		for _, it := range items {
			roles = append(roles, it["role"].(string))
		}
		// The prompt, then Claude Code's system message where it stood.
		if n := len(roles); n < 2 || !slices.Contains(c.systemRoles, roles[n-1]) || roles[n-2] != "user" {
			t.Errorf("%s: roles %v, want the user's prompt then the system message", c.name, roles)
		}
		if out.Key != "weir-k" {
			t.Errorf("%s: prompt_cache_key %q", c.name, out.Key)
		}
		if c.name == "responses" && (out.Reasoning == nil || out.Reasoning.Effort != "high") {
			t.Errorf("responses: reasoning %+v, want the output effort, high", out.Reasoning)
		}
	}
}

// Codex's real first turn (developer instructions, the prompt, function
// tools, a namespace of tools, web search, reasoning summaries asked,
// encrypted reasoning included, its client metadata) onto Messages: the
// developer messages as the system prompt, the namespace's tools by their
// one names, web search left out and named, nothing of its metadata
// passed on, a conversation that starts with the user.
func TestRecordedCodexRequest(t *testing.T) {
	t.Parallel()
	in := recorded(t, "codex_0.171.0.json")
	req, err := ResponsesToMessagesRequest(in, "claude-sonnet-4-5", "weir-k")
	if err != nil {
		t.Fatal(err)
	}
	if err := checkMessagesBody(req.Body, "claude-sonnet-4-5"); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(req.Dropped, "tools[web_search]") {
		t.Errorf("dropped %v, want web search named", req.Dropped)
	}
	if len(req.Namespaced) == 0 {
		t.Error("no namespaced tool recorded")
	}
	var out struct {
		System []map[string]any `json:"system"`
		Tools  []struct {
			Name string `json:"name"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(req.Body, &out); err != nil {
		t.Fatal(err)
	}
	if len(out.System) < 2 {
		t.Errorf("system %d blocks, want the developer messages", len(out.System))
	}
	for flat, tn := range req.Namespaced {
		if !slices.ContainsFunc(out.Tools, func(tl struct {
			Name string `json:"name"`
		}) bool {
			return tl.Name == flat
		}) || flat != tn.Namespace+"__"+tn.Name {
			t.Errorf("namespaced tool %s (%+v) missing", flat, tn)
		}
	}
	if s := string(req.Body); strings.Contains(s, "client_metadata") || strings.Contains(s, "x-codex-installation-id") {
		t.Error("Codex's client metadata went on")
	}
}

// The simulator's Codex and Chat streams of a tool call and of text, as
// the Messages events Claude Code reads: message_start first, blocks
// opened and closed in order, the tool call's arguments whole, the stop
// reason and the usage last.
func TestRecordedStreamsToMessages(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		file, stop string
		stream     Stream
		tool       bool
	}{
		{"sim_codex_tool.sse", "tool_use", NewResponsesStream("coder", Request{}), true},
		{"sim_codex_text.sse", "end_turn", NewResponsesStream("coder", Request{}), false},
		{"sim_chat_tool.sse", "tool_use", NewChatStream("coder"), true},
	} {
		out, err := runStream(c.stream, recorded(t, c.file))
		if err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		names, data := sseEvents(t, out)
		if len(names) < 4 || names[0] != "message_start" || names[len(names)-1] != "message_stop" || names[len(names)-2] != "message_delta" {
			t.Fatalf("%s: events %v", c.file, names)
		}
		open, args := -1, ""
		var kinds []string
		for i, d := range data {
			switch names[i] {
			case "content_block_start":
				if open != -1 {
					t.Fatalf("%s: a block opened inside another", c.file)
				}
				open = int(d["index"].(float64))
				kinds = append(kinds, d["content_block"].(map[string]any)["type"].(string))
			case "content_block_delta":
				if int(d["index"].(float64)) != open {
					t.Fatalf("%s: a delta outside its block", c.file)
				}
				if p, ok := d["delta"].(map[string]any)["partial_json"].(string); ok {
					args += p
				}
			case "content_block_stop":
				open = -1
			}
		}
		md := data[len(data)-2]
		if stop := md["delta"].(map[string]any)["stop_reason"]; stop != c.stop {
			t.Errorf("%s: stop %v, want %s", c.file, stop, c.stop)
		}
		if u := md["usage"].(map[string]any); u["output_tokens"].(float64) == 0 || u["input_tokens"].(float64) == 0 {
			t.Errorf("%s: usage %v", c.file, u)
		}
		if c.tool != slices.Contains(kinds, "tool_use") || (c.tool && !json.Valid([]byte(args))) {
			t.Errorf("%s: blocks %v, arguments %q", c.file, kinds, args)
		}
	}
}
