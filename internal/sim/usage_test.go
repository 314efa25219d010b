package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// latestAttempt is the attempt log's latest entry, read once the answer
// is whole (its usage is logged before it is written).
func (b *bundle) latestAttempt(t *testing.T) Attempt {
	t.Helper()
	atts := b.sim.Attempts()
	if len(atts) == 0 {
		t.Fatal("no attempt logged")
	}
	return atts[len(atts)-1]
}

// cachedMessagesBody is a Messages request as Claude Code makes one: a
// system prompt and tools marked for caching, and the conversation so
// far (turns of user and assistant text, the last a user's).
func cachedMessagesBody(stream bool, turns ...string) string {
	var msgs []string
	for i, text := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, fmt.Sprintf(`{"role":%q,"content":[{"type":"text","text":%q}]}`, role, text))
	}
	return fmt.Sprintf(`{"model":%q,"max_tokens":1024,"stream":%t,`+
		`"system":[{"type":"text","text":%q,"cache_control":{"type":"ephemeral"}}],`+
		`"tools":[{"name":"Bash","description":"Runs a command","input_schema":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}],`+
		`"messages":[%s]}`, sonnet, stream, strings.Repeat("You are a careful coding agent. ", 40), strings.Join(msgs, ","))
}

// messagesUsage reads what a Messages answer reported, streamed or not,
// in the simulator's vocabulary; for a stream also message_start's.
func messagesUsage(t *testing.T, data []byte, stream bool) (got, atStart Usage) {
	t.Helper()
	toUsage := func(u usage) Usage {
		return Usage{InputTokens: u.InputTokens, OutputTokens: u.OutputTokens,
			CacheReadTokens: u.CacheReadInputTokens, CacheCreationTokens: u.CacheCreationInputTokens}
	}
	if !stream {
		return toUsage(decode[message](t, data).Usage), Usage{}
	}
	events, err := readEvents(strings.NewReader(string(data)))
	if err != nil {
		t.Fatalf("%v in %s", err, data)
	}
	var start messageStartEvent
	if err := json.Unmarshal([]byte(events[0].data), &start); err != nil || events[0].name != "message_start" {
		t.Fatalf("first event %s %s", events[0].name, events[0].data)
	}
	atStart, got = toUsage(start.Message.Usage), toUsage(start.Message.Usage)
	for _, e := range events {
		if e.name != "message_delta" {
			continue
		}
		var d struct {
			Usage map[string]int `json:"usage"`
		}
		if err := json.Unmarshal([]byte(e.data), &d); err != nil {
			t.Fatal(err)
		}
		if len(d.Usage) != 1 {
			t.Errorf("message_delta usage %v, want output_tokens only", d.Usage)
		}
		got.OutputTokens = d.Usage["output_tokens"]
	}
	return got, atStart
}

// TestMessagesPromptCache: a request that asks for caching writes its
// prefix (system, tools, every message but the last), the same request
// again reads it, the next turn reads it and writes what it adds, another
// account has its own cache, and a prefix unused for five minutes is
// gone; the answer reports it streamed (message_start) and not, and the
// attempt log has what was reported.
func TestMessagesPromptCache(t *testing.T) {
	t.Parallel()
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%t", stream), func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{ManualClock: true})
			post := func(h http.Header, body string) Usage {
				t.Helper()
				resp, data := b.call(t, "POST", "/v1/messages", h, body)
				if resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, data)
				}
				got, atStart := messagesUsage(t, data, stream)
				if stream && (atStart.InputTokens != got.InputTokens || atStart.CacheReadTokens != got.CacheReadTokens ||
					atStart.CacheCreationTokens != got.CacheCreationTokens || atStart.OutputTokens != 1) {
					t.Errorf("message_start usage %+v, want the input and cache fields of %+v and 1 output token", atStart, got)
				}
				if total := got.InputTokens + got.CacheReadTokens + got.CacheCreationTokens; total != approxTokens(len(body)) {
					t.Errorf("input %+v adds up to %d, want the body's %d", got, total, approxTokens(len(body)))
				}
				if got.OutputTokens <= 1 { // the tool call's (the request offers a tool)
					t.Errorf("output %d", got.OutputTokens)
				}
				if a := b.latestAttempt(t); a.Usage != got {
					t.Errorf("attempt log usage %+v, the answer's %+v", a.Usage, got)
				}
				return got
			}
			first := cachedMessagesBody(stream, "List the files.")
			// The prefix: system and tools (one message, none before it).
			var parts struct {
				System, Tools json.RawMessage
			}
			json.Unmarshal([]byte(first), &parts) //nolint:errcheck // made above
			prefix := (len(parts.System) + len(parts.Tools)) / 4

			u := post(apiKeyHeaders(keyA), first)
			if u.CacheReadTokens != 0 || u.CacheCreationTokens != prefix {
				t.Errorf("first request %+v, want %d written, nothing read", u, prefix)
			}
			u = post(apiKeyHeaders(keyA), first)
			if u.CacheReadTokens != prefix || u.CacheCreationTokens != 0 {
				t.Errorf("the same request again %+v, want %d read, nothing written", u, prefix)
			}
			// Another account has a cache of its own.
			if u := post(apiKeyHeaders(keyB), first); u.CacheReadTokens != 0 || u.CacheCreationTokens != prefix {
				t.Errorf("another account %+v, want %d written", u, prefix)
			}
			// The next turn reads the prefix and writes the turns since.
			next := cachedMessagesBody(stream, "List the files.", "README.md main.go", "Read main.go.")
			u = post(apiKeyHeaders(keyA), next)
			added := (len(`{"role":"user","content":[{"type":"text","text":"List the files."}]}`) +
				len(`{"role":"assistant","content":[{"type":"text","text":"README.md main.go"}]}`) + len(parts.System) + len(parts.Tools)) / 4
			if u.CacheReadTokens != prefix || u.CacheCreationTokens != added-prefix || u.InputTokens <= 0 {
				t.Errorf("next turn %+v, want %d read and %d written", u, prefix, added-prefix)
			}
			// Five minutes unused: gone. A use within them keeps it.
			b.sim.Advance(cacheLifetime - time.Second) //nolint:errcheck // a manual clock
			if u := post(apiKeyHeaders(keyA), next); u.CacheReadTokens != added {
				t.Errorf("within the lifetime %+v, want %d read", u, added)
			}
			b.sim.Advance(cacheLifetime) //nolint:errcheck // a manual clock
			if u := post(apiKeyHeaders(keyA), next); u.CacheReadTokens != 0 || u.CacheCreationTokens != added {
				t.Errorf("after the lifetime %+v, want nothing read and %d written", u, added)
			}
		})
	}
}

// TestMessagesNoCacheControl: a Messages request that does not ask for
// caching neither reads nor writes: all of it is input, every time.
func TestMessagesNoCacheControl(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	body := strings.Replace(cachedMessagesBody(false, "hi"), `,"cache_control":{"type":"ephemeral"}`, "", 1)
	// The words in a text are no cache_control.
	body = strings.Replace(body, `"text":"hi"`, `"text":"what does \"cache_control\": do?"`, 1)
	for range 2 {
		_, data := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), body)
		got, _ := messagesUsage(t, data, false)
		if want := (Usage{InputTokens: approxTokens(len(body)), OutputTokens: got.OutputTokens}); got != want || got.OutputTokens <= 1 {
			t.Errorf("usage %+v, want %+v", got, want)
		}
	}
}

func TestHasCacheControl(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]bool{
		`[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]`: true,
		`[{"cache_control" : {"type":"ephemeral"}}]`:                        true,
		`[{"type":"text","text":"\"cache_control\": {}"}]`:                  false,
		`[{"type":"text","text":"cache_control"}]`:                          false,
		`[{"type":"text","text":"x"}]`:                                      false,
		``:                                                                  false,
	} {
		if got := hasCacheControl(json.RawMessage(raw)); got != want {
			t.Errorf("hasCacheControl(%s) = %t, want %t", raw, got, want)
		}
	}
}

// responsesUsageJSON is a Responses usage object as a client reads it.
type responsesUsageJSON struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens *int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

func (r responsesUsageJSON) usage(t *testing.T) Usage {
	t.Helper()
	if r.InputTokensDetails.CachedTokens == nil || r.OutputTokensDetails.ReasoningTokens == nil || r.TotalTokens != r.InputTokens+r.OutputTokens {
		t.Fatalf("usage %+v lacks its details or its total", r)
	}
	return Usage{InputTokens: r.InputTokens - *r.InputTokensDetails.CachedTokens, OutputTokens: r.OutputTokens,
		CacheReadTokens: *r.InputTokensDetails.CachedTokens, ReasoningTokens: *r.OutputTokensDetails.ReasoningTokens}
}

// TestResponsesUsage: a Responses answer, streamed (in response.completed)
// and not, reports cached_tokens from the account's cache (OpenAI caches
// without being asked) and reasoning_tokens for a reasoning model or a
// request that asks for reasoning; the attempt log has the same.
func TestResponsesUsage(t *testing.T) {
	t.Parallel()
	input := `[{"type":"message","role":"developer","content":"You are Codex."},{"type":"message","role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name, model, extra string
		reasoning          int
	}{
		{"codex model", "gpt-5-codex", "", reasoningByEffort["medium"]},
		{"gpt-5 high effort", "gpt-5", `,"reasoning":{"effort":"high"}`, reasoningByEffort["high"]},
		{"no reasoning", "gpt-4.1", "", 0},
		{"reasoning asked of any model", "gpt-4.1", `,"reasoning":{"summary":"auto"}`, reasoningByEffort["medium"]},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s stream=%t", tc.name, stream), func(t *testing.T) {
				t.Parallel()
				b := openAISetup(t)
				body := fmt.Sprintf(`{"model":%q,"instructions":"Be brief.","input":%s,"stream":%t%s}`, tc.model, input, stream, tc.extra)
				prefix := (len(`"Be brief."`) + len(`{"type":"message","role":"developer","content":"You are Codex."}`)) / 4
				for i, cached := range []int{0, prefix} {
					resp, data := b.call(t, "POST", responsesURL, openAIKeyHeaders(keyOpenAI), body)
					if resp.StatusCode != 200 {
						t.Fatalf("status %d: %s", resp.StatusCode, data)
					}
					var r struct {
						Usage responsesUsageJSON `json:"usage"`
					}
					if stream {
						events, err := readEvents(strings.NewReader(string(data)))
						if err != nil {
							t.Fatal(err)
						}
						last := events[len(events)-1]
						var done struct {
							Response json.RawMessage `json:"response"`
						}
						json.Unmarshal([]byte(last.data), &done) //nolint:errcheck // checked by readEvents
						r = decode[struct {
							Usage responsesUsageJSON `json:"usage"`
						}](t, done.Response)
						if last.name != "response.completed" {
							t.Fatalf("last event %s", last.name)
						}
					} else {
						r = decode[struct {
							Usage responsesUsageJSON `json:"usage"`
						}](t, data)
					}
					got := r.Usage.usage(t)
					want := Usage{InputTokens: approxTokens(len(body)) - cached, CacheReadTokens: cached,
						OutputTokens: b.sim.reply.outputTokens + tc.reasoning, ReasoningTokens: tc.reasoning}
					if got != want {
						t.Errorf("request %d: usage %+v, want %+v", i, got, want)
					}
					if a := b.latestAttempt(t); a.Usage != want {
						t.Errorf("request %d: attempt log usage %+v, want %+v", i, a.Usage, want)
					}
				}
			})
		}
	}
}

// chatChunkUsage reads a chat stream's chunks: the usage of each chunk
// that has the key (nil for "usage": null), and how many lack it.
func chatChunkUsage(t *testing.T, data []byte) (usages []*chatUsage, choices []int, without int) {
	t.Helper()
	for _, p := range chatLines(t, data) {
		if p == "[DONE]" {
			continue
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal([]byte(p), &raw); err != nil {
			t.Fatal(err)
		}
		u, ok := raw["usage"]
		if !ok {
			without++
			continue
		}
		var cu *chatUsage
		json.Unmarshal(u, &cu) //nolint:errcheck // null or the object
		var ch []json.RawMessage
		json.Unmarshal(raw["choices"], &ch) //nolint:errcheck // a list
		usages, choices = append(usages, cu), append(choices, len(ch))
	}
	return usages, choices, without
}

// TestChatUsage: a completion reports its usage with its details; a
// stream reports it only when asked (stream_options.include_usage), in a
// last chunk with no choices, every chunk before it saying "usage":
// null; one not asked has no usage anywhere, and logs none.
func TestChatUsage(t *testing.T) {
	t.Parallel()
	b := openAISetup(t)
	body := `{"model":"gpt-5","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}]`
	prefix := len(`{"role":"system","content":"Be brief."}`) / 4
	toUsage := func(c *chatUsage) Usage {
		return Usage{InputTokens: c.PromptTokens - c.PromptTokensDetails.CachedTokens, OutputTokens: c.CompletionTokens,
			CacheReadTokens: c.PromptTokensDetails.CachedTokens, ReasoningTokens: c.CompletionTokensDetails.ReasoningTokens}
	}
	want := func(body string, cached int) Usage {
		r := reasoningByEffort["medium"]
		return Usage{InputTokens: approxTokens(len(body)) - cached, CacheReadTokens: cached, OutputTokens: b.sim.reply.outputTokens + r, ReasoningTokens: r}
	}

	whole := body + `,"stream":false}`
	_, data := b.call(t, "POST", chatURL, openAIKeyHeaders(keyOpenAI), whole)
	c := decode[chatCompletionObject](t, data)
	var cu chatUsage
	raw, _ := json.Marshal(c.Usage)
	json.Unmarshal(raw, &cu) //nolint:errcheck // made above
	if got := toUsage(&cu); got != want(whole, 0) || cu.TotalTokens != cu.PromptTokens+cu.CompletionTokens {
		t.Errorf("completion usage %+v, want %+v", cu, want(whole, 0))
	}

	asked := body + `,"stream":true,"stream_options":{"include_usage":true}}`
	_, data = b.call(t, "POST", chatURL, openAIKeyHeaders(keyOpenAI), asked)
	usages, choices, without := chatChunkUsage(t, data)
	n := len(usages)
	if without != 0 || n < 3 || usages[n-1] == nil || choices[n-1] != 0 {
		t.Fatalf("asked: %d chunks without usage, usages %v, choices %v", without, usages, choices)
	}
	for i, u := range usages[:n-1] {
		if u != nil || choices[i] != 1 {
			t.Errorf("chunk %d: usage %+v, %d choices; want null and one choice", i, u, choices[i])
		}
	}
	if got := toUsage(usages[n-1]); got != want(asked, prefix) {
		t.Errorf("streamed usage %+v, want %+v (the prefix cached by the request before)", got, want(asked, prefix))
	}
	if a := b.latestAttempt(t); a.Usage != want(asked, prefix) {
		t.Errorf("attempt log usage %+v, want %+v", a.Usage, want(asked, prefix))
	}

	unasked := body + `,"stream":true}`
	_, data = b.call(t, "POST", chatURL, openAIKeyHeaders(keyOpenAI), unasked)
	if usages, _, without := chatChunkUsage(t, data); len(usages) != 0 || without < 3 {
		t.Errorf("not asked: usages %v in %d chunks", usages, without+len(usages))
	}
	if a := b.latestAttempt(t); a.Usage != (Usage{}) {
		t.Errorf("not asked: attempt log usage %+v, want none", a.Usage)
	}
}

// TestCutStreamUsage: a stream the simulator cuts has reported only what
// came before the cut: a Messages stream its message_start's usage (the
// input and cache fields, one output token), a Responses stream nothing;
// the attempt log says the same.
func TestCutStreamUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, path string
		h          http.Header
		body       string
		fault      Fault
		account    string
		startOnly  bool
	}{
		{"messages dropped", "/v1/messages", apiKeyHeaders(keyA), cachedMessagesBody(true, "hi"), Fault{Kind: FaultDropMidStream}, "key-a", true},
		{"messages error after content", "/v1/messages", apiKeyHeaders(keyA), cachedMessagesBody(true, "hi"), Fault{Kind: FaultErrorAfterContent}, "key-a", true},
		{"messages overloaded event", "/v1/messages", apiKeyHeaders(keyA), cachedMessagesBody(true, "hi"), Fault{Kind: FaultOverloadedEvent}, "key-a", true},
		{"messages reset", "/v1/messages", apiKeyHeaders(keyA), cachedMessagesBody(true, "hi"), Fault{Kind: FaultResetAfterOutput}, "key-a", true},
		{"responses dropped", responsesURL, openAIKeyHeaders(keyOpenAI), responsesBody(true), Fault{Kind: FaultDropMidStream}, "oai", false},
		{"responses failed", responsesURL, openAIKeyHeaders(keyOpenAI), responsesBody(true), Fault{Kind: FaultAtCapacityAfterOutput}, "oai", false},
		{"chat dropped", chatURL, openAIKeyHeaders(keyOpenAI), `{"model":"gpt-5","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`,
			Fault{Kind: FaultDropMidStream}, "oai", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{Script: openAIScript(), Deltas: 4})
			if err := b.sim.AddFaults(tc.account, tc.fault); err != nil {
				t.Fatal(err)
			}
			resp, err := b.send(t, "POST", tc.path, tc.h, tc.body)
			var data []byte
			if err == nil {
				data, _ = io.ReadAll(resp.Body) // cut: the error is the point
				resp.Body.Close()
			}
			a := b.latestAttempt(t)
			if a.Outcome != tc.fault.Kind {
				t.Fatalf("attempt %+v, want the fault", a)
			}
			if !tc.startOnly {
				if a.Usage != (Usage{}) || strings.Contains(string(data), `"cached_tokens"`) || strings.Contains(string(data), `"prompt_tokens"`) {
					t.Errorf("usage %+v logged, or reported in %s", a.Usage, data)
				}
				return
			}
			if strings.Contains(string(data), "message_delta") {
				t.Fatalf("the cut stream has a message_delta: %s", data)
			}
			events, _ := readEvents(strings.NewReader(string(data)))
			var start messageStartEvent
			if len(events) == 0 || json.Unmarshal([]byte(events[0].data), &start) != nil {
				t.Fatalf("no message_start in %s", data)
			}
			want := Usage{InputTokens: start.Message.Usage.InputTokens, OutputTokens: 1,
				CacheReadTokens: start.Message.Usage.CacheReadInputTokens, CacheCreationTokens: start.Message.Usage.CacheCreationInputTokens}
			if want.CacheCreationTokens == 0 || a.Usage != want {
				t.Errorf("attempt log usage %+v, want message_start's %+v (with the prefix written)", a.Usage, want)
			}
		})
	}
}

func TestReasoningModel(t *testing.T) {
	t.Parallel()
	for model, want := range map[string]bool{
		"gpt-5": true, "gpt-5-codex": true, "gpt-5.1-codex-max": true, "gpt-6.2-sol": true, "codex-mini-latest": true,
		"o3": true, "o4-mini": true, "gpt-4.1": false, "gpt-4o": false, "claude-sonnet-4-5": false, "": false,
	} {
		if got := reasoningModel(model); got != want {
			t.Errorf("reasoningModel(%q) = %t, want %t", model, got, want)
		}
	}
}
