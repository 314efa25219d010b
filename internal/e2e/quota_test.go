package e2e

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/clock"
	"github.com/weirhq/weir/internal/sim"
)

// Pools out of quota of every kind, end to end: evidence with a reset (a
// spent window, a Codex usage limit), and evidence with none (OpenAI's
// insufficient_quota, Anthropic's out_of_credits), in mixed pools of
// subscriptions and metered keys. Every test runs on the virtual clock:
// an answer "at once" is one for which the clock did not move.

// spentCodex is a ChatGPT login whose five-hour window is full until resetIn.
func spentCodex(label string, resetIn time.Duration) account {
	return account{label: label, provider: "codex", windows: &sim.Windows{
		FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(resetIn)}}}
}

// brokeKey is an OpenAI key that answers insufficient_quota to everything.
func brokeKey(label string) account {
	return account{label: label, provider: "openai", faults: []sim.Fault{{Kind: sim.FaultInsufficientQuota, Times: -1}}}
}

// outOfCredits is a Claude subscription whose five-hour window is full and
// whose extra usage cannot pay for more (overage-disabled-reason
// out_of_credits).
func outOfCredits(label string) account {
	return account{label: label, oauth: true, windows: &sim.Windows{
		FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(time.Hour)},
		Overage:  &sim.Overage{Status: "rejected", DisabledReason: "out_of_credits"}}}
}

// errorFields decodes an error body's error object as a map, to tell a
// field that is absent from one that is zero.
func errorFields(t *testing.T, r response) map[string]any {
	t.Helper()
	var body struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil || body.Error == nil {
		t.Fatalf("error body %s: %v", r.body, err)
	}
	return body.Error
}

// answeredAtOnce checks that a request was answered without waiting: the
// virtual clock did not move, and its route event shows no hold.
func answeredAtOnce(t *testing.T, e *env, v *clock.Manual, start time.Time, r response) {
	t.Helper()
	if v.Now() != start {
		t.Errorf("the worker waited %v for quota that cannot recover within the hold", v.Now().Sub(start))
	}
	if ev := heldFor(t, e, r); ev.HoldCount != 0 || ev.Duration.AsDuration() > 2*time.Second {
		t.Errorf("route event: %d holds, %v, want an answer within 2 s", ev.HoldCount, ev.Duration.AsDuration())
	}
}

// checkNoReset checks a final usage limit with no known reset: no reset
// anywhere, and a message that says what brings the pool back.
func checkNoReset(t *testing.T, r response, says string) {
	t.Helper()
	if r.status != http.StatusTooManyRequests || r.header.Get("X-Should-Retry") != "false" || r.header.Get("Retry-After") != "" {
		t.Fatalf("%d X-Should-Retry %q Retry-After %q, want 429 false none: %s", r.status, r.header.Get("X-Should-Retry"),
			r.header.Get("Retry-After"), r.body)
	}
	for k := range r.header {
		if strings.HasPrefix(k, "X-Codex-") {
			t.Errorf("%s set with no known reset", k)
		}
	}
	got := errorFields(t, r)
	for _, k := range []string{"resets_at", "reset_seconds", "reset_time"} {
		if v, ok := got[k]; ok {
			t.Errorf("error.%s = %v with no known reset", k, v)
		}
	}
	if msg, _ := got["message"].(string); !strings.Contains(msg, says) || got["retryable"] != false {
		t.Errorf("message %q retryable %v, want it to say %q and retryable false", msg, got["retryable"], says)
	}
}

// TestQuotaMixedPoolUsageLimitCodex: the reported failure. Both ChatGPT
// logins out of quota and the pool's OpenAI key answering
// insufficient_quota: in the usage_limit mode the Codex client gets the
// final usage limit with the earliest known reset (the key's own quota
// has none) at once, streaming or not, and the requests after it without
// an upstream attempt. With only the key left, the usage limit says the
// pool is out of credits and names no reset.
func TestQuotaMixedPoolUsageLimitCodex(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		spentCodex("a", 2*time.Hour), spentCodex("b", 3*time.Hour), brokeKey("oai"),
	}})
	e.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
	start := v.Now()
	reset := start.Add(2 * time.Hour)
	for i, stream := range []bool{false, true, false} {
		r := e.responses(stream)
		checkUsageLimitHeaders(t, r, 300, reset)
		var ul usageLimitBody
		if err := json.Unmarshal(r.body, &ul); err != nil {
			t.Fatal(err)
		}
		if got := ul.Error; got.Type != "usage_limit_reached" || got.Code != "model_cooldown" || got.ResetsAt != reset.Unix() ||
			got.ResetTime != "2h0m0s" || got.Provider != "codex" {
			t.Errorf("request %d: usage limit %+v, want codex a's reset in 2h", i, got)
		}
		answeredAtOnce(t, e, v, start, r)
	}
	if n := len(e.attempts()); n != 3 {
		t.Errorf("%d upstream attempts %v, want one per account, then none", n, e.attempts())
	}

	// Only the key: out of credits, with no reset to name.
	k := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{brokeKey("oai")}})
	k.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
	for _, stream := range []bool{false, true} {
		r := k.responses(stream)
		checkNoReset(t, r, "out of credits; an operator must add credits")
		if got := errorFields(t, r); got["type"] != "usage_limit_reached" || got["code"] != "model_cooldown" || got["provider"] != "openai" ||
			!strings.Contains(got["last_upstream_error"].(string), "exceeded your current quota") {
			t.Errorf("usage limit %v", got)
		}
		answeredAtOnce(t, k, v, start, r)
	}
}

// TestQuotaMixedPoolUsageLimitMessages: Claude Code's surface. A
// subscription with a spent five-hour window, one out of credits (its
// spent window's reset does not bring it back: its cooldown names no
// reset) and a metered key whose quota resets first: the final usage limit
// names the key's reset, the earliest known. Out of credits alone, it
// names none.
func TestQuotaMixedPoolUsageLimitMessages(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "max", oauth: true, windows: &sim.Windows{FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(3 * time.Hour)}}},
		outOfCredits("broke"),
		{label: "key", faults: []sim.Fault{{Kind: sim.FaultRateLimit, Times: -1,
			Unified: &sim.UnifiedRejection{Claim: sim.ClaimFiveHour, ResetIn: sim.Duration(2 * time.Hour)}}}},
	}})
	e.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
	start := v.Now()
	reset := start.Add(2 * time.Hour)
	for i, stream := range []bool{false, true} {
		r := e.post(stream)
		checkUsageLimitHeaders(t, r, 300, reset)
		got := errorFields(t, r)
		if got["type"] != "rate_limit_error" || got["resets_at"] != float64(reset.Unix()) || got["retryable"] != false ||
			!strings.HasSuffix(got["message"].(string), "(reset after 2h0m0s)") {
			t.Errorf("request %d: %s", i, r.body)
		}
		answeredAtOnce(t, e, v, start, r)
	}
	if n := len(e.attempts()); n != 3 {
		t.Errorf("%d upstream attempts %v, want one per account, then none", n, e.attempts())
	}
	if cd := e.account("broke").Cooldown; cd.GetReason() != weirv1.CooldownReason_COOLDOWN_REASON_OUT_OF_CREDITS ||
		cd.GetQuota().GetKind() != weirv1.QuotaKind_QUOTA_KIND_ANTHROPIC_OUT_OF_CREDITS || cd.GetQuota().GetResetsAt() != nil {
		t.Errorf("broke: cooldown %v, want out_of_credits with its quota evidence and no reset", cd)
	}

	o := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{outOfCredits("broke")}})
	o.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
	for _, stream := range []bool{false, true} {
		r := o.post(stream)
		checkNoReset(t, r, "out of credits; an operator must add credits")
		answeredAtOnce(t, o, v, start, r)
	}
}

// TestQuotaRetryableModeNotOverloaded: the default mode. A pool out of
// quota, once weir answers for it, gets a 429 in the client's own words
// for a spent quota, never "overloaded": rate_limit_error on Messages,
// usage_limit_reached on Responses, insufficient_quota on Chat
// Completions; X-Should-Retry false since nothing resets within the hold;
// a Retry-After only with a known reset; a message naming the cause; at
// once.
func TestQuotaRetryableModeNotOverloaded(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		spentCodex("a", 2*time.Hour), brokeKey("oai"), outOfCredits("broke"),
	}})
	start := v.Now()
	// The first requests meet the upstreams' own answers (passed on as
	// they came); from then on weir knows and answers itself.
	e.responses(false)
	e.post(false)
	e.chat(false)
	for _, tt := range []struct {
		name       string
		do         func() response
		typ, code  string
		retryAfter string
		says       string
	}{
		{"responses", func() response { return e.responses(false) }, "usage_limit_reached", "usage_limit_reached",
			strconv.Itoa(int((2 * time.Hour).Seconds())), "out of usage quota; the first resets in 2h0m0s"},
		{"messages", func() response { return e.post(false) }, "rate_limit_error", "", "", "out of credits; an operator must add credits"},
		{"chat", func() response { return e.chat(false) }, "insufficient_quota", "insufficient_quota", "", "out of credits; an operator must add credits"},
	} {
		r := tt.do()
		if r.status != http.StatusTooManyRequests || r.header.Get("X-Should-Retry") != "false" || r.header.Get("Retry-After") != tt.retryAfter {
			t.Errorf("%s: %d X-Should-Retry %q Retry-After %q, want 429 false %q: %s", tt.name, r.status,
				r.header.Get("X-Should-Retry"), r.header.Get("Retry-After"), tt.retryAfter, r.body)
		}
		got := errorFields(t, r)
		code, _ := got["code"].(string)
		if got["type"] != tt.typ || code != tt.code || !strings.Contains(got["message"].(string), tt.says) {
			t.Errorf("%s: %s, want type %q code %q saying %q", tt.name, r.body, tt.typ, tt.code, tt.says)
		}
		if strings.Contains(strings.ToLower(string(r.body)), "overload") || strings.Contains(string(r.body), "model_cooldown") {
			t.Errorf("%s: %s, want a retryable-mode quota error", tt.name, r.body)
		}
		answeredAtOnce(t, e, v, start, r)
	}
}
