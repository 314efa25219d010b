package sim

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const (
	tokChatGPT   = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJjb2RleCJ9.c2lnbmF0dXJl"
	keyOpenAI    = "sk-proj-openaiopenaiopenaiopenai0001"
	tokChatGone  = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJnb25lIn0.c2lnbmF0dXJl"
	codexPath    = "/backend-api/codex/responses"
	responsesURL = "/v1/responses"
	chatURL      = "/v1/chat/completions"
	gptModel     = "gpt-5-codex"
)

// openAIScript has a ChatGPT login, an OpenAI key, a revoked ChatGPT login
// and an Anthropic key.
func openAIScript() Script {
	return Script{Accounts: []AccountScript{
		{Name: "codex", Credential: tokChatGPT, Kind: KindChatGPT, FiveHourUtilization: 0.25, SevenDayUtilization: 0.625},
		{Name: "oai", Credential: keyOpenAI, Kind: KindOpenAIKey},
		{Name: "codex-gone", Credential: tokChatGone, Kind: KindChatGPT, Revoked: true},
		{Name: "key-a", Credential: keyA, Kind: KindAPIKey},
	}}
}

func openAISetup(t *testing.T) *bundle {
	t.Helper()
	return setup(t, Config{Script: openAIScript(), Deltas: 3})
}

// chatgptHeaders authenticates as the account named "codex" (its derived
// account id).
func chatgptHeaders(tok string) http.Header {
	return chatgptHeadersFor(tok, derivedChatGPTAccountID("codex"))
}

func chatgptHeadersFor(tok, accountID string) http.Header {
	h := http.Header{}
	h.Set("Authorization", "Bearer "+tok)
	h.Set("chatgpt-account-id", accountID)
	h.Set("content-type", "application/json")
	return h
}

func openAIKeyHeaders(key string) http.Header {
	h := http.Header{}
	h.Set("Authorization", "Bearer "+key)
	h.Set("content-type", "application/json")
	return h
}

func responsesBody(stream bool) string {
	return fmt.Sprintf(`{"model":%q,"input":[{"role":"user","content":"hi"}],"stream":%t,"prompt_cache_key":"k"}`, gptModel, stream)
}

func chatBody(stream bool) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"stream":%t}`, gptModel, stream)
}

// wantOpenAIError checks an OpenAI-shaped error body exactly.
func wantOpenAIError(t *testing.T, resp *http.Response, data []byte, status int, errType, code, message string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d; body %s", resp.StatusCode, status, data)
	}
	var got map[string]map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("body %s: %v", data, err)
	}
	want := map[string]any{"message": message, "type": errType, "param": nil, "code": nil}
	if code != "" {
		want["code"] = code
	}
	if message == "" {
		want["message"] = got["error"]["message"]
	}
	if len(got) != 1 || fmt.Sprint(got["error"]) != fmt.Sprint(want) {
		t.Errorf("error body %s, want {\"error\":%v}", data, want)
	}
}

// seqEvent is the common part of every Responses stream event.
type seqEvent struct {
	Type           string `json:"type"`
	SequenceNumber *int   `json:"sequence_number"`
}

// checkSequence checks that each event's type is its name and that the
// sequence numbers count from 0.
func checkSequence(t *testing.T, events []sseEvent) {
	t.Helper()
	for i, e := range events {
		var se seqEvent
		if err := json.Unmarshal([]byte(e.data), &se); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if se.Type != e.name {
			t.Errorf("event %d: type %q, name %q", i, se.Type, e.name)
		}
		if se.SequenceNumber == nil || *se.SequenceNumber != i {
			t.Errorf("event %d (%s): sequence_number %v, want %d", i, e.name, se.SequenceNumber, i)
		}
	}
}

func responsesNames(deltas int) []string {
	names := []string{"response.created", "response.output_item.added"}
	for range deltas {
		names = append(names, "response.output_text.delta")
	}
	return append(names, "response.output_item.done", "response.completed")
}

type responseJSON struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Status string `json:"status"`
	Model  string `json:"model"`
	Output []struct {
		Type    string `json:"type"`
		Role    string `json:"role"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage *struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
	Error *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func checkCompletedResponse(t *testing.T, r responseJSON, text string) {
	t.Helper()
	if !strings.HasPrefix(r.ID, "resp_") || r.Object != "response" || r.Status != "completed" || r.Model != gptModel {
		t.Errorf("response %+v", r)
	}
	if len(r.Output) != 1 || r.Output[0].Type != "message" || r.Output[0].Role != "assistant" ||
		len(r.Output[0].Content) != 1 || r.Output[0].Content[0].Type != "output_text" || r.Output[0].Content[0].Text != text {
		t.Errorf("output %+v", r.Output)
	}
	if r.Usage == nil || r.Usage.InputTokens < 1 || r.Usage.OutputTokens < 1 || r.Usage.TotalTokens != r.Usage.InputTokens+r.Usage.OutputTokens {
		t.Errorf("usage %+v", r.Usage)
	}
}

func TestResponsesNonStream(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		path string
		h    http.Header
		acct string
	}{
		{codexPath, chatgptHeaders(tokChatGPT), "codex"},
		{responsesURL, openAIKeyHeaders(keyOpenAI), "oai"},
	} {
		t.Run(tc.acct, func(t *testing.T) {
			t.Parallel()
			b := openAISetup(t)
			body := responsesBody(false)
			resp, data := b.call(t, "POST", tc.path, tc.h, body)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), data)
			}
			checkCompletedResponse(t, decode[responseJSON](t, data), b.sim.reply.text)
			a := b.nextAttempt(t)
			want := Attempt{Time: testNow, Account: tc.acct, Model: gptModel, Path: tc.path, BodySHA256: bodyHash(body), Outcome: outcomeOK, Status: 200}
			if a != want {
				t.Errorf("attempt %+v, want %+v", a, want)
			}
		})
	}
}

func TestResponsesStream(t *testing.T) {
	t.Parallel()
	b := openAISetup(t)
	body := responsesBody(true)
	resp, data := b.call(t, "POST", codexPath, chatgptHeaders(tokChatGPT), body)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if strings.Contains(string(data), "[DONE]") {
		t.Error("stream has [DONE]")
	}
	events, err := readEvents(strings.NewReader(string(data)))
	if err != nil {
		t.Fatalf("%v in %s", err, data)
	}
	if got, want := eventNames(events), responsesNames(3); !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	checkSequence(t, events)
	var text strings.Builder
	for _, e := range events[2:5] {
		var d struct {
			Delta        string `json:"delta"`
			ItemID       string `json:"item_id"`
			OutputIndex  *int   `json:"output_index"`
			ContentIndex *int   `json:"content_index"`
		}
		json.Unmarshal([]byte(e.data), &d) //nolint:errcheck // checked by readEvents
		if d.ItemID == "" || d.OutputIndex == nil || d.ContentIndex == nil {
			t.Errorf("delta %s", e.data)
		}
		text.WriteString(d.Delta)
	}
	if text.String() != b.sim.reply.text {
		t.Errorf("deltas %q, want %q", text.String(), b.sim.reply.text)
	}
	var created, completed struct {
		Response responseJSON `json:"response"`
	}
	json.Unmarshal([]byte(events[0].data), &created)   //nolint:errcheck // as above
	json.Unmarshal([]byte(events[6].data), &completed) //nolint:errcheck // as above
	if created.Response.Status != "in_progress" || created.Response.ID != completed.Response.ID {
		t.Errorf("created %+v, completed id %q", created.Response, completed.Response.ID)
	}
	checkCompletedResponse(t, completed.Response, b.sim.reply.text)
	if a := b.nextAttempt(t); a.Outcome != outcomeOK || !a.Stream || a.Path != codexPath || a.Account != "codex" {
		t.Errorf("attempt %+v", a)
	}
}

func TestCodexHeaders(t *testing.T) {
	t.Parallel()
	b := openAISetup(t)
	check := func(resp *http.Response, primary, secondary string) {
		t.Helper()
		now := testNow.Unix()
		for _, w := range []struct{ name, pct, minutes string }{
			{"primary", primary, "300"}, {"secondary", secondary, "10080"},
		} {
			p := "x-codex-" + w.name + "-"
			if got := resp.Header.Get(p + "used-percent"); got != w.pct {
				t.Errorf("%sused-percent %q, want %q", p, got, w.pct)
			}
			if got := resp.Header.Get(p + "window-minutes"); got != w.minutes {
				t.Errorf("%swindow-minutes %q", p, got)
			}
			at, err1 := strconv.ParseInt(resp.Header.Get(p+"reset-at"), 10, 64)
			after, err2 := strconv.ParseInt(resp.Header.Get(p+"reset-after-seconds"), 10, 64)
			if err1 != nil || err2 != nil || after < 1 || at != now+after {
				t.Errorf("%sreset-at %d reset-after-seconds %d (%v, %v)", p, at, after, err1, err2)
			}
		}
	}
	resp, _ := b.call(t, "POST", codexPath, chatgptHeaders(tokChatGPT), responsesBody(false))
	check(resp, "25", "62.5")
	resp, _ = b.call(t, "POST", codexPath, chatgptHeaders(tokChatGPT), responsesBody(true))
	check(resp, "25", "62.5")
	resp, _ = b.call(t, "POST", responsesURL, openAIKeyHeaders(keyOpenAI), responsesBody(false))
	check(resp, "0", "0")
	// Errors after authentication carry them too.
	if err := b.sim.AddFaults("codex", Fault{Kind: FaultUsageLimitReached}); err != nil {
		t.Fatal(err)
	}
	resp, _ = b.call(t, "POST", codexPath, chatgptHeaders(tokChatGPT), responsesBody(false))
	check(resp, "25", "62.5")
	resp, _ = b.call(t, "POST", chatURL, openAIKeyHeaders(keyOpenAI), chatBody(false))
	if resp.Header.Get("x-codex-primary-used-percent") != "" {
		t.Error("chat completions has codex headers")
	}
}

type chatCompletionJSON struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

func TestChatCompletionsNonStream(t *testing.T) {
	t.Parallel()
	b := openAISetup(t)
	body := chatBody(false)
	resp, data := b.call(t, "POST", chatURL, openAIKeyHeaders(keyOpenAI), body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	got := decode[chatCompletionJSON](t, data)
	if !strings.HasPrefix(got.ID, "chatcmpl-") || got.Object != "chat.completion" || got.Model != gptModel || len(got.Choices) != 1 {
		t.Fatalf("completion %s", data)
	}
	c := got.Choices[0]
	if c.Index != 0 || c.Message.Role != "assistant" || c.Message.Content != b.sim.reply.text || c.FinishReason != "stop" {
		t.Errorf("choice %+v", c)
	}
	if got.Usage.PromptTokens < 1 || got.Usage.CompletionTokens < 1 || got.Usage.TotalTokens != got.Usage.PromptTokens+got.Usage.CompletionTokens {
		t.Errorf("usage %+v", got.Usage)
	}
	want := Attempt{Time: testNow, Account: "oai", Model: gptModel, Path: chatURL, BodySHA256: bodyHash(body), Outcome: outcomeOK, Status: 200}
	if a := b.nextAttempt(t); a != want {
		t.Errorf("attempt %+v, want %+v", a, want)
	}
}

func TestChatCompletionsStream(t *testing.T) {
	t.Parallel()
	b := openAISetup(t)
	resp, data := b.call(t, "POST", chatURL, openAIKeyHeaders(keyOpenAI), chatBody(true))
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// Strictly "data: X\n\n" blocks, the last one [DONE].
	var payloads []string
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			t.Fatalf("unexpected line %q", line)
		}
		payloads = append(payloads, strings.TrimPrefix(line, "data: "))
		if !sc.Scan() || sc.Text() != "" {
			t.Fatalf("no blank line after %q", line)
		}
	}
	if len(payloads) != 1+3+1+1 || payloads[len(payloads)-1] != "[DONE]" {
		t.Fatalf("payloads %q", payloads)
	}
	var text strings.Builder
	for i, p := range payloads[:len(payloads)-1] {
		var ch struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Role    string  `json:"role"`
					Content *string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(p), &ch); err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		if ch.Object != "chat.completion.chunk" || !strings.HasPrefix(ch.ID, "chatcmpl-") || len(ch.Choices) != 1 {
			t.Fatalf("chunk %d: %s", i, p)
		}
		d := ch.Choices[0]
		switch {
		case i == 0:
			if d.Delta.Role != "assistant" || d.FinishReason != nil {
				t.Errorf("first chunk %s", p)
			}
		case i == len(payloads)-2:
			if d.FinishReason == nil || *d.FinishReason != "stop" || d.Delta.Content != nil {
				t.Errorf("last chunk %s", p)
			}
		default:
			if d.Delta.Content == nil || d.FinishReason != nil {
				t.Fatalf("chunk %d: %s", i, p)
			}
			text.WriteString(*d.Delta.Content)
		}
	}
	if text.String() != b.sim.reply.text {
		t.Errorf("text %q", text.String())
	}
}

func TestUsageLimitReachedFault(t *testing.T) {
	t.Parallel()
	b := openAISetup(t)
	if err := b.sim.AddFaults("codex", Fault{Kind: FaultUsageLimitReached}, Fault{Kind: FaultUsageLimitReached, RetryAfter: 120}); err != nil {
		t.Fatal(err)
	}
	for _, secs := range []int64{3600, 120} {
		resp, data := b.call(t, "POST", codexPath, chatgptHeaders(tokChatGPT), responsesBody(true))
		if resp.StatusCode != 429 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		want := fmt.Sprintf(`{"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"plus","resets_at":%d,"resets_in_seconds":%d}}`+"\n", testNow.Unix()+secs, secs)
		if string(data) != want {
			t.Errorf("body %s, want %s", data, want)
		}
		if a := b.nextAttempt(t); a.Outcome != FaultUsageLimitReached || a.Status != 429 || a.Account != "codex" {
			t.Errorf("attempt %+v", a)
		}
	}
	resp, _ := b.call(t, "POST", codexPath, chatgptHeaders(tokChatGPT), responsesBody(false))
	if resp.StatusCode != 200 {
		t.Errorf("after the faults: %d", resp.StatusCode)
	}
}

func TestInsufficientQuotaFault(t *testing.T) {
	t.Parallel()
	b := openAISetup(t)
	if err := b.sim.AddFaults("oai", Fault{Kind: FaultInsufficientQuota, Times: 2}); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{responsesURL, chatURL} {
		body := responsesBody(false)
		if path == chatURL {
			body = chatBody(true)
		}
		resp, data := b.call(t, "POST", path, openAIKeyHeaders(keyOpenAI), body)
		wantOpenAIError(t, resp, data, 429, "insufficient_quota", "insufficient_quota", insufficientQuotaMessage)
		if !strings.HasPrefix(insufficientQuotaMessage, "You exceeded your current quota") {
			t.Error(insufficientQuotaMessage)
		}
		if a := b.nextAttempt(t); a.Outcome != FaultInsufficientQuota || a.Status != 429 || a.Path != path {
			t.Errorf("attempt %+v", a)
		}
	}
}

func TestAtCapacityEventFault(t *testing.T) {
	t.Parallel()
	b := openAISetup(t)
	if err := b.sim.AddFaults("codex", Fault{Kind: FaultAtCapacityEvent, Times: 2}); err != nil {
		t.Fatal(err)
	}
	resp, data := b.call(t, "POST", codexPath, chatgptHeaders(tokChatGPT), responsesBody(true))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	events, err := readEvents(strings.NewReader(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	if got := eventNames(events); !slices.Equal(got, []string{"response.created", "response.failed"}) {
		t.Fatalf("events %v", got)
	}
	checkSequence(t, events)
	var failed struct {
		Response responseJSON `json:"response"`
	}
	json.Unmarshal([]byte(events[1].data), &failed) //nolint:errcheck // checked by readEvents
	if e := failed.Response.Error; failed.Response.Status != "failed" || e == nil ||
		e.Code != "server_is_overloaded" || e.Message != "Selected model is at capacity. Please try a different model." {
		t.Errorf("response.failed %s", events[1].data)
	}
	if a := b.nextAttempt(t); a.Outcome != FaultAtCapacityEvent || a.Status != 200 || !a.Stream {
		t.Errorf("attempt %+v", a)
	}

	resp, data = b.call(t, "POST", codexPath, chatgptHeaders(tokChatGPT), responsesBody(false))
	wantOpenAIError(t, resp, data, 503, "server_error", "server_is_overloaded", atCapacityMessage)
	if a := b.nextAttempt(t); a.Outcome != FaultAtCapacityEvent || a.Status != 503 {
		t.Errorf("attempt %+v", a)
	}
}

func TestGenericFaultsOnOpenAIPaths(t *testing.T) {
	t.Parallel()
	b := openAISetup(t)
	if err := b.sim.AddFaults("oai",
		Fault{Kind: FaultOverloaded, RetryAfter: 7},
		Fault{Kind: FaultRevoked},
		Fault{Kind: FaultSlowHeaders},
		Fault{Kind: FaultDropConnection},
	); err != nil {
		t.Fatal(err)
	}
	resp, data := b.call(t, "POST", chatURL, openAIKeyHeaders(keyOpenAI), chatBody(false))
	wantOpenAIError(t, resp, data, 503, "server_error", "", openAIOverloadedMessage)
	if resp.Header.Get("retry-after") != "7" {
		t.Errorf("retry-after %q", resp.Header.Get("retry-after"))
	}
	resp, data = b.call(t, "POST", responsesURL, openAIKeyHeaders(keyOpenAI), responsesBody(false))
	wantOpenAIError(t, resp, data, 401, "invalid_request_error", "invalid_api_key", "Incorrect API key provided.")
	resp, data = b.call(t, "POST", responsesURL, openAIKeyHeaders(keyOpenAI), responsesBody(false))
	if resp.StatusCode != 200 {
		t.Errorf("slow_headers: %d %s", resp.StatusCode, data)
	}
	if _, err := b.send(t, "POST", chatURL, openAIKeyHeaders(keyOpenAI), chatBody(false)); err == nil {
		t.Error("drop_connection: got a response")
	}
	var outcomes []string
	for range 4 {
		outcomes = append(outcomes, b.nextAttempt(t).Outcome)
	}
	if want := []string{FaultOverloaded, FaultRevoked, FaultSlowHeaders, FaultDropConnection}; !slices.Equal(outcomes, want) {
		t.Errorf("outcomes %v, want %v", outcomes, want)
	}
}

func TestOpenAIAuth(t *testing.T) {
	t.Parallel()
	b := openAISetup(t)
	noAcctID := chatgptHeaders(tokChatGPT)
	noAcctID.Del("chatgpt-account-id")
	for _, tc := range []struct {
		name, path string
		h          http.Header
		body       string
		status     int
		account    string
	}{
		{"no account id", codexPath, noAcctID, responsesBody(false), 401, "codex"},
		{"no bearer", codexPath, http.Header{"Chatgpt-Account-Id": {"a"}}, responsesBody(false), 401, ""},
		{"unknown token", codexPath, chatgptHeaders("eyJunknown.token.x"), responsesBody(false), 401, ""},
		{"revoked", codexPath, chatgptHeaders(tokChatGone), responsesBody(false), 401, "codex-gone"},
		{"key on codex", codexPath, chatgptHeaders(keyOpenAI), responsesBody(false), 401, ""},
		{"chatgpt on responses", responsesURL, chatgptHeaders(tokChatGPT), responsesBody(false), 401, ""},
		{"chatgpt on chat", chatURL, chatgptHeaders(tokChatGPT), chatBody(false), 401, ""},
		{"anthropic key on responses", responsesURL, openAIKeyHeaders(keyA), responsesBody(false), 401, ""},
		{"openai key on messages", "/v1/messages", apiKeyHeaders(keyOpenAI), messagesBody(sonnet, false), 401, ""},
		{"chatgpt on messages", "/v1/messages", oauthHeaders(tokChatGPT), messagesBody(sonnet, false), 401, ""},
		{"get codex", codexPath, chatgptHeaders(tokChatGPT), "", 404, ""},
		{"unknown path", "/backend-api/codex/other", chatgptHeaders(tokChatGPT), responsesBody(false), 404, ""},
		{"bad body", responsesURL, openAIKeyHeaders(keyOpenAI), `{"model":"m"}`, 400, "oai"},
		{"chat without messages", chatURL, openAIKeyHeaders(keyOpenAI), `{"model":"m","input":"x"}`, 400, "oai"},
	} {
		method := "POST"
		if strings.HasPrefix(tc.name, "get") {
			method = "GET"
		}
		resp, data := b.call(t, method, tc.path, tc.h, tc.body)
		if resp.StatusCode != tc.status {
			t.Errorf("%s: status %d, want %d: %s", tc.name, resp.StatusCode, tc.status, data)
			continue
		}
		a := b.nextAttempt(t)
		if a.Account != tc.account || a.Status != tc.status || a.Path != tc.path {
			t.Errorf("%s: attempt %+v", tc.name, a)
		}
		if tc.path != "/v1/messages" && tc.status != 404 {
			var e openAIError
			if err := json.Unmarshal(data, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
				t.Errorf("%s: body %s", tc.name, data)
			}
		}
	}
}

func TestOpenAIScriptValidation(t *testing.T) {
	t.Parallel()
	sc := openAIScript()
	sc.Accounts[0].Faults = []Fault{{Kind: FaultUsageLimitReached}, {Kind: FaultAtCapacityEvent}, {Kind: FaultInsufficientQuota}}
	if err := sc.Validate(); err != nil {
		t.Fatal(err)
	}
	sc.Accounts[1].Kind = "openai"
	sc.Accounts[1].Faults = []Fault{{Kind: "usage_limit"}}
	err := sc.Validate()
	if err == nil || !strings.Contains(err.Error(), "accounts[1].kind") || !strings.Contains(err.Error(), "accounts[1].faults[0].kind") {
		t.Errorf("Validate: %v", err)
	}
	var decoded Script
	if err := decodeStrict(strings.NewReader(`{"accounts":[{"name":"c","credential":"eyJx.y.z","kind":"chatgpt","five_hour_utilization":0.5,"faults":[{"kind":"usage_limit_reached","retry_after":60}]}]}`), &decoded); err != nil {
		t.Fatal(err)
	}
	if err := decoded.Validate(); err != nil {
		t.Error(err)
	}
}

func TestOpenAIFaultsOnMessages(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	if err := b.sim.AddFaults("key-a", Fault{Kind: FaultInsufficientQuota}, Fault{Kind: FaultAtCapacityEvent}); err != nil {
		t.Fatal(err)
	}
	resp, data := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, false))
	wantError(t, resp, data, 429, "rate_limit_error", rateLimitMessage)
	resp, data = b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, true))
	events, err := readEvents(strings.NewReader(string(data)))
	if err != nil || resp.StatusCode != 200 || !slices.Equal(eventNames(events), []string{"message_start", "error"}) {
		t.Errorf("at_capacity_event on messages: %d %v %v", resp.StatusCode, eventNames(events), err)
	}
}

func TestResponsesMidStreamFaults(t *testing.T) {
	t.Parallel()
	b := openAISetup(t)
	if err := b.sim.AddFaults("oai", Fault{Kind: FaultErrorAfterContent, AfterDeltas: 1}, Fault{Kind: FaultDropMidStream, AfterDeltas: 2}); err != nil {
		t.Fatal(err)
	}
	resp, data := b.call(t, "POST", responsesURL, openAIKeyHeaders(keyOpenAI), responsesBody(true))
	events, err := readEvents(strings.NewReader(string(data)))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d %v", resp.StatusCode, err)
	}
	want := []string{"response.created", "response.output_item.added", "response.output_text.delta", "response.failed"}
	if got := eventNames(events); !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	checkSequence(t, events)

	resp, err = b.send(t, "POST", responsesURL, openAIKeyHeaders(keyOpenAI), responsesBody(true))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events, err = readEvents(resp.Body)
	if err == nil {
		t.Error("drop_mid_stream: the stream ended cleanly")
	}
	if got := eventNames(events); len(got) != 4 || got[3] != "response.output_text.delta" {
		t.Errorf("events before the drop %v", got)
	}
	for _, kind := range []string{FaultErrorAfterContent, FaultDropMidStream} {
		if a := b.nextAttempt(t); a.Outcome != kind || a.Status != 200 {
			t.Errorf("attempt %+v", a)
		}
	}
}

// TestDocOpenAIExample: the OpenAI example script in doc.go loads and
// behaves as described.
func TestDocOpenAIExample(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(src), "// # OpenAI and Codex accounts\n")
	if !ok {
		t.Fatal("doc.go has no OpenAI section")
	}
	var js strings.Builder
	started := false
	for line := range strings.SplitSeq(section, "\n") {
		rest, ok := strings.CutPrefix(line, "//\t")
		if !ok {
			if started {
				break
			}
			continue
		}
		started = true
		js.WriteString(rest + "\n")
	}
	var sc Script
	if err := decodeStrict(strings.NewReader(js.String()), &sc); err != nil {
		t.Fatalf("%v\n%s", err, js.String())
	}
	if err := sc.Validate(); err != nil {
		t.Fatal(err)
	}
	b := setup(t, Config{Script: sc})
	h := chatgptHeaders(sc.Accounts[0].Credential)
	resp, _ := b.call(t, "POST", codexPath, h, responsesBody(false))
	if resp.StatusCode != 503 || resp.Header.Get("x-codex-secondary-used-percent") != "90" {
		t.Errorf("at_capacity_event: %d %q", resp.StatusCode, resp.Header.Get("x-codex-secondary-used-percent"))
	}
	resp, data := b.call(t, "POST", codexPath, h, responsesBody(false))
	if resp.StatusCode != 429 || !strings.Contains(string(data), `"resets_in_seconds":1800`) {
		t.Errorf("usage_limit_reached: %d %s", resp.StatusCode, data)
	}
	resp, data = b.call(t, "POST", chatURL, openAIKeyHeaders(sc.Accounts[1].Credential), chatBody(false))
	wantOpenAIError(t, resp, data, 429, "insufficient_quota", "insufficient_quota", insufficientQuotaMessage)
	resp, data = b.call(t, "POST", chatURL, openAIKeyHeaders(sc.Accounts[2].Credential), chatBody(false))
	if resp.StatusCode != 429 || !strings.HasPrefix(string(data), `[{"error":{"code":429,`) || !strings.Contains(string(data), `"retryDelay":"22s"`) {
		t.Errorf("google_rate_limit: %d %s", resp.StatusCode, data)
	}
	resp, data = b.openAIRefresh(t, sc.Accounts[0].RefreshToken)
	if resp.StatusCode != 200 || jwtAccountID(decode[tokenResponse](t, data).AccessToken) != derivedChatGPTAccountID("codex") {
		t.Errorf("refresh: %d %s", resp.StatusCode, data)
	}
}
