package policy

import (
	"maps"
	"net/http"
	"testing"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// The upstream captures in dataplane/testdata/captures, as the control
// plane receives them: the outcome class the worker reports and the
// decision headers it picked (copied from dataplane/captures_test.go; the
// control plane does not import the worker). now is each capture's Date.
var captureOutcomes = []struct {
	name    string
	date    string
	class   weirv1.OutcomeClass
	status  int32
	errType string
	headers map[string]string
}{
	{"429-weekly-rejected", "Sun, 02 Aug 2026 15:36:29 GMT", weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, 429, "rate_limit_error", map[string]string{
		"retry-after":                        "51811",
		"x-should-retry":                     "true",
		"request-id":                         "req_011CUqT6mF3x9wZ7yKp2VdQe",
		"anthropic-ratelimit-unified-status": "rejected",
		"anthropic-ratelimit-unified-reset":  "1785736800",
		"anthropic-ratelimit-unified-representative-claim":    "seven_day_overage_included",
		"anthropic-ratelimit-unified-fallback-percentage":     "0.5",
		"anthropic-ratelimit-unified-5h-status":               "allowed",
		"anthropic-ratelimit-unified-5h-utilization":          "0.21",
		"anthropic-ratelimit-unified-5h-reset":                "1785700800",
		"anthropic-ratelimit-unified-7d-status":               "allowed_warning",
		"anthropic-ratelimit-unified-7d-utilization":          "0.94",
		"anthropic-ratelimit-unified-7d-reset":                "1785736800",
		"anthropic-ratelimit-unified-7d-surpassed-threshold":  "0.75",
		"anthropic-ratelimit-unified-7d_oi-status":            "rejected",
		"anthropic-ratelimit-unified-7d_oi-utilization":       "1.0",
		"anthropic-ratelimit-unified-7d_oi-reset":             "1785736800",
		"anthropic-ratelimit-unified-overage-status":          "rejected",
		"anthropic-ratelimit-unified-overage-disabled-reason": "org_level_disabled",
	}},
	{"429-burst", "Sun, 02 Aug 2026 15:40:00 GMT", weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, 429, "rate_limit_error",
		map[string]string{"retry-after": "2", "x-should-retry": "true", "request-id": "req_011CUqTb4s2GkV1nZpR8oYwA"}},
	{"529-overloaded", "Sun, 02 Aug 2026 15:41:12 GMT", weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, 529, "overloaded_error",
		map[string]string{"x-should-retry": "true", "request-id": "req_011CUqTh7NwQ2rLzX5cV9mBe"}},
	{"503-api-error", "Sun, 02 Aug 2026 15:42:03 GMT", weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, 503, "api_error",
		map[string]string{"x-should-retry": "true", "request-id": "req_011CUqTm1aYbZc3dEf4gHi5j"}},
	{"200-stream-overloaded-event", "Sun, 02 Aug 2026 15:43:45 GMT", weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, 200, "overloaded_error", map[string]string{
		"request-id":                                          "req_011CUqTr9kLmNoPqRsTuVwXy",
		"anthropic-ratelimit-unified-status":                  "allowed",
		"anthropic-ratelimit-unified-reset":                   "1785700800",
		"anthropic-ratelimit-unified-representative-claim":    "five_hour",
		"anthropic-ratelimit-unified-fallback-percentage":     "0.5",
		"anthropic-ratelimit-unified-5h-status":               "allowed",
		"anthropic-ratelimit-unified-5h-utilization":          "0.31",
		"anthropic-ratelimit-unified-5h-reset":                "1785700800",
		"anthropic-ratelimit-unified-7d-status":               "allowed",
		"anthropic-ratelimit-unified-7d-utilization":          "0.58",
		"anthropic-ratelimit-unified-7d-reset":                "1785736800",
		"anthropic-ratelimit-unified-overage-status":          "rejected",
		"anthropic-ratelimit-unified-overage-disabled-reason": "org_level_disabled",
	}},
	{"200-api-key-ratelimit", "Sun, 02 Aug 2026 15:44:10 GMT", weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, 200, "", map[string]string{
		"request-id":                                  "req_011CUqTw2bCdEfGhIjKlMnOp",
		"anthropic-ratelimit-requests-limit":          "4000",
		"anthropic-ratelimit-requests-remaining":      "3999",
		"anthropic-ratelimit-requests-reset":          "2026-08-02T15:44:11Z",
		"anthropic-ratelimit-tokens-limit":            "2400000",
		"anthropic-ratelimit-tokens-remaining":        "2399000",
		"anthropic-ratelimit-tokens-reset":            "2026-08-02T15:44:11Z",
		"anthropic-ratelimit-input-tokens-limit":      "2000000",
		"anthropic-ratelimit-input-tokens-remaining":  "1999000",
		"anthropic-ratelimit-input-tokens-reset":      "2026-08-02T15:44:11Z",
		"anthropic-ratelimit-output-tokens-limit":     "400000",
		"anthropic-ratelimit-output-tokens-remaining": "400000",
		"anthropic-ratelimit-output-tokens-reset":     "2026-08-02T15:44:10Z",
	}},
	{"401-authentication-error", "Sun, 02 Aug 2026 15:45:00 GMT", weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR, 401, "authentication_error",
		map[string]string{"x-should-retry": "false", "request-id": "req_011CUqU1dEfGhIjKlMnOpQrS"}},
	{"400-invalid-request", "Sun, 02 Aug 2026 15:45:30 GMT", weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR, 400, "invalid_request_error",
		map[string]string{"x-should-retry": "false", "request-id": "req_011CUqU4gHiJkLmNoPqRsTuV"}},
	{"502-gateway-html", "Sun, 02 Aug 2026 15:46:00 GMT", weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR, 502, "", map[string]string{}},
	{"429-retry-after-date", "Sun, 02 Aug 2026 15:36:29 GMT", weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, 429, "rate_limit_error",
		map[string]string{"retry-after": "Sun, 02 Aug 2026 15:38:00 GMT", "x-should-retry": "true", "request-id": "req_011CUqU9jKlMnOpQrStUvWxY"}},
}

func TestDecideCaptures(t *testing.T) {
	t.Parallel()
	type want struct {
		action     weirv1.Action
		reason     weirv1.CooldownReason // UNSPECIFIED: no cooldown
		until      time.Time             // the cooldown's, or the gate's
		gate       bool                  // a family gate for opus instead of a cooldown
		retryAfter time.Duration
		success    bool
		overload   bool
		summary    string // evidenceSummary of the stored evidence
	}
	date := func(s string) time.Time {
		t.Helper()
		d, err := http.ParseTime(s)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	const (
		failover  = weirv1.Action_ACTION_FAILOVER
		respond   = weirv1.Action_ACTION_RESPOND
		retrySame = weirv1.Action_ACTION_RETRY_SAME
		limited   = weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED
	)
	wants := map[string]want{
		// Only the scoped 7d_oi window is spent; 5h and 7d still have room
		// (7d at 0.94 is a warning, not a rejection). The account keeps
		// serving other families: an opus gate until the window's reset,
		// no account-wide cooldown.
		"429-weekly-rejected": {action: failover, gate: true, until: time.Unix(1785736800, 0),
			summary: "rate_limited, status 429, rate_limit_error, retry-after 51811, unified rejected, 7d_oi rejected"},
		"429-burst": {action: failover, reason: limited, until: date("Sun, 02 Aug 2026 15:40:02 GMT"),
			summary: "rate_limited, status 429, rate_limit_error, retry-after 2"},
		"529-overloaded":              {action: retrySame, retryAfter: time.Second, overload: true},
		"503-api-error":               {action: retrySame, retryAfter: time.Second, overload: true},
		"200-stream-overloaded-event": {action: retrySame, retryAfter: time.Second, overload: true},
		"200-api-key-ratelimit":       {action: respond, success: true},
		"401-authentication-error": {action: failover, reason: weirv1.CooldownReason_COOLDOWN_REASON_INVALID_CREDENTIAL,
			until: date("Sun, 02 Aug 2026 15:46:00 GMT"), summary: "auth_error, status 401, authentication_error"},
		"400-invalid-request": {action: respond},
		"502-gateway-html":    {action: failover},
		"429-retry-after-date": {action: failover, reason: limited, until: date("Sun, 02 Aug 2026 15:38:00 GMT"),
			summary: "rate_limited, status 429, rate_limit_error, retry-after Sun, 02 Aug 2026 15:38:00 GMT"},
	}
	if len(wants) != len(captureOutcomes) {
		t.Fatalf("%d expectations for %d captures", len(wants), len(captureOutcomes))
	}
	for _, c := range captureOutcomes {
		t.Run(c.name, func(t *testing.T) {
			w, ok := wants[c.name]
			if !ok {
				t.Fatalf("no expectation for %s", c.name)
			}
			now := date(c.date)
			o := &weirv1.Outcome{Class: c.class, Status: c.status, ErrorType: c.errType, Headers: maps.Clone(c.headers)}
			d := Decide(o, captureFacts(c.headers), now)
			if d.Action != w.action || d.RetryAfter != w.retryAfter || d.Success != w.success || d.Overload != w.overload {
				t.Errorf("decision %v retry_after %v success %v overload %v, want %v %v %v %v",
					d.Action, d.RetryAfter, d.Success, d.Overload, w.action, w.retryAfter, w.success, w.overload)
			}
			if w.gate {
				if d.Cooldown != nil {
					t.Errorf("cooldown %v until %v, want a family gate only", d.Cooldown.Reason, d.Cooldown.Until)
				}
				if d.Gate == nil || d.Gate.Family != "opus" || !d.Gate.Until.Equal(w.until) {
					t.Fatalf("gate %+v, want opus until %v", d.Gate, w.until)
				}
				if got := EvidenceSummary(d.Gate.Evidence); got != w.summary {
					t.Errorf("evidence %q, want %q", got, w.summary)
				}
				return
			}
			if d.Gate != nil {
				t.Errorf("gate %+v, want none", d.Gate)
			}
			if w.reason == weirv1.CooldownReason_COOLDOWN_REASON_UNSPECIFIED {
				if d.Cooldown != nil {
					t.Errorf("cooldown %v until %v, want none", d.Cooldown.Reason, d.Cooldown.Until)
				}
				return
			}
			if d.Cooldown == nil {
				t.Fatalf("no cooldown, want %v until %v", w.reason, w.until)
			}
			if d.Cooldown.Reason != w.reason || !d.Cooldown.Until.Equal(w.until) {
				t.Errorf("cooldown %v until %v (now%+v), want %v until %v", d.Cooldown.Reason, d.Cooldown.Until,
					d.Cooldown.Until.Sub(now), w.reason, w.until)
			}
			if got := EvidenceSummary(d.Cooldown.Evidence); got != w.summary {
				t.Errorf("evidence %q, want %q", got, w.summary)
			}
		})
	}
}

// captureFacts is the account a capture came from: the unified headers
// come only from subscription (OAuth) accounts; the weekly capture was a
// request for an opus model.
func captureFacts(h map[string]string) Facts {
	_, oauth := h["anthropic-ratelimit-unified-status"]
	return Facts{AuthFailures: 1, OAuth: oauth, Family: "opus"}
}

// TestDecideWeeklyCaptureWithoutRetryAfter: if something on the way drops
// retry-after and the scoped window's own reset, the representative
// claim's unified reset still gates the family until the weekly window
// ends, not for the one-hour default.
func TestDecideWeeklyCaptureWithoutRetryAfter(t *testing.T) {
	t.Parallel()
	c := captureOutcomes[0]
	if c.name != "429-weekly-rejected" {
		t.Fatalf("first capture is %s", c.name)
	}
	h := maps.Clone(c.headers)
	delete(h, "retry-after")
	delete(h, "anthropic-ratelimit-unified-7d_oi-reset")
	now, err := http.ParseTime(c.date)
	if err != nil {
		t.Fatal(err)
	}
	d := Decide(&weirv1.Outcome{Class: c.class, Status: c.status, Headers: h}, captureFacts(h), now)
	if d.Cooldown != nil || d.Gate == nil || !d.Gate.Until.Equal(time.Unix(1785736800, 0)) {
		t.Fatalf("cooldown %+v gate %+v, want an opus gate until the unified reset 1785736800", d.Cooldown, d.Gate)
	}
	if d.Gate.Until.Sub(now) != 51811*time.Second {
		t.Errorf("gate of %v, want 51811s", d.Gate.Until.Sub(now))
	}
}
