package dataplane

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
)

// TestParseHead: weir reads exactly the fields an upstream reads, and
// refuses a body that could mean two things.
func TestParseHead(t *testing.T) {
	t.Parallel()
	ok := []struct {
		body           string
		model          string
		stream         bool
		userID, pcKey  string
		noModelPresent bool
	}{
		{body: `{"model":"m","stream":true,"metadata":{"user_id":"u"},"prompt_cache_key":"k"}`, model: "m", stream: true, userID: "u", pcKey: "k"},
		// Escaped keys are the keys they spell, as every parser reads them.
		{body: `{"mod\u0065l":"m"}`, model: "m"},
		{body: " \n{\"model\":\"m\",\"messages\":[{\"Model\":1,\"model\":2,\"model\":3}],\"Messages\":[]} \n", model: "m"},
		{body: `{"model":"m","metadata":null,"stream":false}`, model: "m"},
		{body: `{"model":null}`, noModelPresent: true},
		{body: `{"max_tokens":8}`, noModelPresent: true},
		// Unknown keys may differ only in case: weir reads neither.
		{body: `{"model":"m","Foo":1,"foo":2}`, model: "m"},
		{body: `{"model":"m","metadata":{"user_id":"u","USER":"x","session":{"a":1,"a":2}}}`, model: "m", userID: "u"},
	}
	for _, tt := range ok {
		h, err := parseHead([]byte(tt.body))
		if err != nil {
			t.Errorf("%s: %v", tt.body, err)
			continue
		}
		if tt.noModelPresent != (h.model == nil) || h.model != nil && *h.model != tt.model ||
			h.stream != tt.stream || h.userID != tt.userID || h.promptCacheKey != tt.pcKey {
			t.Errorf("%s: %+v", tt.body, h)
		}
	}
	refused := []struct{ body, want string }{
		{`{"model":"claude-opus-4-1","MODEL":"claude-haiku-4-5"}`, `"MODEL": weir reads "model"`},
		{`{"model":"claude-opus-4-1","model":"claude-haiku-4-5"}`, `"model" more than once`},
		{`{"Model":"claude-haiku-4-5"}`, `"Model": weir reads "model"`},
		// Go's encoding/json folds the Kelvin sign and the long s too.
		{`{"model":"m","ſtream":true}`, `weir reads "stream"`},
		{`{"model":"m","Stream":true}`, `weir reads "stream"`},
		{`{"model":"m","Metadata":{}}`, `weir reads "metadata"`},
		{`{"model":"m","prompt_cache_KEY":"k"}`, `weir reads "prompt_cache_key"`},
		{`{"model":"m","metadata":{"user_id":"a","User_Id":"b"}}`, `"metadata.User_Id": weir reads "metadata.user_id"`},
		{`{"model":"m","metadata":{"user_id":"a","user_id":"b"}}`, `"metadata.user_id" more than once`},
		{`{"model":"m","metadata":{"x":1,"x":2}}`, `"metadata.x" more than once`},
		{`{"model":"m","messages":[],"messages":[]}`, `"messages" more than once`},
		{`[1,2]`, "request body must be a JSON object"},
		{`"model"`, "request body must be a JSON object"},
		{`42`, "request body must be a JSON object"},
		{`null`, "request body must be a JSON object"},
		{`{"model":42}`, "field model has the wrong type"},
		{`{"model":"m","stream":"yes"}`, "field stream has the wrong type"},
		{`{"model":"m","metadata":[]}`, "field metadata has the wrong type"},
		{`{"model":"m","metadata":{"user_id":7}}`, "field metadata.user_id has the wrong type"},
	}
	for _, tt := range refused {
		_, err := parseHead([]byte(tt.body))
		var he headError
		if !errors.As(err, &he) || !strings.Contains(he.Error(), tt.want) {
			t.Errorf("%s: %v, want a refusal with %q", tt.body, err, tt.want)
		}
	}
	for _, bad := range []string{``, `{`, `{"model":"m",`, `{"model":"m"} x`, `{"model":"m"}{}`, `{"model":"m","x":[1,}`, `{"model" "m"}`} {
		_, err := parseHead([]byte(bad))
		var he headError
		if err == nil || errors.As(err, &he) {
			t.Errorf("%q: %v, want a syntax error", bad, err)
		}
	}
}

// agentBody is a request body the size of n bytes or a little more,
// shaped like Claude Code's with a long context: a system prompt, tool
// definitions with JSON schemas, and a conversation of text, tool calls
// and tool results holding source files (escaped quotes and new lines).
func agentBody(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"model":"claude-sonnet-4-5-20250929","max_tokens":32000,"stream":true,`)
	b.WriteString(`"metadata":{"user_id":"user_8c1f2e3d4b5a69788796a5b4c3d2e1f0_account__session_3f0b9a4e-6c2d-4b8a-9e1f-7d5c3a2b1e0f"},`)
	b.WriteString(`"system":[{"type":"text","text":"You are Claude Code, Anthropic's official CLI for Claude.","cache_control":{"type":"ephemeral"}},`)
	b.WriteString(`{"type":"text","text":"` + strings.Repeat(`You are an interactive CLI tool that helps users with software engineering tasks.\n`, 200) + `"}],`)
	b.WriteString(`"tools":[`)
	for i := range 40 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"name":"Tool` + strconv.Itoa(i) + `","description":"` + strings.Repeat("Does a thing with the file system. ", 30) +
			`","input_schema":{"type":"object","properties":{"file_path":{"type":"string","description":"The absolute path"},` +
			`"offset":{"type":"number"},"limit":{"type":"number"},"flags":{"type":"array","items":{"type":"string","enum":["a","b","c"]}}},` +
			`"required":["file_path"],"additionalProperties":false,"$schema":"http://json-schema.org/draft-07/schema#"}}`)
	}
	b.WriteString(`],"messages":[`)
	src := strings.Repeat(`func (s *Server) handle(w http.ResponseWriter, r *http.Request) {\n\tif r.Method != \"POST\" {\n\t\treturn\n\t}\n}\n`, 40)
	for i := 0; b.Len() < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		id := `"toolu_` + strconv.Itoa(i) + `"`
		b.WriteString(`{"role":"user","content":[{"type":"tool_result","tool_use_id":` + id + `,"content":"` + src + `"},{"type":"text","text":"Now fix the handler."}]},`)
		b.WriteString(`{"role":"assistant","content":[{"type":"text","text":"I'll read the file first."},` +
			`{"type":"tool_use","id":` + id + `,"name":"Read","input":{"file_path":"/home/dev/src/server.go","offset":` + strconv.Itoa(i) + `,"limit":200}}]}`)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// BenchmarkRequestHead: the head scan (what parseHead takes for a clean
// body) against the decoder it falls back to and json.Unmarshal into the
// head's struct (which reads keys loosely), on agent bodies of 1 MiB and
// 8 MiB.
func BenchmarkRequestHead(b *testing.B) {
	for _, size := range []int{1 << 20, 8 << 20} {
		body := agentBody(size)
		name := strconv.Itoa(size>>20) + "MiB"
		b.Run("scan/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if h, err := parseHead(body); err != nil || h.model == nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("decoder/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if h, err := parseHeadDecoder(body); err != nil || h.model == nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("unmarshal/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				var head struct {
					Model    *string `json:"model"`
					Stream   bool    `json:"stream"`
					Metadata struct {
						UserID string `json:"user_id"`
					} `json:"metadata"`
					PromptCacheKey string `json:"prompt_cache_key"`
				}
				if err := json.Unmarshal(body, &head); err != nil || head.Model == nil {
					b.Fatal(err)
				}
			}
		})
	}
}
