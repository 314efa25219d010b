package e2e

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/sim"
)

// translatedTool is a Messages request that offers a tool, as Claude
// Code's turns do: the simulator answers it with a call of the tool.
const translatedTool = `{"name":"Bash","description":"Run a command","input_schema":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}`

// messagesTurn is a Messages request for model with the Bash tool, its
// conversation msgs (JSON array elements), streamed or not.
func messagesTurn(model, msgs string, stream bool) string {
	return `{"model":"` + model + `","max_tokens":1024,"system":[{"type":"text","text":"You are an agent."}],` +
		`"tools":[` + translatedTool + `],"messages":[` + msgs + `],"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
}

// A Messages client on an alias that translates is served by a Codex
// account as Responses and by an OpenAI account as Chat Completions: a
// multi-turn conversation with a tool call, whole and streamed, gets
// Messages answers (a tool_use whose id comes back in the next turn's
// tool_result, then the text), the upstream sees the target model on its
// own path, and the route event names the translation. Without the
// alias's consent the same alias is refused.
func TestTranslatedMessagesTurns(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		provider, target, path, translation string
	}{
		{"codex", "gpt-5-codex", "/backend-api/codex/responses", "messages>responses"},
		{"openai", "gpt-4.1", "/v1/chat/completions", "messages>chat_completions"},
	} {
		t.Run(c.provider, func(t *testing.T) {
			t.Parallel()
			e := setup(t, options{accounts: []account{{label: "up-1", provider: c.provider}, {label: "up-2", provider: c.provider}}})
			ctx := t.Context()
			set := func(translate bool, targets ...string) {
				if _, err := e.aliases.SetAlias(ctx, connect.NewRequest(&weirv1.SetAliasRequest{
					Alias: "coder", Targets: targets, Translate: translate})); err != nil {
					t.Fatal(err)
				}
			}
			set(false, c.target)
			r := e.do(http.MethodPost, "/v1/messages", messagesTurn("coder", `{"role":"user","content":"List the files."}`, false), nil)
			if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "--translate") {
				t.Fatalf("an alias that does not translate: %d %s", r.status, r.body)
			}
			// The Claude model first: with no Anthropic account, the
			// alias goes on to the target it translates for.
			set(true, model, c.target)
			for _, stream := range []bool{false, true} {
				// One Claude Code session per conversation: its turns keep
				// their account, and the target's cache.
				session := func(r *http.Request) {
					r.Header.Set("X-Claude-Code-Session-Id", "session-"+map[bool]string{true: "s", false: "w"}[stream])
				}
				first := `{"role":"user","content":"List the files."}`
				r := e.do(http.MethodPost, "/v1/messages", messagesTurn("coder", first, stream), session)
				if r.status != http.StatusOK {
					t.Fatalf("stream=%v: status %d: %s", stream, r.status, r.body)
				}
				if got := r.header.Get("Weir-Translation"); got != c.translation {
					t.Errorf("Weir-Translation %q, want %q", got, c.translation)
				}
				msg := messagesAnswer(t, r.body, stream)
				if msg.StopReason != "tool_use" || len(msg.Content) == 0 || msg.Content[len(msg.Content)-1].Type != "tool_use" {
					t.Fatalf("stream=%v: first turn %+v, want a tool call", stream, msg)
				}
				call := msg.Content[len(msg.Content)-1]
				if call.ID == "" || call.Name != "Bash" || !json.Valid(call.Input) {
					t.Fatalf("stream=%v: tool call %+v", stream, call)
				}
				ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
				if recs := ev.AttemptRecords; len(recs) != 1 || recs[0].Translation != c.translation || recs[0].Model != c.target {
					t.Errorf("route event records %+v, want one %s attempt on %s", recs, c.translation, c.target)
				}
				if ev.Usage.GetInputTokens()+ev.Usage.GetCacheReadTokens() == 0 || ev.Usage.GetOutputTokens() == 0 {
					t.Errorf("translated usage %+v, want the target's counts", ev.Usage)
				}
				// The next turns answer the call by its id, until the
				// simulator's turn of tool calls is over and it answers text.
				msgs := first
				for turn := 2; msg.StopReason == "tool_use"; turn++ {
					if turn > 6 {
						t.Fatalf("stream=%v: still calling tools at turn %d", stream, turn)
					}
					asst, _ := json.Marshal(map[string]any{"role": "assistant", "content": msg.Content})
					msgs += `,` + string(asst) + `,{"role":"user","content":[{"type":"tool_result","tool_use_id":"` +
						msg.Content[len(msg.Content)-1].ID + `","content":"README.md"}]}`
					r = e.do(http.MethodPost, "/v1/messages", messagesTurn("coder", msgs, stream), session)
					if r.status != http.StatusOK {
						t.Fatalf("stream=%v turn %d: status %d: %s", stream, turn, r.status, r.body)
					}
					msg = messagesAnswer(t, r.body, stream)
				}
				// The last turn read the earlier turns' prefix from the
				// target's cache, and said so in its usage.
				if ev := e.routeEvent(r.header.Get("Weir-Request-Id")); ev.Usage.GetCacheReadTokens() == 0 {
					t.Errorf("stream=%v: the last turn's usage %+v, want cache reads", stream, ev.Usage)
				}
				if msg.StopReason != "end_turn" || len(msg.Content) != 1 || msg.Content[0].Type != "text" || msg.Content[0].Text == "" {
					t.Errorf("stream=%v: last turn %+v, want text", stream, msg)
				}
			}
			for _, a := range e.sim.Attempts() {
				if a.Path != c.path || a.Model != c.target || a.Outcome != "ok" {
					t.Errorf("upstream attempt %+v, want ok on %s as %s", a, c.path, c.target)
				}
			}
			// Each session stayed on one account, with one cache key of
			// weir's own (never the client's session id).
			accounts, keys := map[string]map[string]bool{}, map[string]map[string]bool{}
			for _, x := range e.upstream.exchanges() {
				var b struct {
					Key string `json:"prompt_cache_key"`
				}
				json.Unmarshal(x.reqBody, &b) //nolint:errcheck // checked below
				stream := strings.Contains(string(x.reqBody), `"stream":true`)
				k := map[bool]string{true: "s", false: "w"}[stream]
				if accounts[k] == nil {
					accounts[k], keys[k] = map[string]bool{}, map[string]bool{}
				}
				accounts[k][x.reqHeader.Get("Authorization")] = true
				keys[k][b.Key] = true
				if b.Key == "" || strings.Contains(b.Key, "session-") {
					t.Errorf("prompt_cache_key %q, want weir's own key for the session", b.Key)
				}
			}
			for k := range accounts {
				if len(accounts[k]) != 1 || len(keys[k]) != 1 {
					t.Errorf("session %s: %d accounts and %d cache keys, want one of each", k, len(accounts[k]), len(keys[k]))
				}
			}
			e.leasesReleased()
		})
	}
}

// messageContent is a Messages answer's content block.
type messageContent struct {
	Type  string          `json:"type"`
	Text  string          `json:"text,omitempty"`
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
}

type messageAnswer struct {
	StopReason string           `json:"stop_reason"`
	Content    []messageContent `json:"content"`
}

// messagesAnswer reads a Messages answer, whole or streamed: a stream is
// put together from its events, each checked to be in the order a
// Messages client expects.
func messagesAnswer(t *testing.T, body []byte, stream bool) messageAnswer {
	t.Helper()
	var m messageAnswer
	if !stream {
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("answer %s: %v", body, err)
		}
		return m
	}
	open := -1
	var partial []string
	names := []string{}
	for _, ev := range sseEvents(t, body) {
		names = append(names, ev[0])
		var d struct {
			Type         string         `json:"type"`
			Index        int            `json:"index"`
			ContentBlock messageContent `json:"content_block"`
			Delta        struct {
				Type        string `json:"type"`
				Text        string `json:"text"`
				PartialJSON string `json:"partial_json"`
				StopReason  string `json:"stop_reason"`
			} `json:"delta"`
		}
		if err := json.Unmarshal([]byte(ev[1]), &d); err != nil || d.Type != ev[0] {
			t.Fatalf("event %s %s: type %q, %v", ev[0], ev[1], d.Type, err)
		}
		switch ev[0] {
		case "content_block_start":
			if open != -1 || d.Index != len(m.Content) {
				t.Fatalf("block %d opened while %d is open, after %d blocks", d.Index, open, len(m.Content))
			}
			open = d.Index
			m.Content = append(m.Content, d.ContentBlock)
			partial = append(partial, "")
		case "content_block_delta":
			if d.Index != open {
				t.Fatalf("a delta for block %d while %d is open", d.Index, open)
			}
			m.Content[open].Text += d.Delta.Text
			partial[open] += d.Delta.PartialJSON
		case "content_block_stop":
			if d.Index != open {
				t.Fatalf("block %d closed while %d is open", d.Index, open)
			}
			if m.Content[open].Type == "tool_use" {
				m.Content[open].Input = json.RawMessage(partial[open])
			}
			open = -1
		case "message_delta":
			m.StopReason = d.Delta.StopReason
		}
	}
	if len(names) < 3 || names[0] != "message_start" || names[len(names)-1] != "message_stop" || open != -1 {
		t.Fatalf("stream events %v, want message_start … message_stop with every block closed", names)
	}
	return m
}

// The untranslated path is byte-exact, translating aliases or not: what
// an Anthropic or Codex account receives is the client's body byte for
// byte (its spacing, its key order, fields weir does not know, escapes),
// and every header the client sent but those weir owns (the credential,
// framing, hop-by-hop, compression) with its values unchanged;
// anthropic-beta and anthropic-version included. An alias changes the
// model's value and nothing else.
func TestUntranslatedPathByteExact(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "claude"}, {label: "cx", provider: "codex"}}})
	e.translateAlias("coder", model, "gpt-5-codex")
	owned := map[string]bool{"X-Api-Key": true, "Authorization": true, "Content-Length": true, "Accept-Encoding": true,
		"Connection": true, "Host": true}
	check := func(x upstreamExchange, sent *http.Request, body string) {
		t.Helper()
		if string(x.reqBody) != body {
			t.Errorf("%s: upstream body\n%s\nwant\n%s", x.path, x.reqBody, body)
		}
		for k, vs := range sent.Header {
			if owned[k] {
				continue
			}
			if got := x.reqHeader.Values(k); !slices.Equal(got, vs) {
				t.Errorf("%s: header %s upstream %q, client sent %q", x.path, k, got, vs)
			}
		}
	}
	messages := `{ "model" : "` + model + `",` + "\n\t" + `"max_tokens":64, "messages":[{"role":"user","content":"caf\u00e9 \"quoted\" é"}],` +
		`"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]},"output_config":{"effort":"high"},` +
		`"some_future_field":[1,2.50,{"z":null,"a":true}] }`
	var sent *http.Request
	headers := func(req *http.Request) {
		req.Header.Set("Anthropic-Beta", "claude-code-20250219, interleaved-thinking-2025-05-14,context-management-2025-06-27")
		req.Header.Set("Anthropic-Version", "2023-06-01")
		req.Header.Set("X-Stainless-Retry-Count", "0")
		req.Header.Add("X-Custom", "a")
		req.Header.Add("X-Custom", "b")
		req.Header.Set("X-Claude-Code-Session-Id", "s-1")
		sent = req
	}
	r := e.do(http.MethodPost, "/v1/messages?beta=true", messages, headers)
	if r.status != http.StatusOK || r.header.Get("Weir-Translation") != "" {
		t.Fatalf("status %d, translation %q: %s", r.status, r.header.Get("Weir-Translation"), r.body)
	}
	xs := e.upstream.exchanges()
	if len(xs) != 1 || xs[0].rawQuery != "beta=true" {
		t.Fatalf("upstream saw %+v", xs)
	}
	check(xs[0], sent, messages)

	// Through the alias: the same bytes but the model's value.
	aliased := strings.Replace(messages, `"model" : "`+model+`"`, `"model" : "coder"`, 1)
	r = e.do(http.MethodPost, "/v1/messages", aliased, headers)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	xs = e.upstream.exchanges()
	check(xs[len(xs)-1], sent, messages)

	// A Responses request on the Codex account.
	resp := `{"model":"` + codexModel + `", "input":"hi","store":false,"stream":false, "prompt_cache_key":"k-1","x_unknown":{"b":1,"a":2}}`
	r = e.do(http.MethodPost, "/v1/responses", resp, func(req *http.Request) {
		req.Header.Del("X-Api-Key")
		req.Header.Set("Authorization", "Bearer "+e.key)
		req.Header.Set("Session_id", "s-2")
		req.Header.Set("Originator", "codex_cli_rs")
		sent = req
	})
	if r.status != http.StatusOK {
		t.Fatalf("responses: status %d: %s", r.status, r.body)
	}
	xs = e.upstream.exchanges()
	check(xs[len(xs)-1], sent, resp)
}

// A translated turn is held through a storm like any other: two Codex
// accounts answer overloaded until the storm ends (one of them first with
// "model at capacity" events before any output), and a Claude Code turn
// on them through a translating alias is held, replayed with the same
// translated body on the same model, and served within 3 s of the end
// of the storm: one clean Messages stream, no error event.
func TestTranslatedTurnHeldThroughStorm(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	back := v.Now().Add(90 * time.Second)
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "cx-1", provider: "codex", faults: []sim.Fault{{Kind: sim.FaultOverloadedEvent, Times: 2}, {Kind: sim.FaultOverloaded, Until: back}}},
		{label: "cx-2", provider: "codex", faults: []sim.Fault{{Kind: sim.FaultOverloaded, Until: back}}},
	}})
	e.translateAlias("coder", "gpt-5-codex")
	r := e.do(http.MethodPost, "/v1/messages", messagesTurn("coder", `{"role":"user","content":"List the files."}`, true), nil)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	msg := messagesAnswer(t, r.body, true) // one clean stream, in order
	if msg.StopReason != "tool_use" {
		t.Errorf("answer %+v, want the tool call", msg)
	}
	if strings.Contains(string(r.body), "event: error") {
		t.Errorf("the client saw an error event: %s", r.body)
	}
	atts := sameBodyAnd(t, e, "gpt-5-codex")
	if atts[len(atts)-1].Status != http.StatusOK {
		t.Fatalf("attempts %v, want the last served", e.attempts())
	}
	met := 0
	for _, a := range atts[:len(atts)-1] {
		if a.Outcome == "ok" {
			t.Fatalf("attempts %v: served before the last", e.attempts())
		}
		met++
	}
	if met < 3 {
		t.Errorf("attempts %v, want the storm met", e.attempts())
	}
	if d := atts[len(atts)-1].Time.Sub(back); d > 3*time.Second {
		t.Errorf("served %v after the storm ended, want within 3s", d)
	}
	ev := heldFor(t, e, r)
	if ev.HoldCount == 0 || ev.Status != http.StatusOK {
		t.Errorf("route event: %d holds, status %d", ev.HoldCount, ev.Status)
	}
	for _, rec := range ev.AttemptRecords {
		if rec.AccountId != "" && rec.Translation != "messages>responses" {
			t.Errorf("attempt record %+v, want it translated", rec)
		}
	}
}

// A translated pool out of quota answers as any pool does, in the
// client's wire: Claude Code on spent Codex accounts, in the usage_limit
// mode, is told at once that the pool is out of usage quota and when the
// first account resets (the Codex backend's reset, read from its 429
// through the translation).
func TestTranslatedPoolAtUsageLimit(t *testing.T) {
	t.Parallel()
	e := setup(t, options{hold: 20 * time.Minute, accounts: []account{spentCodex("a", 2*time.Hour), spentCodex("b", 3*time.Hour)}})
	e.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
	e.translateAlias("coder", "gpt-5-codex")
	start := time.Now()
	var r response
	for range 3 { // the first meets the upstream's 429s; then weir knows
		r = e.do(http.MethodPost, "/v1/messages", messagesTurn("coder", `{"role":"user","content":"hi"}`, true), nil)
		if strings.Contains(string(r.body), "reset after") {
			break
		}
	}
	var body struct {
		Type  string `json:"type"`
		Error struct {
			Type     string `json:"type"`
			Message  string `json:"message"`
			ResetsAt int64  `json:"resets_at"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil || r.status != http.StatusTooManyRequests || body.Type != "error" ||
		body.Error.Type != "rate_limit_error" || !strings.Contains(body.Error.Message, "out of usage quota") {
		t.Fatalf("status %d: %s (%v), want the pool's usage limit in the Messages format", r.status, r.body, err)
	}
	if reset := time.Unix(body.Error.ResetsAt, 0); reset.Before(start.Add(2*time.Hour-time.Minute)) || reset.After(start.Add(2*time.Hour+time.Minute)) {
		t.Errorf("resets_at %v, want the first account's reset, about %v", reset, start.Add(2*time.Hour))
	}
	if r.header.Get("X-Should-Retry") != "false" {
		t.Errorf("X-Should-Retry %q, want false", r.header.Get("X-Should-Retry"))
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("took %v, want the client told at once", time.Since(start))
	}
}

// A Chat Completions client on an Anthropic account through a
// translating alias: a turn with a tool is answered with a tool call in
// the Chat format (whole and streamed, the stream's chunks in order and
// ending [DONE], its usage when asked), and the tool's result, sent back
// by the call's id, gets the text.
func TestTranslatedChatClientOnAnthropic(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "claude"}}})
	e.translateAlias("coder", model)
	tools := `"tools":[{"type":"function","function":{"name":"Bash","description":"Run","parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}}]`
	for _, stream := range []bool{false, true} {
		msgs := `{"role":"system","content":"You are an agent."},{"role":"user","content":"List the files."}`
		var callID string
		for turn := 1; ; turn++ {
			if turn > 6 {
				t.Fatalf("stream=%v: still calling tools at turn %d", stream, turn)
			}
			body := `{"model":"coder","messages":[` + msgs + `],` + tools + `,"stream":` + map[bool]string{true: `true,"stream_options":{"include_usage":true}`, false: "false"}[stream] + `}`
			r := e.do(http.MethodPost, "/v1/chat/completions", body, bearer(e.key))
			if r.status != http.StatusOK || r.header.Get("Weir-Translation") != "chat_completions>messages" {
				t.Fatalf("stream=%v turn %d: %d %q %s", stream, turn, r.status, r.header.Get("Weir-Translation"), r.body)
			}
			content, calls, finish, usage := chatAnswer(t, r.body, stream)
			if finish == "stop" {
				if content == "" || len(calls) != 0 || (stream && usage == nil) {
					t.Errorf("stream=%v: last turn %q, calls %v, usage %v", stream, content, calls, usage)
				}
				break
			}
			if finish != "tool_calls" || len(calls) != 1 || calls[0].Function.Name != "Bash" || !json.Valid([]byte(calls[0].Function.Arguments)) {
				t.Fatalf("stream=%v turn %d: finish %q calls %+v", stream, turn, finish, calls)
			}
			callID = calls[0].ID
			asst, _ := json.Marshal(map[string]any{"role": "assistant", "content": nil, "tool_calls": calls})
			msgs += `,` + string(asst) + `,{"role":"tool","tool_call_id":"` + callID + `","content":"README.md"}`
		}
		if callID == "" {
			t.Errorf("stream=%v: no tool call before the text", stream)
		}
	}
	for _, a := range e.sim.Attempts() {
		if a.Path != "/v1/messages" || a.Model != model || a.Outcome != "ok" {
			t.Errorf("upstream attempt %+v", a)
		}
	}
}

type chatCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// chatAnswer reads a Chat answer, whole or streamed (its chunks joined).
func chatAnswer(t *testing.T, body []byte, stream bool) (content string, calls []chatCall, finish string, usage map[string]any) {
	t.Helper()
	if !stream {
		var c struct {
			Choices []struct {
				Message struct {
					Content   *string    `json:"content"`
					ToolCalls []chatCall `json:"tool_calls"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage map[string]any `json:"usage"`
		}
		if err := json.Unmarshal(body, &c); err != nil || len(c.Choices) != 1 {
			t.Fatalf("answer %s: %v", body, err)
		}
		if c.Choices[0].Message.Content != nil {
			content = *c.Choices[0].Message.Content
		}
		return content, c.Choices[0].Message.ToolCalls, c.Choices[0].FinishReason, c.Usage
	}
	lines := strings.Split(strings.TrimSpace(string(body)), "\n\n")
	if lines[len(lines)-1] != "data: [DONE]" {
		t.Fatalf("stream does not end with [DONE]: %s", body)
	}
	for _, l := range lines[:len(lines)-1] {
		var c struct {
			Choices []struct {
				Delta struct {
					Content   string `json:"content"`
					ToolCalls []struct {
						Index int `json:"index"`
						chatCall
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage map[string]any `json:"usage"`
		}
		d, ok := strings.CutPrefix(l, "data: ")
		if !ok || json.Unmarshal([]byte(d), &c) != nil {
			t.Fatalf("chunk %q", l)
		}
		if c.Usage != nil {
			usage = c.Usage
		}
		for _, ch := range c.Choices {
			content += ch.Delta.Content
			for _, tc := range ch.Delta.ToolCalls {
				if tc.Index == len(calls) {
					calls = append(calls, tc.chatCall)
					continue
				}
				calls[tc.Index].Function.Arguments += tc.Function.Arguments
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	return content, calls, finish, usage
}

// A key's own alias comes before the global one of the same name: the
// team's "coder" is the Claude model, untranslated, while one person's
// key has its own "coder" that translates onto Codex. Each key's request
// goes where its alias says; deleting the key's own alias brings that key
// back to the global one.
func TestKeyAliasTranslates(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "claude"}, {label: "cx", provider: "codex"}}})
	ctx := t.Context()
	if _, err := e.aliases.SetAlias(ctx, connect.NewRequest(&weirv1.SetAliasRequest{Alias: "coder", Targets: []string{model}})); err != nil {
		t.Fatal(err)
	}
	alice := e.restrictedKey(&weirv1.CreateKeyRequest{})
	keys, err := e.keys.ListKeys(ctx, connect.NewRequest(&weirv1.ListKeysRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var aliceID string
	for _, k := range keys.Msg.Keys {
		if strings.HasPrefix(k.Name, "restricted-") {
			aliceID = k.Id
		}
	}
	e.change(func() {
		if _, err := e.aliases.SetAlias(ctx, connect.NewRequest(&weirv1.SetAliasRequest{Alias: "coder", Targets: []string{"gpt-5-codex"},
			Translate: true, Key: aliceID})); err != nil {
			t.Fatal(err)
		}
	})
	as := func(key string) func(*http.Request) { return func(r *http.Request) { r.Header.Set("X-Api-Key", key) } }
	body := messagesTurn("coder", `{"role":"user","content":"hi"}`, false)
	if r := e.do(http.MethodPost, "/v1/messages", body, nil); r.status != http.StatusOK || r.header.Get("Weir-Translation") != "" {
		t.Fatalf("the team's key: %d %q %s", r.status, r.header.Get("Weir-Translation"), r.body)
	}
	if r := e.do(http.MethodPost, "/v1/messages", body, as(alice)); r.status != http.StatusOK || r.header.Get("Weir-Translation") != "messages>responses" {
		t.Fatalf("the key with its own alias: %d %q %s", r.status, r.header.Get("Weir-Translation"), r.body)
	}
	if got, want := e.attempts(), []string{"claude:ok:200", "cx:ok:200"}; !slices.Equal(got, want) {
		t.Errorf("attempts %v, want %v", got, want)
	}
	e.change(func() {
		if _, err := e.aliases.DeleteAlias(ctx, connect.NewRequest(&weirv1.DeleteAliasRequest{Alias: "coder", Key: aliceID})); err != nil {
			t.Fatal(err)
		}
	})
	if r := e.do(http.MethodPost, "/v1/messages", body, as(alice)); r.status != http.StatusOK || r.header.Get("Weir-Translation") != "" {
		t.Fatalf("the key after its alias went: %d %q %s", r.status, r.header.Get("Weir-Translation"), r.body)
	}
}

// Failures through a translation reach the client in its own wire and
// its own terms: a request the target cannot carry is a 400 naming what,
// with nothing sent upstream; the target's refusal a 400 with its
// message, its rate limit (the hold budget spent) a 429, and an error
// after output the client's own error event, never the target's.
func TestTranslatedFailures(t *testing.T) {
	t.Parallel()
	turn := func(stream bool) string { return messagesTurn("coder", `{"role":"user","content":"hi"}`, stream) }
	for _, c := range []struct {
		name     string
		fault    *sim.Fault
		body     string
		status   int
		typ      string // the Anthropic error type, or the error event's
		message  string
		attempts int
	}{
		{"untranslatable", nil, strings.Replace(turn(false), `"max_tokens":1024`, `"max_tokens":1024,"stop_sequences":["END"]`, 1),
			http.StatusBadRequest, "invalid_request_error", "cannot carry stop_sequences", 0},
		{"refused upstream", &sim.Fault{Kind: sim.FaultBadRequest}, turn(false), http.StatusBadRequest, "invalid_request_error", "", 1},
		{"rate limited", &sim.Fault{Kind: sim.FaultRateLimit, RetryAfter: 30}, turn(false), http.StatusTooManyRequests, "rate_limit_error", "", 1},
		{"at capacity after output", &sim.Fault{Kind: sim.FaultAtCapacityAfterOutput}, turn(true), http.StatusOK, "overloaded_error", "", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			acct := account{label: "cx", provider: "codex"}
			if c.fault != nil {
				acct.faults = []sim.Fault{*c.fault}
			}
			e := setup(t, options{accounts: []account{acct}})
			e.translateAlias("coder", "gpt-5-codex")
			r := e.do(http.MethodPost, "/v1/messages", c.body, nil)
			if r.status != c.status {
				t.Fatalf("status %d, want %d: %s", r.status, c.status, r.body)
			}
			if c.status == http.StatusOK {
				events := sseEvents(t, r.body)
				last := events[len(events)-1]
				var ev apiError
				if last[0] != "error" || json.Unmarshal([]byte(last[1]), &ev) != nil || ev.Error.Type != c.typ {
					t.Errorf("last event %v, want the Messages error event %s", last, c.typ)
				}
				if strings.Contains(string(r.body), "response.failed") {
					t.Errorf("the target's event reached the client: %s", r.body)
				}
			} else {
				e := decodeError(t, r.body)
				if e.Error.Type != c.typ || !strings.Contains(e.Error.Message, c.message) {
					t.Errorf("error %+v, want %s naming %q", e.Error, c.typ, c.message)
				}
			}
			if n := len(e.sim.Attempts()); n != c.attempts {
				t.Errorf("%d upstream attempts, want %d", n, c.attempts)
			}
		})
	}
}

// The other way: a Codex client on a Claude account whose stream fails
// after output gets Responses' own response.failed, never the Messages
// error event; one the account refuses gets an OpenAI error body.
func TestTranslatedFailuresToResponses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		fault  sim.Fault
		stream bool
	}{
		{sim.Fault{Kind: sim.FaultErrorAfterContent}, true},
		{sim.Fault{Kind: sim.FaultBadRequest}, false},
	} {
		t.Run(c.fault.Kind, func(t *testing.T) {
			t.Parallel()
			e := setup(t, options{accounts: []account{{label: "claude", faults: []sim.Fault{c.fault}}}})
			e.translateAlias("team-coder", model)
			body := strings.Replace(responsesBody(c.stream), `"model":"`+codexModel+`"`, `"model":"team-coder"`, 1)
			r := e.do(http.MethodPost, "/v1/responses", body, bearer(e.key))
			if !c.stream {
				if f := errorFields(t, r); r.status != http.StatusBadRequest || f["type"] != "invalid_request_error" || f["message"] == "" {
					t.Errorf("status %d, error %v; want the OpenAI error body of a 400", r.status, f)
				}
				return
			}
			if r.status != http.StatusOK || !strings.Contains(string(r.body), "event: response.failed") ||
				strings.Contains(string(r.body), "event: error") || strings.Contains(string(r.body), "message_start") {
				t.Errorf("status %d, stream %s; want the Responses stream ending in response.failed", r.status, r.body)
			}
		})
	}
}

// count_tokens on an alias a Codex account serves is weir's estimate,
// said so in a header, and costs the upstream nothing.
func TestTranslatedCountTokensEstimate(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "cx", provider: "codex"}}})
	e.translateAlias("coder", "gpt-5-codex")
	body := `{"model":"coder","messages":[{"role":"user","content":"` + strings.Repeat("word ", 400) + `"}]}`
	r := e.do(http.MethodPost, "/v1/messages/count_tokens", body, nil)
	var got struct {
		InputTokens int64 `json:"input_tokens"`
	}
	if r.status != http.StatusOK || json.Unmarshal(r.body, &got) != nil || r.header.Get("Weir-Token-Count") != "estimate" {
		t.Fatalf("status %d, Weir-Token-Count %q: %s", r.status, r.header.Get("Weir-Token-Count"), r.body)
	}
	// 2,000 bytes of text and a few of field values: about 500 tokens.
	if got.InputTokens < 450 || got.InputTokens > 550 {
		t.Errorf("estimate %d tokens, want about 500", got.InputTokens)
	}
	if n := len(e.sim.Attempts()); n != 0 {
		t.Errorf("%d upstream attempts for an estimate", n)
	}
	// The account was not asked: its record says so, and proves nothing
	// of it (no success, no cooldown).
	ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
	if recs := ev.AttemptRecords; len(recs) != 1 || recs[0].Class != weirv1.OutcomeClass_OUTCOME_CLASS_NOT_SENT || ev.Status != http.StatusOK {
		t.Errorf("route event %d, records %+v; want one not-sent attempt", ev.Status, recs)
	}
}

// A key's standing for an alias that translates is the pool that would
// serve it: with the Claude subscription spent, the Codex account serves,
// and the standing (and the rate-limit headers Claude Code reads) are the
// Codex pool's, not the spent Claude one's.
func TestStandingOfTranslatedAlias(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{
		{label: "claude", oauth: true, windows: &sim.Windows{FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(3 * time.Hour)}}},
		{label: "cx", provider: "codex", windows: &sim.Windows{FiveHour: &sim.Window{Limit: 1000, Used: 300, ResetIn: sim.Duration(4 * time.Hour)}}},
	}})
	e.refreshUsage("claude", "cx")
	e.translateAlias("coder", model, "gpt-5-codex")
	s, r := e.getStanding(e.key, "model=coder&surface=messages")
	if r.status != http.StatusOK || len(s.Models) != 1 {
		t.Fatalf("standing: %d %s", r.status, r.body)
	}
	m := s.Models[0]
	if !m.CanServeNow || !slices.Equal(m.Providers, []string{"codex"}) || m.Windows.FiveHour == nil || m.Windows.FiveHour.UsedPercent != 30 {
		t.Errorf("standing %+v (five-hour %+v), want served now by the Codex pool at 30%%", m, m.Windows.FiveHour)
	}
}
