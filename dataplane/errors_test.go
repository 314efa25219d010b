package dataplane

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// anthropicError is the Anthropic error body, decoded strictly.
type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
	RequestID string `json:"request_id"`
}

// decodeAPIError checks that body is exactly the Anthropic error shape:
// {"type":"error","error":{"type","message"},"request_id"} and nothing else.
func decodeAPIError(t *testing.T, body []byte) anthropicError {
	t.Helper()
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		t.Fatalf("error body is not a JSON object: %v: %s", err, body)
	}
	if len(top) != 3 || top["type"] == nil || top["error"] == nil || top["request_id"] == nil {
		t.Fatalf("error body has keys other than type, error, request_id: %s", body)
	}
	var inner map[string]json.RawMessage
	if err := json.Unmarshal(top["error"], &inner); err != nil || len(inner) != 2 || inner["type"] == nil || inner["message"] == nil {
		t.Fatalf("error.error is not {type, message}: %s", body)
	}
	var e anthropicError
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("decode error body: %v: %s", err, body)
	}
	if e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" || e.RequestID == "" {
		t.Fatalf("error body incomplete: %s", body)
	}
	return e
}

func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		d    time.Duration
		want string
	}{
		{-5 * time.Second, "1"},
		{0, "1"},
		{time.Nanosecond, "1"},
		{999 * time.Millisecond, "1"},
		{time.Second, "1"},
		{time.Second + time.Nanosecond, "2"},
		{1500 * time.Millisecond, "2"},
		{2 * time.Second, "2"},
		{119*time.Second + 900*time.Millisecond, "120"},
		{120 * time.Second, "120"},
		{14*time.Hour + 23*time.Minute + 31*time.Second, "51811"},
	}
	for _, tt := range tests {
		if got := retryAfterSeconds(tt.d); got != tt.want {
			t.Errorf("retryAfterSeconds(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestWriteAPIError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		e          *apiError
		retryAfter string // "" means absent
		shouldRetr string
	}{
		{"retryable with wait", &apiError{status: 529, typ: "overloaded_error", message: "weir: busy", retryAfter: 1500 * time.Millisecond}, "2", "true"},
		{"final", &apiError{status: 401, typ: "authentication_error", message: "invalid API key", final: true}, "", "false"},
		{"retryable without wait", &apiError{status: 503, typ: "api_error", message: `quote " and <html> & ünïcode`}, "", "true"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := httptest.NewRecorder()
			writeAPIError(w, "weir_abc", tt.e)
			res := w.Result()
			if res.StatusCode != tt.e.status {
				t.Errorf("status = %d, want %d", res.StatusCode, tt.e.status)
			}
			if got := res.Header.Get("Content-Type"); got != "application/json" {
				t.Errorf("Content-Type = %q", got)
			}
			if got, ok := res.Header["Retry-After"]; (tt.retryAfter == "") != !ok || (ok && got[0] != tt.retryAfter) {
				t.Errorf("Retry-After = %q, want %q", got, tt.retryAfter)
			}
			if got := res.Header.Get("X-Should-Retry"); got != tt.shouldRetr {
				t.Errorf("X-Should-Retry = %q, want %q", got, tt.shouldRetr)
			}
			body, _ := io.ReadAll(res.Body)
			e := decodeAPIError(t, body)
			if e.Error.Type != tt.e.typ || e.Error.Message != tt.e.message || e.RequestID != "weir_abc" {
				t.Errorf("body = %+v", e)
			}
		})
	}
	// The exact bytes, so that a change of shape is a conscious one.
	w := httptest.NewRecorder()
	writeAPIError(w, "weir_1", &apiError{status: 400, typ: "invalid_request_error", message: "model: field required", final: true})
	if want := `{"error":{"message":"model: field required","type":"invalid_request_error"},"request_id":"weir_1","type":"error"}`; w.Body.String() != want {
		t.Errorf("body = %s, want %s", w.Body.String(), want)
	}
}

func TestNoAccountError(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(now.Add(d)) }
	tests := []struct {
		name       string
		n          *weirv1.NoAccount
		status     int
		typ        string
		retryAfter string // "" means none
		final      bool
	}{
		{"none configured", &weirv1.NoAccount{Reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED, Message: "no account"}, 503, "api_error", "", true},
		{"all disabled", &weirv1.NoAccount{Reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED, Message: "all paused"}, 503, "api_error", "", true},
		{"all cooling with a deadline", &weirv1.NoAccount{Reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING, Message: "cooling", RetryAt: at(90*time.Second + 100*time.Millisecond)}, 529, "overloaded_error", "91", false},
		{"all cooling, deadline passed", &weirv1.NoAccount{Reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING, Message: "cooling", RetryAt: at(-time.Minute)}, 529, "overloaded_error", "1", false},
		{"all cooling with rejected credentials", &weirv1.NoAccount{Reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING, Message: "cooling"}, 503, "api_error", "", true},
		{"at capacity", &weirv1.NoAccount{Reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY, Message: "full", RetryAt: at(time.Second)}, 529, "overloaded_error", "1", false},
		{"all tried", &weirv1.NoAccount{Reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_TRIED, Message: "tried"}, 529, "overloaded_error", "", false},
		{"unspecified", &weirv1.NoAccount{}, 529, "overloaded_error", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := noAccountError(tt.n, surfaceMessages, "claude-x", now, now.Add(5*time.Minute))
			if e.status != tt.status || e.typ != tt.typ || e.final != tt.final {
				t.Errorf("= {status %d type %s final %v}, want {%d %s %v}", e.status, e.typ, e.final, tt.status, tt.typ, tt.final)
			}
			if e.message != "weir: "+tt.n.GetMessage() {
				t.Errorf("message = %q", e.message)
			}
			w := httptest.NewRecorder()
			writeAPIError(w, "weir_x", e)
			if got := w.Header().Get("Retry-After"); got != tt.retryAfter {
				t.Errorf("Retry-After = %q, want %q", got, tt.retryAfter)
			}
			want := "true"
			if tt.final {
				want = "false"
			}
			if got := w.Header().Get("X-Should-Retry"); got != want {
				t.Errorf("X-Should-Retry = %q, want %q", got, want)
			}
			decodeAPIError(t, w.Body.Bytes())
		})
	}
}

func TestErrorConstructors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		e      *apiError
		status int
		typ    string
	}{
		{errInvalidRequest("x"), 400, "invalid_request_error"},
		{errAuthentication("x"), 401, "authentication_error"},
		{errTooLarge(32 << 20), 413, "request_too_large"},
		{errNotFound("x"), 404, "not_found_error"},
		{errControlPlane(), 503, "api_error"},
	} {
		if tt.e.status != tt.status || tt.e.typ != tt.typ {
			t.Errorf("%v: status %d type %s, want %d %s", tt.e, tt.e.status, tt.e.typ, tt.status, tt.typ)
		}
		if tt.status < 500 && !tt.e.final {
			t.Errorf("%v: a client error must be final", tt.e)
		}
	}
	if e := errControlPlane(); e.final || e.retryAfter <= 0 {
		t.Errorf("control plane outage must be retryable with a Retry-After: %+v", e)
	}
	if got := errTooLarge(32 << 20).message; !strings.Contains(got, "32 MiB") {
		t.Errorf("errTooLarge message = %q", got)
	}
}

// TestErrTooLargeSmallLimit: the message must state the real limit.
func TestErrTooLargeSmallLimit(t *testing.T) {
	t.Parallel()
	for limit, ok := range map[int64][]string{
		1024:    {"1024 bytes", "1 KiB"},
		3 << 19: {"1572864 bytes", "1.5 MiB"},
	} {
		msg := errTooLarge(limit).message
		if !slices.ContainsFunc(ok, func(s string) bool { return strings.Contains(msg, s) }) {
			t.Errorf("errTooLarge(%d).message = %q, want it to state one of %q", limit, msg, ok)
		}
	}
}

func TestBufferedResponseWrite(t *testing.T) {
	t.Parallel()
	future := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	tests := []struct {
		retryAfter string
		want       string // "" means removed
		check      func(string) bool
	}{
		{"30", "30", nil},
		{"1.2", "2", nil},
		{"0.001", "1", nil},
		{"0", "", nil},
		{"-3", "", nil},
		{"soon", "", nil},
		{"Wed, 21 Oct 2015 07:28:00 GMT", "", nil},
		{future, "", func(v string) bool { n, err := strconv.Atoi(v); return err == nil && n >= 85 && n <= 91 }},
	}
	for _, tt := range tests {
		b := &bufferedResponse{
			status: 529,
			header: http.Header{
				"Content-Type":              {"application/json"},
				"Retry-After":               {tt.retryAfter},
				"Request-Id":                {"req_1"},
				"Anthropic-Organization-Id": {"org"},
				"Content-Length":            {"9999"},
				"Connection":                {"close"},
			},
			body: []byte(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_1"}`),
		}
		w := httptest.NewRecorder()
		b.write(w)
		got, ok := w.Header()["Retry-After"]
		switch {
		case tt.check != nil:
			if !ok || !tt.check(got[0]) {
				t.Errorf("Retry-After %q → %q", tt.retryAfter, got)
			}
		case tt.want == "":
			if ok {
				t.Errorf("Retry-After %q → %q, want it removed", tt.retryAfter, got)
			}
		case !ok || got[0] != tt.want:
			t.Errorf("Retry-After %q → %q, want %q", tt.retryAfter, got, tt.want)
		}
		if w.Code != 529 || w.Body.String() != string(b.body) {
			t.Errorf("status %d body %s", w.Code, w.Body.String())
		}
		if got := w.Header().Get("Content-Length"); got != strconv.Itoa(len(b.body)) {
			t.Errorf("Content-Length = %q, want %d", got, len(b.body))
		}
		if w.Header().Get("Anthropic-Organization-Id") != "" || w.Header().Get("Connection") != "" {
			t.Errorf("identity or hop-by-hop header leaked: %v", w.Header())
		}
		if w.Header().Get("Request-Id") != "req_1" {
			t.Errorf("Request-Id not passed through")
		}
	}
}

func TestGatewayFailureAndStreamErrorShapes(t *testing.T) {
	t.Parallel()
	g := gatewayFailure(&inbound{requestID: "weir_gf"}, "upstream unreachable")
	if g.status != http.StatusBadGateway || g.header.Get("Content-Type") != "application/json" {
		t.Errorf("gatewayFailure = %d %v", g.status, g.header)
	}
	e := decodeAPIError(t, g.body)
	if e.Error.Type != "api_error" || e.RequestID != "weir_gf" || !strings.Contains(e.Error.Message, "upstream unreachable") {
		t.Errorf("gatewayFailure body = %+v", e)
	}

	raw := streamErrorEvent("api_error", "upstream stream ended unexpectedly")
	evs, err := scanAll(t, bytes.NewReader(raw))
	if err != io.EOF || len(evs) != 1 || evs[0].name != "error" || !bytes.Equal(evs[0].raw, raw) {
		t.Fatalf("streamErrorEvent is not one SSE event: %q (%v)", raw, err)
	}
	var data struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(evs[0].data, &data); err != nil || data.Type != "error" || data.Error.Type != "api_error" {
		t.Errorf("error event data = %s (%v)", evs[0].data, err)
	}
	if errorTypeOf(evs[0].data) != "api_error" {
		t.Error("errorTypeOf cannot read weir's own error event")
	}
}

func TestNewRequestID(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(`^weir_[0-9a-f]{24}$`)
	a, b := newRequestID(), newRequestID()
	if !re.MatchString(a) || a == b {
		t.Errorf("request ids %q, %q", a, b)
	}
}
