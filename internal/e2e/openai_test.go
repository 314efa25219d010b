package e2e

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/sim"
)

// The OpenAI-side surfaces end to end: /v1/responses on Codex (ChatGPT
// login) and OpenAI accounts, /v1/chat/completions on OpenAI-compatible
// accounts, their quota evidence, and the usage_limit quota response mode.

const codexModel = "gpt-5-codex"

func responsesBody(stream bool) string {
	return `{"model":"` + codexModel + `","input":"Say hello.","stream":` + strconv.FormatBool(stream) + `}`
}

func chatBody(stream bool) string {
	return `{"model":"gpt-4.1","messages":[{"role":"user","content":"Say hello."}],"stream":` + strconv.FormatBool(stream) + `}`
}

// bearer sends the weir key the way OpenAI clients do.
func bearer(key string) func(*http.Request) {
	return func(r *http.Request) {
		r.Header.Del("X-Api-Key")
		r.Header.Del("Anthropic-Version")
		r.Header.Set("Authorization", "Bearer "+key)
	}
}

func (e *env) responses(stream bool) response {
	e.t.Helper()
	return e.do(http.MethodPost, "/v1/responses", responsesBody(stream), bearer(e.key))
}

func (e *env) chat(stream bool) response {
	e.t.Helper()
	return e.do(http.MethodPost, "/v1/chat/completions", chatBody(stream), bearer(e.key))
}

// setQuotaMode changes the quota response mode through the admin API.
func (e *env) setQuotaMode(m weirv1.QuotaResponseMode) {
	e.t.Helper()
	_, err := e.settings.UpdateSettings(e.t.Context(), connect.NewRequest(&weirv1.UpdateSettingsRequest{
		Settings:   &weirv1.Settings{QuotaResponseMode: m},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"quota_response_mode"}},
	}))
	if err != nil {
		e.t.Fatalf("set quota_response_mode: %v", err)
	}
}

// TestResponsesAndChatSurfaces: a Codex account serves /v1/responses on the
// Codex backend with its own token and ChatGPT account id, streaming and
// not; an OpenAI key serves /v1/chat/completions; the client's weir key
// never reaches the upstream; tokens reach the route event.
func TestResponsesAndChatSurfaces(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{
		// Both codex and oai serve /v1/responses: the priority keeps every
		// Responses request on codex, reused lease or not (on a loaded
		// machine an idle lease can go back between two requests, and the
		// least recently used account would then be oai).
		{label: "codex", provider: "codex", priority: 10},
		{label: "oai", provider: "openai"},
		{label: "claude"},
	}})
	for _, stream := range []bool{false, true} {
		r := e.responses(stream)
		if r.status != http.StatusOK {
			t.Fatalf("responses stream=%v: status %d: %s", stream, r.status, r.body)
		}
		if stream {
			names := sseNames(t, r.body)
			if names[0] != "response.created" || names[len(names)-1] != "response.completed" {
				t.Errorf("stream events %v, want response.created … response.completed", names)
			}
		} else if !strings.Contains(string(r.body), `"status":"completed"`) {
			t.Errorf("responses body %s, want a completed response", r.body)
		}
		ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
		if ev.Surface != "responses" || e.labels[ev.AccountId] != "codex" || ev.OutputTokens <= 0 {
			t.Errorf("route event surface %q account %q output tokens %d", ev.Surface, e.labels[ev.AccountId], ev.OutputTokens)
		}
	}
	for _, stream := range []bool{false, true} {
		r := e.chat(stream)
		if r.status != http.StatusOK {
			t.Fatalf("chat stream=%v: status %d: %s", stream, r.status, r.body)
		}
		if stream && !strings.HasSuffix(strings.TrimSpace(string(r.body)), "data: [DONE]") {
			t.Errorf("chat stream does not end with [DONE]: %s", r.body)
		}
		ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
		if e.labels[ev.AccountId] != "oai" {
			t.Errorf("chat served by %q, want oai", e.labels[ev.AccountId])
		}
	}
	id, _ := e.sim.ChatGPTAccountID("codex")
	for _, x := range e.upstream.exchanges() {
		auth := x.reqHeader.Get("Authorization")
		if strings.Contains(auth, e.key) || x.reqHeader.Get("X-Api-Key") != "" {
			t.Errorf("%s: the client's key reached the upstream", x.path)
		}
		switch x.path {
		case "/backend-api/codex/responses":
			if auth != "Bearer "+e.creds["codex"] || x.reqHeader.Get("Chatgpt-Account-Id") != id {
				t.Errorf("codex request: auth set %v, account id %q", auth != "", x.reqHeader.Get("Chatgpt-Account-Id"))
			}
		case "/v1/chat/completions":
			if auth != "Bearer "+e.creds["oai"] {
				t.Error("chat request does not carry the OpenAI key")
			}
		default:
			t.Errorf("unexpected upstream path %s", x.path)
		}
	}
	// Bad input is answered in the OpenAI format.
	r := e.do(http.MethodPost, "/v1/responses", `{"input":"hi"}`, bearer(e.key))
	var oe struct {
		Error struct {
			Message, Type string
		}
	}
	if json.Unmarshal(r.body, &oe) != nil || r.status != 400 || oe.Error.Type != "invalid_request_error" || !strings.Contains(oe.Error.Message, "model") {
		t.Errorf("missing model: %d %s", r.status, r.body)
	}
	r = e.do(http.MethodPost, "/v1/chat/completions", chatBody(false), bearer("weir_wrong"))
	if json.Unmarshal(r.body, &oe) != nil || r.status != 401 || oe.Error.Type != "invalid_request_error" {
		t.Errorf("wrong key: %d %s", r.status, r.body)
	}
}

// sseNames lists a stream's event names (data-only events as "").
func sseNames(t *testing.T, body []byte) []string {
	t.Helper()
	var names []string
	for _, ev := range sseEvents(t, body) {
		names = append(names, ev[0])
	}
	if len(names) == 0 {
		t.Fatalf("no events in %q", body)
	}
	return names
}

// TestCodexAtCapacityHeldThenAfterOutput: the Codex "model at capacity"
// event before any output is a capacity failure: the worker holds and
// replays the same body on the same model and the client sees a clean
// stream. After output it cannot be replayed: the client gets the
// terminal response.failed with its reason, and nothing else.
func TestCodexAtCapacityHeldThenAfterOutput(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "codex", provider: "codex", faults: []sim.Fault{
			{Kind: sim.FaultAtCapacityEvent},
			{Kind: sim.FaultAtCapacityErrorEvent},
		}},
	}})
	r := e.responses(true)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if strings.Contains(string(r.body), "response.failed") || strings.Contains(string(r.body), "at capacity") {
		t.Errorf("the client saw the held failure: %s", r.body)
	}
	got := e.attempts()
	if len(got) != 3 || !strings.HasSuffix(got[2], ":ok:200") {
		t.Errorf("attempts %v, want two at-capacity failures then a success", got)
	}
	sameBodyAnd(t, e, codexModel)
	ev := heldFor(t, e, r)
	if ev.HoldCount < 2 {
		t.Errorf("hold count %d, want the two replays held", ev.HoldCount)
	}

	if err := e.sim.AddFaults("codex", sim.Fault{Kind: sim.FaultAtCapacityAfterOutput}); err != nil {
		t.Fatal(err)
	}
	r = e.responses(true)
	names := sseNames(t, r.body)
	if r.status != http.StatusOK || names[len(names)-1] != "response.failed" || !strings.Contains(string(r.body), "server_is_overloaded") {
		t.Fatalf("after output: %d %v", r.status, names)
	}
	if !strings.Contains(string(r.body), "response.output_text.delta") {
		t.Errorf("the output before the failure is missing: %s", r.body)
	}
	ev = heldFor(t, e, r)
	if ev.FailureStage != weirv1.FailureStage_FAILURE_STAGE_AFTER_OUTPUT || ev.HoldCount != 0 {
		t.Errorf("route event stage %v holds %d, want after output, no hold", ev.FailureStage, ev.HoldCount)
	}
}

// usageLimitBody is the OpenAI-format final usage limit.
type usageLimitBody struct {
	Error struct {
		Message            string `json:"message"`
		Type               string `json:"type"`
		Code               string `json:"code"`
		ResetsAt           int64  `json:"resets_at"`
		Retryable          *bool  `json:"retryable"`
		LimitWindowMinutes int32  `json:"limit_window_minutes"`
		Model              string `json:"model"`
		Provider           string `json:"provider"`
		ResetSeconds       int64  `json:"reset_seconds"`
		ResetTime          string `json:"reset_time"`
		LastUpstreamError  string `json:"last_upstream_error"`
	} `json:"error"`
}

// checkUsageLimitHeaders checks the headers of a final usage limit whose
// first reopening window has the given length and reset.
func checkUsageLimitHeaders(t *testing.T, r response, window int, reset time.Time) {
	t.Helper()
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429: %s", r.status, r.body)
	}
	if r.header.Get("X-Should-Retry") != "false" || r.header.Get("Retry-After") != "" {
		t.Errorf("X-Should-Retry %q Retry-After %q, want false and none", r.header.Get("X-Should-Retry"), r.header.Get("Retry-After"))
	}
	set, unset := "X-Codex-Primary-", "X-Codex-Secondary-"
	if window >= 24*60 {
		set, unset = unset, set
	}
	if r.header.Get(set+"Used-Percent") != "100" || r.header.Get(set+"Window-Minutes") != strconv.Itoa(window) ||
		r.header.Get(set+"Reset-At") != strconv.FormatInt(reset.Unix(), 10) {
		t.Errorf("%s* = %q %q %q, want 100 %d %d", set, r.header.Get(set+"Used-Percent"),
			r.header.Get(set+"Window-Minutes"), r.header.Get(set+"Reset-At"), window, reset.Unix())
	}
	// The other window, when the worker knows the pool's, is the pool's.
	other := 10080
	if window >= 24*60 {
		other = 300
	}
	if r.header.Get(unset+"Used-Percent") != "" && r.header.Get(unset+"Window-Minutes") != strconv.Itoa(other) {
		t.Errorf("%sWindow-Minutes %q, want the pool's %d-minute window", unset, r.header.Get(unset+"Window-Minutes"), other)
	}
}

// TestUsageLimitModeCodex: every Codex account usage-limited, the first to
// reopen two hours away. In the retryable mode weir answers as before (the
// upstream's own 429); in the usage_limit mode, on the next request and
// without a restart, a final usage limit with the reset of the account
// that reopens first, on /v1/responses streaming and not.
func TestUsageLimitModeCodex(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "a", provider: "codex", windows: &sim.Windows{
			FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(2 * time.Hour)},
		}},
		{label: "b", provider: "codex", windows: &sim.Windows{
			SevenDay: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(50 * time.Hour)},
		}},
	}})
	reset := v.Now().Add(2 * time.Hour)

	r := e.responses(false)
	var up usageLimitBody
	if r.status != http.StatusTooManyRequests || json.Unmarshal(r.body, &up) != nil || up.Error.Type != "usage_limit_reached" {
		t.Fatalf("retryable mode: %d %s, want the upstream's 429 usage_limit_reached", r.status, r.body)
	}
	if r.header.Get("X-Should-Retry") == "false" || up.Error.Code == "model_cooldown" {
		t.Errorf("retryable mode answered a final usage limit: %v %s", r.header, r.body)
	}
	if n := len(e.attempts()); n != 2 {
		t.Errorf("%d upstream attempts, want one per account", n)
	}
	for _, a := range e.routeEvent(r.header.Get("Weir-Request-Id")).AttemptRecords {
		if a.AccountId != "" && a.Rung != "provider_quota" {
			t.Errorf("attempt on %s decided by rung %q, want provider_quota (the explain view shows it)", e.labels[a.AccountId], a.Rung)
		}
	}

	e.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
	for _, stream := range []bool{false, true} {
		r = e.responses(stream)
		checkUsageLimitHeaders(t, r, 300, reset)
		var ul usageLimitBody
		if err := json.Unmarshal(r.body, &ul); err != nil {
			t.Fatalf("stream=%v: body %s: %v", stream, r.body, err)
		}
		got := ul.Error
		if got.Type != "usage_limit_reached" || got.Code != "model_cooldown" || got.Retryable == nil || *got.Retryable ||
			got.ResetsAt != reset.Unix() || got.LimitWindowMinutes != 300 || got.Model != codexModel || got.Provider != "codex" ||
			got.ResetSeconds != 7200 || got.ResetTime != "2h0m0s" || got.LastUpstreamError == "" {
			t.Errorf("stream=%v: usage limit body %+v", stream, got)
		}
		if !strings.Contains(got.Message, codexModel) || !strings.Contains(got.Message, "codex") || !strings.Contains(got.Message, got.LastUpstreamError) {
			t.Errorf("message %q does not name the model, provider and last error", got.Message)
		}
	}
	if n := len(e.attempts()); n != 2 {
		t.Errorf("%d upstream attempts, want none while every account is cooling", n)
	}
}

// TestUsageLimitModeMessages: Anthropic subscriptions whose unified 5h
// windows are rejected: /v1/messages answers an Anthropic rate_limit_error
// ending with the reset, resets_at and retryable false.
func TestUsageLimitModeMessages(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "max1", oauth: true, windows: &sim.Windows{FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(3 * time.Hour)}}},
		{label: "max2", oauth: true, windows: &sim.Windows{FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(2 * time.Hour)}}},
	}})
	e.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
	reset := v.Now().Add(2 * time.Hour)
	for _, stream := range []bool{false, true} {
		r := e.post(stream)
		checkUsageLimitHeaders(t, r, 300, reset)
		var body struct {
			Type  string `json:"type"`
			Error struct {
				Type      string `json:"type"`
				Message   string `json:"message"`
				ResetsAt  int64  `json:"resets_at"`
				Retryable *bool  `json:"retryable"`
			} `json:"error"`
		}
		if err := json.Unmarshal(r.body, &body); err != nil {
			t.Fatal(err)
		}
		if body.Type != "error" || body.Error.Type != "rate_limit_error" || !strings.HasSuffix(body.Error.Message, "(reset after 2h0m0s)") ||
			body.Error.ResetsAt != reset.Unix() || body.Error.Retryable == nil || *body.Error.Retryable {
			t.Errorf("stream=%v: %s", stream, r.body)
		}
	}
}

// TestUsageLimitModeChat: OpenAI-compatible accounts (a Google endpoint)
// out of quota with RetryInfo: /v1/chat/completions answers the OpenAI
// usage limit; the window is unknown, so no X-Codex headers.
func TestUsageLimitModeChat(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "vertex", provider: "openai", faults: []sim.Fault{{Kind: sim.FaultGoogleQuotaExhausted, RetryAfter: 3600}}},
	}})
	e.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
	r := e.chat(false)
	var ul usageLimitBody
	if r.status != http.StatusTooManyRequests || json.Unmarshal(r.body, &ul) != nil {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if ul.Error.Code != "model_cooldown" || ul.Error.ResetSeconds != 3600 || ul.Error.ResetTime != "1h0m0s" ||
		ul.Error.LimitWindowMinutes != 0 || ul.Error.Provider != "openai" {
		t.Errorf("usage limit %+v", ul.Error)
	}
	for _, h := range []string{"X-Codex-Primary-Used-Percent", "X-Codex-Secondary-Used-Percent", "Retry-After"} {
		if r.header.Get(h) != "" {
			t.Errorf("%s is set with an unknown window", h)
		}
	}
}

// TestUsageLimitThresholds: the usage limit needs the whole pool blocked by
// quota and a reset more than five minutes away. A reset at exactly 5:00
// stays retryable, 5:01 is a usage limit; a pool with one account that is
// not out of quota stays retryable even when this request could not use it.
func TestUsageLimitThresholds(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		reset time.Duration
		other bool // a second account that only fails transiently
		final bool
	}{
		{name: "5:00", reset: 5 * time.Minute},
		{name: "5:01", reset: 5*time.Minute + time.Second, final: true},
		{name: "2h", reset: 2 * time.Hour, final: true},
		{name: "mixed pool", reset: 2 * time.Hour, other: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := virtualClock()
			accts := []account{{label: "spent", provider: "codex", windows: &sim.Windows{
				FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(tt.reset)},
			}}}
			if tt.other {
				accts = append(accts, account{label: "flaky", provider: "codex", faults: []sim.Fault{{Kind: sim.FaultOverloaded, Times: -1}}})
			}
			// Fail fast: the final answer is given at once, not after a hold.
			e := setup(t, options{virtual: v, accounts: accts})
			e.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
			r := e.responses(false)
			if final := r.header.Get("X-Should-Retry") == "false" && strings.Contains(string(r.body), "model_cooldown"); final != tt.final {
				t.Errorf("final usage limit = %v, want %v: %d %s", final, tt.final, r.status, r.body)
			}
		})
	}
}

// TestUsageLimitModeSwitchEveryWorker: with cooldowns live, switching the
// mode applies to the next request on every worker, without waiting for
// their settings poll, and switching back restores the retryable answer.
func TestUsageLimitModeSwitchEveryWorker(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "a", provider: "codex", windows: &sim.Windows{FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(2 * time.Hour)}}},
	}})
	_, second := e.newDataplane(nil)
	workers := []string{e.dpSrv.URL, second.URL}
	post := func(base string) response {
		return e.doWith(e.client, base, http.MethodPost, "/v1/responses", responsesBody(false), bearer(e.key))
	}
	// The final usage limit is the model_cooldown answer; the retryable
	// mode's is the upstream's own 429, then weir's quota error.
	final := func(r response) bool {
		return r.header.Get("X-Should-Retry") == "false" && strings.Contains(string(r.body), `"model_cooldown"`)
	}
	if r := post(workers[0]); r.status != http.StatusTooManyRequests || final(r) {
		t.Fatalf("first request: %d %v", r.status, r.header)
	}
	e.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
	for i, w := range workers {
		if r := post(w); !final(r) {
			t.Errorf("worker %d after the switch: %d %s, want a final usage limit", i, r.status, r.body)
		}
	}
	e.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_RETRYABLE)
	for i, w := range workers {
		if r := post(w); final(r) || r.status != http.StatusTooManyRequests || !strings.Contains(string(r.body), `"usage_limit_reached"`) {
			t.Errorf("worker %d after switching back: %d %v %s", i, r.status, r.header, r.body)
		}
	}
}

// TestCORSExposeHeaders: browsers may read weir's answers; the headers of
// a usage-limit verdict are exposed in the usage_limit mode only, and a
// preflight is answered without a key.
func TestCORSExposeHeaders(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "codex", provider: "codex"}}})
	withOrigin := func(r *http.Request) {
		bearer(e.key)(r)
		r.Header.Set("Origin", "https://ide.example")
	}
	r := e.do(http.MethodPost, "/v1/responses", responsesBody(false), withOrigin)
	expose := r.header.Get("Access-Control-Expose-Headers")
	if r.status != 200 || r.header.Get("Access-Control-Allow-Origin") != "*" || !strings.Contains(expose, "Weir-Request-Id") ||
		strings.Contains(expose, "X-Should-Retry") || strings.Contains(expose, "X-Codex-") {
		t.Errorf("retryable mode: %d allow-origin %q expose %q", r.status, r.header.Get("Access-Control-Allow-Origin"), expose)
	}
	if r := e.do(http.MethodPost, "/v1/responses", responsesBody(false), bearer(e.key)); r.header.Get("Access-Control-Allow-Origin") != "" {
		t.Error("CORS headers without an Origin")
	}

	e.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
	_, worker := e.newDataplane(nil) // reads the settings when it starts
	var got string
	eventually(t, "the new worker exposes the usage-limit headers", func() bool {
		r := e.doWith(e.client, worker.URL, http.MethodPost, "/v1/responses", responsesBody(false), withOrigin)
		got = r.header.Get("Access-Control-Expose-Headers")
		return strings.Contains(got, "X-Should-Retry")
	})
	for _, h := range []string{"X-Codex-Primary-Used-Percent", "X-Codex-Primary-Window-Minutes", "X-Codex-Primary-Reset-At",
		"X-Codex-Secondary-Used-Percent", "X-Codex-Secondary-Window-Minutes", "X-Codex-Secondary-Reset-At"} {
		if !strings.Contains(got, h) {
			t.Errorf("expose %q lacks %s", got, h)
		}
	}

	pre := e.doWith(e.client, worker.URL, http.MethodOptions, "/v1/chat/completions", "", func(r *http.Request) {
		r.Header.Del("X-Api-Key")
		r.Header.Set("Origin", "https://ide.example")
		r.Header.Set("Access-Control-Request-Method", "POST")
		r.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
	})
	if pre.status != http.StatusNoContent || pre.header.Get("Access-Control-Allow-Methods") != "POST" ||
		pre.header.Get("Access-Control-Allow-Headers") != "authorization, content-type" {
		t.Errorf("preflight: %d %v", pre.status, pre.header)
	}
}

// TestUsageLimitAfterOutput: the quota runs out in the middle of an
// answer, when nothing can be replayed. In the retryable mode the
// upstream's terminal event goes out as it came; in the usage_limit mode,
// with the whole pool now out of quota, the terminal event carries the
// usage limit's metadata instead, on Responses and on Chat Completions.
func TestUsageLimitAfterOutput(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "codex", provider: "codex", faults: []sim.Fault{{Kind: sim.FaultUsageLimitAfterOutput, RetryAfter: 7200}}},
		{label: "oai", provider: "openai"},
	}})
	// Only the Codex account serves Responses while the OpenAI key is paused.
	if _, err := e.accounts.PauseAccount(t.Context(), connect.NewRequest(&weirv1.PauseAccountRequest{Id: "oai"})); err != nil {
		t.Fatal(err)
	}
	r := e.responses(true)
	evs := sseEvents(t, r.body)
	last := evs[len(evs)-1]
	if last[0] != "response.failed" || !strings.Contains(last[1], `"code":"usage_limit_reached"`) || strings.Contains(last[1], "model_cooldown") {
		t.Fatalf("retryable mode: last event %v", last)
	}

	e.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
	if _, err := e.accounts.ResumeAccount(t.Context(), connect.NewRequest(&weirv1.ResumeAccountRequest{Id: "codex"})); err != nil {
		t.Fatal(err) // clears the cooldown the first request wrote
	}
	if err := e.sim.AddFaults("codex", sim.Fault{Kind: sim.FaultUsageLimitAfterOutput, RetryAfter: 7200}); err != nil {
		t.Fatal(err)
	}
	r = e.responses(true)
	evs = sseEvents(t, r.body)
	if evs[len(evs)-2][0] != "response.output_text.delta" {
		t.Errorf("the output before the failure is missing: %v", evs)
	}
	last = evs[len(evs)-1]
	var failed struct {
		Response struct {
			Status string `json:"status"`
			Error  struct {
				Code      string `json:"code"`
				Type      string `json:"type"`
				ResetsAt  int64  `json:"resets_at"`
				Retryable *bool  `json:"retryable"`
				ResetTime string `json:"reset_time"`
			} `json:"error"`
		} `json:"response"`
	}
	if last[0] != "response.failed" || json.Unmarshal([]byte(last[1]), &failed) != nil {
		t.Fatalf("usage_limit mode: last event %v", last)
	}
	got := failed.Response
	if got.Status != "failed" || got.Error.Code != "model_cooldown" || got.Error.Type != "usage_limit_reached" ||
		got.Error.ResetsAt != v.Now().Add(2*time.Hour).Unix() || got.Error.Retryable == nil || *got.Error.Retryable ||
		got.Error.ResetTime != "2h0m0s" {
		t.Errorf("terminal event %s", last[1])
	}
	if ev := heldFor(t, e, r); ev.FailureStage != weirv1.FailureStage_FAILURE_STAGE_AFTER_OUTPUT {
		t.Errorf("route event stage %v", ev.FailureStage)
	}

	// Chat Completions: the OpenAI key runs out mid-answer, the Codex
	// account is still cooling (it does not serve chat anyway).
	if _, err := e.accounts.ResumeAccount(t.Context(), connect.NewRequest(&weirv1.ResumeAccountRequest{Id: "oai"})); err != nil {
		t.Fatal(err)
	}
	if err := e.sim.AddFaults("oai", sim.Fault{Kind: sim.FaultUsageLimitAfterOutput, RetryAfter: 3600}); err != nil {
		t.Fatal(err)
	}
	r = e.chat(true)
	evs = sseEvents(t, r.body)
	last = evs[len(evs)-1]
	if !strings.Contains(last[1], `"code":"model_cooldown"`) || !strings.Contains(last[1], `"reset_time":"1h0m0s"`) {
		t.Errorf("chat terminal event %v", last)
	}
}

// TestResponsesOnOpenAIKey: an OpenAI API key serves /v1/responses under
// its versioned base URL; a Codex session id keeps a conversation on one
// account of a pool.
func TestResponsesOnOpenAIKey(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "k1", provider: "openai"}, {label: "k2", provider: "openai"}}})
	withSession := func(id string) func(*http.Request) {
		return func(r *http.Request) {
			bearer(e.key)(r)
			r.Header.Set("Session-Id", id)
		}
	}
	first := map[string]string{}
	for i := range 6 {
		sess := "thread-" + strconv.Itoa(i%2)
		r := e.do(http.MethodPost, "/v1/responses", responsesBody(i%3 == 0), withSession(sess))
		if r.status != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
		acct := e.labels[e.routeEvent(r.header.Get("Weir-Request-Id")).AccountId]
		if first[sess] == "" {
			first[sess] = acct
		} else if first[sess] != acct {
			t.Errorf("%s moved from %s to %s", sess, first[sess], acct)
		}
	}
	for _, x := range e.upstream.exchanges() {
		if x.path != "/v1/responses" {
			t.Errorf("upstream path %s, want /v1/responses", x.path)
		}
	}
}
