package policy

import (
	"encoding/json"
	"maps"
	"net/http"
	"os"
	"testing"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// captureOutcome is one upstream capture (dataplane/testdata/captures) as
// the control plane receives it: the outcome the worker reports and the
// capture's Date, which is now for the decision. The worker's test of the
// same captures (dataplane/captures_test.go TestCapturesThroughAttempt)
// checks outcomes.json against what attempt() reports, so the two sides
// read one table.
type captureOutcome struct {
	name    string
	date    string
	class   weirv1.OutcomeClass
	status  int32
	errType string
	headers map[string]string
}

const outcomesFile = "../../dataplane/testdata/captures/outcomes.json"

func readCaptureOutcomes(t testing.TB) []captureOutcome {
	t.Helper()
	raw, err := os.ReadFile(outcomesFile)
	if err != nil {
		t.Fatal(err)
	}
	var list []struct {
		Capture   string            `json:"capture"`
		Date      string            `json:"date"`
		Class     string            `json:"class"`
		Status    int32             `json:"status"`
		ErrorType string            `json:"error_type"`
		Headers   map[string]string `json:"headers"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		t.Fatalf("%s: %v", outcomesFile, err)
	}
	if len(list) == 0 {
		t.Fatalf("%s lists no captures", outcomesFile)
	}
	out := make([]captureOutcome, 0, len(list))
	for _, r := range list {
		class, ok := weirv1.OutcomeClass_value[r.Class]
		if !ok {
			t.Fatalf("%s: %s: unknown class %q", outcomesFile, r.Capture, r.Class)
		}
		out = append(out, captureOutcome{r.Capture, r.Date, weirv1.OutcomeClass(class), r.Status, r.ErrorType, r.Headers})
	}
	return out
}

// captureNamed is one capture of outcomes.json.
func captureNamed(t testing.TB, name string) captureOutcome {
	t.Helper()
	for _, c := range readCaptureOutcomes(t) {
		if c.name == name {
			return c
		}
	}
	t.Fatalf("no %s in %s", name, outcomesFile)
	return captureOutcome{}
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
	captureOutcomes := readCaptureOutcomes(t)
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
	c := captureNamed(t, "429-weekly-rejected")
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
