package dataplane

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

func TestDecideUsageLimit(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	block := func(in time.Duration) *weirv1.QuotaBlock {
		return &weirv1.QuotaBlock{ResetsAt: timestamppb.New(now.Add(in)), WindowMinutes: 300,
			Provider: weirv1.Provider_PROVIDER_CODEX, LastUpstreamError: "The usage limit has been reached"}
	}
	usageLimitMode := weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT
	for _, tt := range []struct {
		name  string
		mode  weirv1.QuotaResponseMode
		block *weirv1.QuotaBlock
		want  bool
	}{
		{"retryable mode", weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_RETRYABLE, block(2 * time.Hour), false},
		{"unspecified mode", weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_UNSPECIFIED, block(2 * time.Hour), false},
		{"no block (mixed pool)", usageLimitMode, nil, false},
		{"block without a reset: beyond any threshold", usageLimitMode, &weirv1.QuotaBlock{WindowMinutes: 300,
			Provider: weirv1.Provider_PROVIDER_CODEX, LastUpstreamError: "billing"}, true},
		{"4:59", usageLimitMode, block(5*time.Minute - time.Second), false},
		{"exactly 5:00", usageLimitMode, block(5 * time.Minute), false},
		{"5:00 and a nanosecond", usageLimitMode, block(5*time.Minute + time.Nanosecond), true},
		{"5:01", usageLimitMode, block(5*time.Minute + time.Second), true},
		{"2h", usageLimitMode, block(2 * time.Hour), true},
		{"a reset already past", usageLimitMode, block(-time.Minute), false},
	} {
		ul, got := decideUsageLimit(tt.mode, tt.block, "gpt-5-codex", now)
		if got != tt.want {
			t.Errorf("%s: usage limit = %v, want %v", tt.name, got, tt.want)
			continue
		}
		if got && (ul.model != "gpt-5-codex" || ul.window != 300 || ul.known() != (tt.block.ResetsAt != nil) ||
			(ul.known() && !ul.resetsAt.Equal(tt.block.ResetsAt.AsTime())) ||
			ul.provider != weirv1.Provider_PROVIDER_CODEX || ul.lastError == "") {
			t.Errorf("%s: %+v", tt.name, ul)
		}
	}
}

func TestWriteUsageLimit(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	ul := usageLimit{model: "gpt-5-codex", provider: weirv1.Provider_PROVIDER_CODEX, resetsAt: now.Add(2 * time.Hour),
		window: 300, lastError: "The usage limit has been reached", wait: 2 * time.Hour}

	for _, sf := range []surface{surfaceResp, surfaceChat} {
		w := httptest.NewRecorder()
		w.Header().Set("Retry-After", "7200") // an upstream's, to be removed
		writeUsageLimit(w, sf, "weir_1", ul)
		if w.Code != http.StatusTooManyRequests || w.Header().Get("X-Should-Retry") != "false" || w.Header().Get("Retry-After") != "" {
			t.Errorf("%s: %d %v", sf.name, w.Code, w.Header())
		}
		h := w.Header()
		if h.Get("X-Codex-Primary-Used-Percent") != "100" || h.Get("X-Codex-Primary-Window-Minutes") != "300" ||
			h.Get("X-Codex-Primary-Reset-At") != "1893506400" || h.Get("X-Codex-Secondary-Used-Percent") != "" {
			t.Errorf("%s: codex headers %v", sf.name, h)
		}
		var body struct {
			Error map[string]any `json:"error"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		want := map[string]any{
			"type": "usage_limit_reached", "code": "model_cooldown", "resets_at": 1893506400.0, "retryable": false,
			"limit_window_minutes": 300.0, "model": "gpt-5-codex", "provider": "codex", "reset_seconds": 7200.0,
			"reset_time": "2h0m0s", "last_upstream_error": "The usage limit has been reached", "param": nil,
		}
		for k, v := range want {
			if body.Error[k] != v {
				t.Errorf("%s: error.%s = %v, want %v", sf.name, k, body.Error[k], v)
			}
		}
		msg, _ := body.Error["message"].(string)
		for _, part := range []string{"gpt-5-codex", "codex", "The usage limit has been reached", "2h0m0s"} {
			if !strings.Contains(msg, part) {
				t.Errorf("%s: message %q does not name %q", sf.name, msg, part)
			}
		}
	}

	// The weekly window: the secondary trio.
	weekly := ul
	weekly.window, weekly.resetsAt, weekly.wait = 10080, now.Add(50*time.Hour), 50*time.Hour
	w := httptest.NewRecorder()
	writeUsageLimit(w, surfaceMessages, "weir_2", weekly)
	h := w.Header()
	if h.Get("X-Codex-Secondary-Used-Percent") != "100" || h.Get("X-Codex-Secondary-Window-Minutes") != "10080" ||
		h.Get("X-Codex-Secondary-Reset-At") != "1893679200" || h.Get("X-Codex-Primary-Used-Percent") != "" {
		t.Errorf("weekly: codex headers %v", h)
	}
	var ant struct {
		Type  string `json:"type"`
		Error struct {
			Type      string `json:"type"`
			Message   string `json:"message"`
			ResetsAt  int64  `json:"resets_at"`
			Retryable *bool  `json:"retryable"`
		} `json:"error"`
		RequestID string `json:"request_id"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &ant); err != nil {
		t.Fatal(err)
	}
	if ant.Type != "error" || ant.Error.Type != "rate_limit_error" || !strings.HasSuffix(ant.Error.Message, "(reset after 50h0m0s)") ||
		ant.Error.ResetsAt != 1893679200 || ant.Error.Retryable == nil || *ant.Error.Retryable || ant.RequestID != "weir_2" {
		t.Errorf("anthropic usage limit %s", w.Body.Bytes())
	}

	// An unknown window: no rate-limit headers at all.
	unknown := ul
	unknown.window = 0
	w = httptest.NewRecorder()
	writeUsageLimit(w, surfaceResp, "weir_3", unknown)
	for k := range w.Header() {
		if strings.HasPrefix(k, "X-Codex-") {
			t.Errorf("unknown window: %s set", k)
		}
	}
}

// TestWriteUsageLimitNoReset: a pool with no known reset (out of credits)
// gets the same final answer with no reset in it at all: no resets_at,
// reset_seconds or reset_time, no X-Codex-* headers, no Retry-After, and a
// message that says what brings it back.
func TestWriteUsageLimitNoReset(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		kind weirv1.QuotaKind
		want string
	}{
		{weirv1.QuotaKind_QUOTA_KIND_OPENAI_INSUFFICIENT_QUOTA, "out of credits; an operator must add credits"},
		{weirv1.QuotaKind_QUOTA_KIND_ANTHROPIC_OUT_OF_CREDITS, "out of credits; an operator must add credits"},
		{weirv1.QuotaKind_QUOTA_KIND_CODEX_USAGE_LIMIT, "the upstream named no reset"},
	} {
		ul, ok := decideUsageLimit(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT, &weirv1.QuotaBlock{
			Provider: weirv1.Provider_PROVIDER_OPENAI, Kind: tt.kind, WindowMinutes: 300, LastUpstreamError: "You exceeded your current quota",
			Accounts: 1, AccountsWithoutReset: 1}, "gpt-5-codex", now)
		if !ok {
			t.Fatalf("%v: no usage limit", tt.kind)
		}
		for _, sf := range []surface{surfaceResp, surfaceChat, surfaceMessages} {
			w := httptest.NewRecorder()
			writeUsageLimit(w, sf, "weir_1", ul)
			h := w.Header()
			if w.Code != http.StatusTooManyRequests || h.Get("X-Should-Retry") != "false" || h.Get("Retry-After") != "" {
				t.Errorf("%v %s: %d %v", tt.kind, sf.name, w.Code, h)
			}
			for k := range h {
				if strings.HasPrefix(k, "X-Codex-") {
					t.Errorf("%v %s: %s set without a reset", tt.kind, sf.name, k)
				}
			}
			var body struct {
				Error map[string]any `json:"error"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"resets_at", "reset_seconds", "reset_time"} {
				if _, set := body.Error[k]; set {
					t.Errorf("%v %s: error.%s = %v, want none", tt.kind, sf.name, k, body.Error[k])
				}
			}
			msg, _ := body.Error["message"].(string)
			if !strings.Contains(msg, tt.want) || !strings.Contains(msg, "You exceeded your current quota") || body.Error["retryable"] != false {
				t.Errorf("%v %s: message %q retryable %v", tt.kind, sf.name, msg, body.Error["retryable"])
			}
			if sf.wire == wireOpenAI && (body.Error["type"] != "usage_limit_reached" || body.Error["code"] != "model_cooldown") {
				t.Errorf("%v %s: type %v code %v", tt.kind, sf.name, body.Error["type"], body.Error["code"])
			}
		}
	}
}

// TestQuotaError: the retryable mode's answer for a pool out of quota is
// a 429 in each surface's own words for a spent quota, never overloaded;
// X-Should-Retry is true only when the first reset comes by the hold's
// end, and a Retry-After goes out only with a known reset.
func TestQuotaError(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	retryBy := now.Add(20 * time.Minute)
	withReset := func(d time.Duration) *weirv1.QuotaBlock {
		return &weirv1.QuotaBlock{ResetsAt: timestamppb.New(now.Add(d)), WindowMinutes: 300, Provider: weirv1.Provider_PROVIDER_CODEX,
			Kind: weirv1.QuotaKind_QUOTA_KIND_CODEX_USAGE_LIMIT, LastUpstreamError: "The usage limit has been reached", Accounts: 3, AccountsWithoutReset: 1}
	}
	noReset := &weirv1.QuotaBlock{Provider: weirv1.Provider_PROVIDER_OPENAI, Kind: weirv1.QuotaKind_QUOTA_KIND_OPENAI_INSUFFICIENT_QUOTA,
		LastUpstreamError: "You exceeded your current quota", Accounts: 1, AccountsWithoutReset: 1}
	for _, tt := range []struct {
		name        string
		qb          *weirv1.QuotaBlock
		sf          surface
		typ, code   string
		shouldRetry string
		retryAfter  string
		says        string
	}{
		{"messages, reset beyond the hold", withReset(2 * time.Hour), surfaceMessages, "rate_limit_error", "", "false", "7200", "the first resets in 2h0m0s"},
		{"messages, reset within the hold", withReset(10 * time.Minute), surfaceMessages, "rate_limit_error", "", "true", "600", "the first resets in 10m0s"},
		{"messages, no reset", noReset, surfaceMessages, "rate_limit_error", "", "false", "", "out of credits; an operator must add credits"},
		{"responses, reset beyond the hold", withReset(2 * time.Hour), surfaceResp, "usage_limit_reached", "usage_limit_reached", "false", "7200", "the first resets in 2h0m0s"},
		{"responses, no reset", noReset, surfaceResp, "usage_limit_reached", "usage_limit_reached", "false", "", "out of credits"},
		{"chat, reset within the hold", withReset(time.Minute), surfaceChat, "insufficient_quota", "insufficient_quota", "true", "60", "the first resets in 1m0s"},
		{"chat, no reset", noReset, surfaceChat, "insufficient_quota", "insufficient_quota", "false", "", "out of credits"},
	} {
		none := &weirv1.NoAccount{Reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING, Message: "all cooling", QuotaBlock: tt.qb,
			RetryAt: timestamppb.New(now.Add(time.Minute))}
		e := noAccountError(none, tt.sf, "m-1", now, retryBy)
		w := httptest.NewRecorder()
		writeError(w, tt.sf.wire, "weir_1", e)
		var body struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Code    any    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		code, _ := body.Error.Code.(string)
		if w.Code != http.StatusTooManyRequests || body.Error.Type != tt.typ || code != tt.code ||
			w.Header().Get("X-Should-Retry") != tt.shouldRetry || w.Header().Get("Retry-After") != tt.retryAfter {
			t.Errorf("%s: %d type %q code %q X-Should-Retry %q Retry-After %q, want 429 %q %q %q %q", tt.name, w.Code,
				body.Error.Type, code, w.Header().Get("X-Should-Retry"), w.Header().Get("Retry-After"), tt.typ, tt.code, tt.shouldRetry, tt.retryAfter)
		}
		for _, part := range []string{tt.says, "m-1", tt.qb.LastUpstreamError} {
			if !strings.Contains(body.Error.Message, part) {
				t.Errorf("%s: message %q does not say %q", tt.name, body.Error.Message, part)
			}
		}
		if strings.Contains(strings.ToLower(w.Body.String()), "overload") {
			t.Errorf("%s: a pool out of quota called overloaded: %s", tt.name, w.Body.Bytes())
		}
	}
}

func TestWriteErrorOpenAIFormat(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		e              *apiError
		status         int
		typ, code      string
		shouldRetry    string
		retryAfterSecs string
	}{
		{errInvalidRequest("Missing required parameter: 'model'."), 400, "invalid_request_error", "", "false", ""},
		{errAuthentication("invalid API key"), 401, "invalid_request_error", "invalid_api_key", "false", ""},
		{&apiError{status: 529, typ: "overloaded_error", message: "weir: busy", retryAfter: 3 * time.Second}, 503, "server_error", "server_is_overloaded", "true", "3"},
		{errControlPlane(), 503, "server_error", "", "true", "2"},
	} {
		w := httptest.NewRecorder()
		writeError(w, wireOpenAI, "weir_x", tt.e)
		var body struct {
			Error struct {
				Message string  `json:"message"`
				Type    string  `json:"type"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		code := ""
		if body.Error.Code != nil {
			code = *body.Error.Code
		}
		if w.Code != tt.status || body.Error.Type != tt.typ || code != tt.code || body.Error.Message != tt.e.message ||
			w.Header().Get("X-Should-Retry") != tt.shouldRetry || w.Header().Get("Retry-After") != tt.retryAfterSecs {
			t.Errorf("%s: %d %v %s", tt.e.typ, w.Code, w.Header(), w.Body.Bytes())
		}
	}
}

func TestStreamCutEvent(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		sf   surface
		name string
		has  string
	}{
		{surfaceMessages, "error", `"type":"api_error"`},
		{surfaceResp, "response.failed", `"code":"server_error"`},
		{surfaceChat, "message", `"error":{`},
	} {
		evs, _ := scanAll(t, bytes.NewReader(streamCutEvent(tt.sf, "upstream stream ended unexpectedly")))
		if len(evs) != 1 || evs[0].name != tt.name || !strings.Contains(string(evs[0].data), tt.has) ||
			!json.Valid(evs[0].data) {
			t.Errorf("%s: %q", tt.sf.name, streamCutEvent(tt.sf, "x"))
		}
	}
}

func TestSessionKey(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 300)
	for _, tt := range []struct {
		name           string
		sf             surface
		header         http.Header
		userID, prompt string
		want           string
	}{
		{"claude code header", surfaceMessages, http.Header{"X-Claude-Code-Session-Id": {"cc-1"}}, "user-1", "", "cc-1"},
		{"metadata.user_id", surfaceMessages, nil, "user-1", "pk", "user-1"},
		{"codex session-id", surfaceResp, http.Header{"Session-Id": {"thread-1"}}, "", "pk", "thread-1"},
		{"codex session_id", surfaceResp, http.Header{"Session_id": {"thread-2"}}, "", "pk", "thread-2"},
		{"prompt cache key", surfaceChat, nil, "user-1", "pk", "pk"},
		{"a Claude header means nothing on OpenAI surfaces", surfaceResp, http.Header{"X-Claude-Code-Session-Id": {"cc"}}, "", "", ""},
		{"long keys are hashed", surfaceResp, http.Header{"Session-Id": {long}}, "", "", hashKey(long)},
	} {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		for k, v := range tt.header {
			r.Header[k] = v
		}
		if got := sessionKey(r, tt.sf, tt.userID, tt.prompt); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestProviderNames: the names made once are those of the enum's text,
// and a value the build does not know still gets one.
func TestProviderNames(t *testing.T) {
	t.Parallel()
	for v, name := range weirv1.Provider_name {
		want := strings.ToLower(strings.TrimPrefix(name, "PROVIDER_"))
		if v == 0 {
			want = "unknown"
		}
		if got := providerName(weirv1.Provider(v)); got != want {
			t.Errorf("providerName(%s) = %q, want %q", name, got, want)
		}
	}
	if got := providerName(weirv1.Provider(99)); got != "99" {
		t.Errorf("providerName(99) = %q, want %q", got, "99")
	}
}
