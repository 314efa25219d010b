package policy

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/vocab"
)

// TestDecide: every class on an API-key account with no model family, so
// each 429 here falls to the ladder's residual rung (retry-after, else the
// unified reset, else 60 s); the other rungs are in ladder_test.go.
func TestDecide(t *testing.T) {
	t.Parallel()
	now := epoch
	const (
		respond  = weirv1.Action_ACTION_RESPOND
		failover = weirv1.Action_ACTION_FAILOVER
		none     = weirv1.CooldownReason_COOLDOWN_REASON_UNSPECIFIED
		rl       = weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED
		ic       = weirv1.CooldownReason_COOLDOWN_REASON_INVALID_CREDENTIAL
		tr       = weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT
	)
	class := func(c weirv1.OutcomeClass) *weirv1.Outcome { return &weirv1.Outcome{Class: c} }
	limited := func(h map[string]string) *weirv1.Outcome {
		return &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, Headers: h}
	}
	unix := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }
	for _, tc := range []struct {
		name     string
		o        *weirv1.Outcome
		failures int32
		action   weirv1.Action
		reason   weirv1.CooldownReason
		until    time.Duration // after now
		success  bool
	}{
		{"success", class(weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS), 0, respond, none, 0, true},
		{"unspecified", class(weirv1.OutcomeClass_OUTCOME_CLASS_UNSPECIFIED), 0, respond, none, 0, false},
		{"client error", class(weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR), 0, respond, none, 0, false},
		{"stream error", class(weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR), 0, respond, none, 0, false},
		{"client canceled", class(weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED), 0, respond, none, 0, false},
		{"upstream error", class(weirv1.OutcomeClass_OUTCOME_CLASS_UPSTREAM_ERROR), 0, respond, none, 0, false},
		{"overloaded", class(weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED), 0, weirv1.Action_ACTION_RETRY_SAME, none, 0, false},
		{"overloaded, retries spent", &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, PriorOverloads: overloadRetries}, 0, failover, none, 0, false},
		{"gateway error", class(weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR), 0, failover, none, 0, false},
		{"transport", class(weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR), 0, failover, tr, 10 * time.Second, false},

		{"auth 0 failures", class(weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR), 0, failover, ic, time.Minute, false},
		{"auth 1st", class(weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR), 1, failover, ic, time.Minute, false},
		{"auth 2nd", class(weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR), 2, failover, ic, 2 * time.Minute, false},
		{"auth 3rd", class(weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR), 3, failover, ic, 4 * time.Minute, false},
		{"auth 6th", class(weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR), 6, failover, ic, 32 * time.Minute, false},
		{"auth capped", class(weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR), 7, failover, ic, time.Hour, false},
		{"auth many", class(weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR), 1 << 30, failover, ic, time.Hour, false},

		{"429 bare", limited(nil), 0, failover, rl, time.Minute, false},
		{"retry-after seconds", limited(map[string]string{"retry-after": "30"}), 0, failover, rl, 30 * time.Second, false},
		{"retry-after spaces", limited(map[string]string{"retry-after": " 7 "}), 0, failover, rl, 7 * time.Second, false},
		{"retry-after fraction", limited(map[string]string{"retry-after": "1.5"}), 0, failover, rl, 1500 * time.Millisecond, false},
		{"retry-after zero", limited(map[string]string{"retry-after": "0"}), 0, failover, rl, time.Minute, false},
		{"retry-after negative", limited(map[string]string{"retry-after": "-5"}), 0, failover, rl, time.Minute, false},
		{"retry-after garbage", limited(map[string]string{"retry-after": "soon"}), 0, failover, rl, time.Minute, false},
		{"retry-after empty", limited(map[string]string{"retry-after": ""}), 0, failover, rl, time.Minute, false},
		{"retry-after nan", limited(map[string]string{"retry-after": "NaN"}), 0, failover, rl, time.Minute, false},
		{"retry-after date", limited(map[string]string{"retry-after": now.Add(90 * time.Second).Format(http.TimeFormat)}), 0, failover, rl, 90 * time.Second, false},
		{"retry-after past date", limited(map[string]string{"retry-after": now.Add(-time.Minute).Format(http.TimeFormat)}), 0, failover, rl, time.Minute, false},
		{"retry-after date now", limited(map[string]string{"retry-after": now.Format(http.TimeFormat)}), 0, failover, rl, time.Minute, false},
		{"retry-after-ms", limited(map[string]string{"retry-after-ms": "1500"}), 0, failover, rl, 1500 * time.Millisecond, false},
		{"retry-after-ms beats retry-after", limited(map[string]string{"retry-after-ms": "500", "retry-after": "30"}), 0, failover, rl, 500 * time.Millisecond, false},
		{"retry-after-ms zero falls back", limited(map[string]string{"retry-after-ms": "0", "retry-after": "30"}), 0, failover, rl, 30 * time.Second, false},
		{"retry-after-ms garbage falls back", limited(map[string]string{"retry-after-ms": "x", "retry-after": "30"}), 0, failover, rl, 30 * time.Second, false},
		{"retry-after-ms negative", limited(map[string]string{"retry-after-ms": "-100"}), 0, failover, rl, time.Minute, false},
		{"unified reset", limited(map[string]string{"anthropic-ratelimit-unified-reset": unix(3 * time.Hour)}), 0, failover, rl, 3 * time.Hour, false},
		{"unified reset past", limited(map[string]string{"anthropic-ratelimit-unified-reset": unix(-time.Minute)}), 0, failover, rl, time.Minute, false},
		{"unified reset now", limited(map[string]string{"anthropic-ratelimit-unified-reset": unix(0)}), 0, failover, rl, time.Minute, false},
		{"unified reset garbage", limited(map[string]string{"anthropic-ratelimit-unified-reset": "tomorrow"}), 0, failover, rl, time.Minute, false},
		{"unified reset as a date", limited(map[string]string{"anthropic-ratelimit-unified-reset": now.Add(time.Hour).Format(time.RFC3339)}), 0, failover, rl, time.Minute, false},
		{"unified reset absurdly far", limited(map[string]string{"anthropic-ratelimit-unified-reset": unix(9 * 24 * time.Hour)}), 0, failover, rl, time.Minute, false},
		{"unified reset at the 8-day bound", limited(map[string]string{"anthropic-ratelimit-unified-reset": unix(8 * 24 * time.Hour)}), 0, failover, rl, 8 * 24 * time.Hour, false},
		{"retry-after beats unified reset", limited(map[string]string{"retry-after": "20", "anthropic-ratelimit-unified-reset": unix(time.Hour)}), 0, failover, rl, 20 * time.Second, false},
		{"bad retry-after, unified reset", limited(map[string]string{"retry-after": "-1", "anthropic-ratelimit-unified-reset": unix(time.Hour)}), 0, failover, rl, time.Hour, false},

		{"bytes: rate limited", &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, BytesToClient: true}, 0, respond, rl, time.Minute, false},
		{"bytes: overloaded", &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, BytesToClient: true}, 0, respond, none, 0, false},
		{"bytes: transport", &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, BytesToClient: true}, 0, respond, tr, 10 * time.Second, false},
		{"bytes: auth", &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR, BytesToClient: true}, 1, respond, ic, time.Minute, false},
		{"bytes: success", &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, BytesToClient: true}, 0, respond, none, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.o, Facts{AuthFailures: tc.failures}, now)
			if d.Action != tc.action {
				t.Errorf("action %v, want %v", d.Action, tc.action)
			}
			if d.Success != tc.success {
				t.Errorf("success %v", d.Success)
			}
			if d.AuthFailure != (tc.o.Class == weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR) {
				t.Errorf("authFailure %v", d.AuthFailure)
			}
			if tc.reason == none {
				if d.Cooldown != nil {
					t.Errorf("cooldown %v until now+%v", d.Cooldown.Reason, d.Cooldown.Until.Sub(now))
				}
				return
			}
			if d.Cooldown == nil {
				t.Fatalf("no cooldown, want %v", tc.reason)
			}
			if d.Cooldown.Reason != tc.reason || !d.Cooldown.Until.Equal(now.Add(tc.until)) {
				t.Errorf("cooldown %v until now+%v, want %v until now+%v", d.Cooldown.Reason, d.Cooldown.Until.Sub(now), tc.reason, tc.until)
			}
			var ev Evidence
			if err := json.Unmarshal(d.Cooldown.Evidence, &ev); err != nil || ev.Class != vocab.Name(tc.o.Class) {
				t.Errorf("evidence %s (%v)", d.Cooldown.Evidence, err)
			}
		})
	}
}

// TestDecideAbsurdRetryAfter: a Retry-After too large for a time.Duration
// (or "inf", which ParseFloat accepts) overflows into a negative duration,
// so the 429 writes a cooldown that ended centuries ago and the account is
// hammered again at once.
func TestDecideAbsurdRetryAfter(t *testing.T) {
	t.Parallel()
	now := epoch
	for _, h := range []map[string]string{
		{"retry-after": "inf"},
		{"retry-after": "1e30"},
		{"retry-after": "99999999999"},
		{"retry-after-ms": "1e300"},
	} {
		d := Decide(&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, Headers: h}, Facts{}, now)
		if d.Cooldown == nil || !d.Cooldown.Until.After(now) {
			t.Errorf("%v: cooldown until %v is not in the future", h, d.Cooldown.Until)
		}
	}
}

func TestEvidence(t *testing.T) {
	t.Parallel()
	o := &weirv1.Outcome{
		Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, ErrorType: "rate_limit_error",
		Headers: map[string]string{
			"retry-after": "30", "anthropic-ratelimit-unified-status": "rejected", "x-other": "1",
		},
		Usage: &weirv1.TokenUsage{InputTokens: 5},
	}
	raw := EvidenceOf(o)
	var ev Evidence
	if err := json.Unmarshal(raw, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Class != "rate_limited" || ev.Status != 429 || ev.ErrorType != "rate_limit_error" || ev.Headers["x-other"] != "1" {
		t.Errorf("evidence %+v", ev)
	}
	for _, tc := range []struct {
		raw  []byte
		want string
	}{
		{raw, "rate_limited, status 429, rate_limit_error, retry-after 30, unified rejected"},
		{EvidenceOf(&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, TransportError: "read: connection reset"}),
			"transport_error, read: connection reset"},
		{EvidenceOf(&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, TransportError: "no such host",
			TransportCause: weirv1.TransportCause_TRANSPORT_CAUSE_DNS}), "transport_error, dns: no such host"},
		{EvidenceOf(&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, TransportError: "odd",
			TransportCause: weirv1.TransportCause(99)}), "transport_error, other: odd"},
		{EvidenceOf(&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR, Status: 401}), "auth_error, status 401"},
		{[]byte(`{"class":"x"}`), "x"},
		{[]byte(`not json`), ""},
		{nil, ""},
	} {
		if got := EvidenceSummary(tc.raw); got != tc.want {
			t.Errorf("EvidenceSummary(%s) = %q, want %q", tc.raw, got, tc.want)
		}
	}
}

// TestDecideOverloadLadder: an overload is retried once on the same account
// after 1 s, then another account is tried; no cooldown is ever written
// for it.
func TestDecideOverloadLadder(t *testing.T) {
	t.Parallel()
	want := []time.Duration{time.Second}
	for prior, wait := range want {
		d := Decide(&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, Status: 529, PriorOverloads: int32(prior)}, Facts{}, epoch)
		if d.Action != weirv1.Action_ACTION_RETRY_SAME || d.RetryAfter != wait || d.Cooldown != nil || !d.Overload {
			t.Errorf("prior %d: %+v, want retry same after %v without cooldown", prior, d, wait)
		}
	}
	for _, prior := range []int32{int32(len(want)), 2, 7} {
		d := Decide(&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, PriorOverloads: prior}, Facts{}, epoch)
		if d.Action != weirv1.Action_ACTION_FAILOVER || d.RetryAfter != 0 || !d.Overload {
			t.Errorf("after %d overloads: %+v, want failover", prior, d)
		}
	}
	// Another account answered within the last seconds: the first
	// overload fails over at once, a peer serves it in milliseconds.
	d := Decide(&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, Status: 529}, Facts{OthersAnswering: true}, epoch)
	if d.Action != weirv1.Action_ACTION_FAILOVER || d.RetryAfter != 0 || d.Cooldown != nil || !d.Overload {
		t.Errorf("others answering: %+v, want failover at once without cooldown", d)
	}
}

// TestDecideRedeliveredAndStale: Decide dates a redelivered report by its
// delay, drops a cooldown already over and a stale credential's
// rejection, and lets only fresh evidence (or any success) move a
// breaker.
func TestDecideRedeliveredAndStale(t *testing.T) {
	t.Parallel()
	now := epoch
	late := func(o *weirv1.Outcome, d time.Duration) *weirv1.Outcome { o.Delay = durationpb.New(d); return o }
	rl := func() *weirv1.Outcome {
		return &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429,
			Headers: map[string]string{"retry-after": "60"}}
	}
	if d := Decide(late(rl(), 20*time.Second), Facts{Family: "opus"}, now); d.Cooldown == nil ||
		!d.Cooldown.Until.Equal(now.Add(40*time.Second)) || d.Breaker != BreakerUnchanged {
		t.Errorf("20 s late: cooldown %+v breaker %v, want until now+40s from the attempt's end, breaker unchanged", d.Cooldown, d.Breaker)
	}
	if d := Decide(late(rl(), 2*time.Minute), Facts{Family: "opus"}, now); d.Cooldown != nil {
		t.Errorf("2 min late: cooldown %+v, want none (already over)", d.Cooldown)
	}
	if d := Decide(late(rl(), time.Hour), Facts{}, now); d.Cooldown != nil {
		t.Errorf("an hour late (dated at most 10 min back): cooldown %+v, want none", d.Cooldown)
	}
	auth := &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR, Status: 401}
	if d := Decide(auth, Facts{AuthFailures: 1, Stale: true, Family: "opus"}, now); d.Cooldown != nil || d.AuthFailure || d.Action != actFailover {
		t.Errorf("stale rejection: %+v, want no cooldown, no auth failure, failover", d)
	}
	if d := Decide(auth, Facts{AuthFailures: 1}, now); d.Cooldown == nil || !d.AuthFailure {
		t.Errorf("rejection: %+v, want a cooldown and an auth failure", d)
	}
	for _, tc := range []struct {
		class  weirv1.OutcomeClass
		delay  time.Duration
		family string
		want   BreakerChange
	}{
		{weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, 0, "opus", BreakerClose},
		{weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, time.Minute, "opus", BreakerClose},
		{weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, 0, "", BreakerUnchanged},
		{weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, 0, "opus", BreakerClose},
		{weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR, 10 * time.Second, "opus", BreakerClose},
		{weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR, 11 * time.Second, "opus", BreakerUnchanged},
		{weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, 0, "opus", BreakerOverload},
		{weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, 30 * time.Second, "opus", BreakerUnchanged},
		{weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, 0, "", BreakerUnchanged},
		{weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, 0, "opus", BreakerFreeProbe},
		{weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR, 0, "opus", BreakerFreeProbe},
		{weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR, 0, "opus", BreakerFreeProbe},
		{weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED, 0, "opus", BreakerFreeProbe},
	} {
		o := late(&weirv1.Outcome{Class: tc.class}, tc.delay)
		if got := Decide(o, Facts{Family: tc.family}, now).Breaker; got != tc.want {
			t.Errorf("%v %v late, family %q: breaker %v, want %v", tc.class, tc.delay, tc.family, got, tc.want)
		}
	}
}
