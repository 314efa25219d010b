package policy

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/vocab"
)

// Quota evidence, pure: how Decide() turns a provider's explicit quota
// answer (and the Anthropic ladder's spent windows) into a cooldown with
// its quota record, and how routing tells a pool that is out of quota from
// one that is merely busy.

const (
	kindCodex        = weirv1.QuotaKind_QUOTA_KIND_CODEX_USAGE_LIMIT
	kindInsufficient = weirv1.QuotaKind_QUOTA_KIND_OPENAI_INSUFFICIENT_QUOTA
	kindGoogle       = weirv1.QuotaKind_QUOTA_KIND_GOOGLE_QUOTA_EXHAUSTED
	kindAnthropic    = weirv1.QuotaKind_QUOTA_KIND_ANTHROPIC_WINDOW
	kindOutOfCredits = weirv1.QuotaKind_QUOTA_KIND_ANTHROPIC_OUT_OF_CREDITS
	actRespond       = weirv1.Action_ACTION_RESPOND
)

// quota429 is a rate-limited outcome carrying quota evidence.
func quota429(q *weirv1.QuotaEvidence) *weirv1.Outcome {
	return &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, Quota: q}
}

// TestQuotaDecideProvider: a 429 that names its quota outright cools the
// account by the reset it names (resets_at, else reset_after), backs off
// 30 s doubling to 5 min when it names none usable, and keeps an
// insufficient_quota account out for the out-of-credits floor. The quota
// record goes with the cooldown; the client's bytes only change the action.
func TestQuotaDecideProvider(t *testing.T) {
	t.Parallel()
	const msg = "The usage limit has been reached"
	for _, tc := range []struct {
		name     string
		o        *weirv1.Outcome
		backoffs int32

		action   weirv1.Action
		reason   weirv1.CooldownReason
		until    time.Duration // after epoch
		counted  bool          // a quota backoff step
		step     int32         // the evidence's backoff_step
		kind     weirv1.QuotaKind
		resetsAt time.Duration // -1: none recorded
		window   int32
		message  string
	}{
		{name: "codex usage limit with resets_at: until exactly that second",
			o:      quota429(&weirv1.QuotaEvidence{Kind: kindCodex, ResetsAt: timestamppb.New(epoch.Add(2*time.Hour + 30*time.Minute)), WindowMinutes: 300, Message: msg}),
			action: actFailover, reason: reasonQuota, until: 150 * time.Minute,
			kind: kindCodex, resetsAt: 150 * time.Minute, window: 300, message: msg},
		{name: "resets_at wins over reset_after",
			o: quota429(&weirv1.QuotaEvidence{Kind: kindCodex, ResetsAt: timestamppb.New(epoch.Add(3 * time.Hour)),
				ResetAfter: durationpb.New(time.Hour), WindowMinutes: 10080, Message: msg}),
			action: actFailover, reason: reasonQuota, until: 3 * time.Hour,
			kind: kindCodex, resetsAt: 3 * time.Hour, window: 10080, message: msg},
		{name: "codex usage limit with only reset_after",
			o:      quota429(&weirv1.QuotaEvidence{Kind: kindCodex, ResetAfter: durationpb.New(5400 * time.Second), WindowMinutes: 300, Message: msg}),
			action: actFailover, reason: reasonQuota, until: 90 * time.Minute,
			kind: kindCodex, resetsAt: 90 * time.Minute, window: 300, message: msg},
		{name: "a past resets_at falls back to reset_after",
			o: quota429(&weirv1.QuotaEvidence{Kind: kindCodex, ResetsAt: timestamppb.New(epoch.Add(-time.Minute)),
				ResetAfter: durationpb.New(20 * time.Minute), Message: msg}),
			action: actFailover, reason: reasonQuota, until: 20 * time.Minute,
			kind: kindCodex, resetsAt: 20 * time.Minute, message: msg},
		{name: "a past resets_at and no reset_after: backoff 30s",
			o:      quota429(&weirv1.QuotaEvidence{Kind: kindCodex, ResetsAt: timestamppb.New(epoch.Add(-time.Minute)), WindowMinutes: 300, Message: msg}),
			action: actFailover, reason: reasonQuota, until: 30 * time.Second, counted: true, step: 1,
			kind: kindCodex, resetsAt: -1, window: 300, message: msg},
		{name: "no usable reset after one backoff: 60s",
			o:        quota429(&weirv1.QuotaEvidence{Kind: kindCodex, ResetsAt: timestamppb.New(epoch), Message: msg}),
			backoffs: 1,
			action:   actFailover, reason: reasonQuota, until: time.Minute, counted: true, step: 2,
			kind: kindCodex, resetsAt: -1, message: msg},
		{name: "no usable reset after many backoffs: capped at 5m",
			o:        quota429(&weirv1.QuotaEvidence{Kind: kindCodex, ResetAfter: durationpb.New(maxClaimReset + time.Second), Message: msg}),
			backoffs: 9,
			action:   actFailover, reason: reasonQuota, until: 5 * time.Minute, counted: true, step: 10,
			kind: kindCodex, resetsAt: -1, message: msg},
		{name: "insufficient_quota: out of credits for 6h, no reset",
			o: quota429(&weirv1.QuotaEvidence{Kind: kindInsufficient,
				Message: "You exceeded your current quota, please check your plan and billing details."}),
			action: actFailover, reason: reasonOOC, until: 6 * time.Hour,
			kind: kindInsufficient, resetsAt: -1,
			message: "You exceeded your current quota, please check your plan and billing details."},
		{name: "insufficient_quota ignores a reset_after",
			o:      quota429(&weirv1.QuotaEvidence{Kind: kindInsufficient, ResetAfter: durationpb.New(time.Minute), Message: "billing"}),
			action: actFailover, reason: reasonOOC, until: 6 * time.Hour,
			kind: kindInsufficient, resetsAt: -1, message: "billing"},
		{name: "google QUOTA_EXHAUSTED with reset_after (retryDelay)",
			o:      quota429(&weirv1.QuotaEvidence{Kind: kindGoogle, ResetAfter: durationpb.New(45 * time.Second), Message: "Resource has been exhausted (e.g. check quota)."}),
			action: actFailover, reason: reasonQuota, until: 45 * time.Second,
			kind: kindGoogle, resetsAt: 45 * time.Second, message: "Resource has been exhausted (e.g. check quota)."},
		{name: "bytes to the client: the cooldown is written, the answer is RESPOND",
			o: func() *weirv1.Outcome {
				o := quota429(&weirv1.QuotaEvidence{Kind: kindCodex, ResetAfter: durationpb.New(time.Hour), WindowMinutes: 300, Message: msg})
				o.BytesToClient = true
				return o
			}(),
			action: actRespond, reason: reasonQuota, until: time.Hour,
			kind: kindCodex, resetsAt: time.Hour, window: 300, message: msg},
		{name: "the error message stands in for a missing quota message, on one line",
			o: func() *weirv1.Outcome {
				o := quota429(&weirv1.QuotaEvidence{Kind: kindCodex, ResetAfter: durationpb.New(time.Hour)})
				o.ErrorMessage = "usage limit\n  reached,\ttry again later"
				return o
			}(),
			action: actFailover, reason: reasonQuota, until: time.Hour,
			kind: kindCodex, resetsAt: time.Hour, message: "usage limit reached, try again later"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.o, Facts{OAuth: true, Family: "gpt", QuotaBackoffs: tc.backoffs}, epoch)
			if d.Action != tc.action || d.Rung != rungProviderQuota || d.QuotaBackoff != tc.counted || d.Gate != nil || d.RetryAfter != 0 {
				t.Fatalf("decision action %v rung %q counted %v gate %v retry %v, want %v %q %v no gate no retry",
					d.Action, d.Rung, d.QuotaBackoff, d.Gate, d.RetryAfter, tc.action, rungProviderQuota, tc.counted)
			}
			cw := d.Cooldown
			if cw == nil {
				t.Fatal("no cooldown")
			}
			if cw.Reason != tc.reason || !cw.Until.Equal(epoch.Add(tc.until)) {
				t.Errorf("cooldown %v until %v, want %v until %v", cw.Reason, cw.Until, tc.reason, epoch.Add(tc.until))
			}
			var ev Evidence
			if err := json.Unmarshal(cw.Evidence, &ev); err != nil {
				t.Fatalf("evidence %s: %v", cw.Evidence, err)
			}
			if ev.Rung != rungProviderQuota || ev.Class != "rate_limited" || ev.Status != 429 || ev.BackoffStep != tc.step {
				t.Errorf("evidence %+v, want rung provider_quota, class rate_limited, status 429, backoff step %d", ev, tc.step)
			}
			q := cw.Quota
			if q == nil {
				t.Fatal("no quota record")
			}
			wantReset := time.Time{}
			if tc.resetsAt >= 0 {
				wantReset = epoch.Add(tc.resetsAt)
			}
			if q.Kind != tc.kind || !q.ResetsAt.Equal(wantReset) || q.WindowMinutes != tc.window || q.Message != tc.message {
				t.Errorf("quota %v reset %v window %d message %q, want %v %v %d %q",
					q.Kind, q.ResetsAt, q.WindowMinutes, q.Message, tc.kind, wantReset, tc.window, tc.message)
			}
		})
	}
}

// TestQuotaDecideUnspecifiedKind: quota evidence without a kind is no
// quota evidence; the 429 climbs the ladder (here a residual with its
// Retry-After) and carries no quota record.
func TestQuotaDecideUnspecifiedKind(t *testing.T) {
	t.Parallel()
	o := quota429(&weirv1.QuotaEvidence{ResetAfter: durationpb.New(time.Hour), Message: "nope"})
	o.Headers = map[string]string{"retry-after": "20"}
	d := Decide(o, Facts{Family: "gpt"}, epoch)
	if d.Rung != rungResidual || d.Cooldown == nil || d.Cooldown.Reason != reasonRL ||
		!d.Cooldown.Until.Equal(epoch.Add(20*time.Second)) || d.Cooldown.Quota != nil {
		t.Fatalf("decision %+v cooldown %+v, want the residual rate_limited for 20s without quota", d, d.Cooldown)
	}
}

// TestQuotaDecideLadder: rungs 3 and 4 attach ANTHROPIC_WINDOW evidence
// whose window is the claim whose reset is the deadline; a rung without a
// reset records no reset, and the other rungs record nothing.
func TestQuotaDecideLadder(t *testing.T) {
	t.Parallel()
	const msg = "This request would exceed your account's rate limit."
	for _, tc := range []struct {
		name   string
		h      map[string]string
		spent  []Claim
		rung   Rung
		reason weirv1.CooldownReason
		until  time.Duration
		quota  bool
		reset  time.Duration // -1: none recorded
		window int32
		kind   weirv1.QuotaKind // zero: kindAnthropic
	}{
		{name: "5h and 7d rejected, the 7d reset later: 10080",
			h: hdr("status", "rejected", "5h-status", "rejected", "5h-reset", at(2*time.Hour),
				"7d-status", "rejected", "7d-reset", at(72*time.Hour)),
			rung: rungAccountQuota, reason: reasonQuota, until: 72 * time.Hour, quota: true, reset: 72 * time.Hour, window: 10080},
		{name: "5h and 7d rejected, the 5h reset later: 300",
			h: hdr("status", "rejected", "5h-status", "rejected", "5h-reset", at(3*time.Hour),
				"7d-status", "rejected", "7d-reset", at(time.Hour)),
			rung: rungAccountQuota, reason: reasonQuota, until: 3 * time.Hour, quota: true, reset: 3 * time.Hour, window: 300},
		{name: "5h only: 300",
			h:    hdr("status", "rejected", "5h-status", "rejected", "5h-reset", at(2*time.Hour), "7d-status", "allowed"),
			rung: rungAccountQuota, reason: reasonQuota, until: 2 * time.Hour, quota: true, reset: 2 * time.Hour, window: 300},
		{name: "both with the same reset: the longer window",
			h: hdr("status", "rejected", "5h-status", "rejected", "5h-reset", at(4*time.Hour),
				"7d-status", "rejected", "7d-reset", at(4*time.Hour)),
			rung: rungAccountQuota, reason: reasonQuota, until: 4 * time.Hour, quota: true, reset: 4 * time.Hour, window: 10080},
		{name: "rejected without a usable reset: no reset, no window",
			h:    hdr("status", "rejected", "7d-status", "rejected"),
			rung: rungAccountQuota, reason: reasonQuota, until: quotaBackoffBase, quota: true, reset: -1},
		{name: "rung 4: the cached spent weekly window",
			h:     hdr("retry-after", "30"),
			spent: []Claim{{Claim: "5h", Minutes: 300, Reset: epoch.Add(time.Hour).Unix()}, {Claim: "7d", Minutes: 10080, Reset: epoch.Add(50 * time.Hour).Unix()}},
			rung:  rungCachedQuota, reason: reasonQuota, until: 50 * time.Hour, quota: true, reset: 50 * time.Hour, window: 10080},
		{name: "the residual records no quota",
			h:    hdr("retry-after", "30"),
			rung: rungResidual, reason: reasonRL, until: 30 * time.Second},
		{name: "out of credits: its own kind, no reset (an operator adds credits)",
			h:    hdr("status", "rejected", "overage-disabled-reason", "out_of_credits", "5h-status", "rejected", "5h-reset", at(time.Hour)),
			rung: rungOutOfCredits, reason: reasonOOC, until: 6 * time.Hour, quota: true, reset: -1, kind: kindOutOfCredits},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, Headers: tc.h,
				ErrorType: "rate_limit_error", ErrorMessage: msg}
			d := Decide(o, Facts{Family: "opus", Spent: tc.spent}, epoch)
			if d.Rung != tc.rung || d.Cooldown == nil || d.Cooldown.Reason != tc.reason || !d.Cooldown.Until.Equal(epoch.Add(tc.until)) {
				t.Fatalf("rung %q cooldown %+v, want %q %v until now+%v", d.Rung, d.Cooldown, tc.rung, tc.reason, tc.until)
			}
			q := d.Cooldown.Quota
			if !tc.quota {
				if q != nil {
					t.Fatalf("quota %+v, want none", q)
				}
				return
			}
			if q == nil {
				t.Fatal("no quota record")
			}
			wantReset := time.Time{}
			if tc.reset >= 0 {
				wantReset = epoch.Add(tc.reset)
			}
			kind := tc.kind
			if kind == weirv1.QuotaKind_QUOTA_KIND_UNSPECIFIED {
				kind = kindAnthropic
			}
			if q.Kind != kind || !q.ResetsAt.Equal(wantReset) || q.WindowMinutes != tc.window || q.Message != msg {
				t.Errorf("quota %v reset %v window %d message %q, want %v %v %d %q",
					q.Kind, q.ResetsAt, q.WindowMinutes, q.Message, kind, wantReset, tc.window, msg)
			}
		})
	}
}

// quotaCooling gives a Candidate a live quota_exhausted cooldown until
// until, justified by evidence of kind that resets at reset (negative:
// none named).
func quotaCooling(until, reset time.Duration, window int32, message string) func(*Candidate) {
	return func(x *Candidate) {
		x.Cooldown = &Cooldown{Reason: weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, Transient: true,
			Until: epoch.Add(until), WrittenAt: epoch,
			Quota: &QuotaRecord{Kind: weirv1.QuotaKind_QUOTA_KIND_CODEX_USAGE_LIMIT, WindowMinutes: window, Message: message}}
		if reset >= 0 {
			x.Cooldown.Quota.ResetsAt = epoch.Add(reset)
		}
	}
}

// credentialRejected is a live invalid_credential cooldown: not transient.
func credentialRejected(d time.Duration) func(*Candidate) {
	return func(x *Candidate) {
		x.Cooldown = &Cooldown{Reason: weirv1.CooldownReason_COOLDOWN_REASON_INVALID_CREDENTIAL, Transient: false,
			Until: epoch.Add(d), WrittenAt: epoch}
	}
}

func codex() func(*Candidate) { return provider("codex") }

func openai() func(*Candidate) { return provider("openai") }

// TestQuotaBlock: the pool is quota-blocked only when every account the
// request could be served by is out on quota evidence covering its
// deadline; the block names the account that reopens first.
func TestQuotaBlock(t *testing.T) {
	t.Parallel()
	const (
		responses = weirv1.Surface_SURFACE_RESPONSES
		messages  = weirv1.Surface_SURFACE_MESSAGES
	)
	type want struct {
		resetsAt time.Duration // -1: no known reset
		window   int32
		provider weirv1.Provider
		message  string
		accounts int32
		noReset  int32 // accounts without a known reset
	}
	for _, tc := range []struct {
		name    string
		surface weirv1.Surface
		cands   []Candidate
		exclude []string
		breaker string // a provider whose breaker is open
		want    *want  // nil: no block
	}{
		{name: "all quota-covered: the earliest reset", surface: responses, cands: []Candidate{
			c("a", codex(), quotaCooling(3*time.Hour, 3*time.Hour, 300, "a's limit")),
			c("b", codex(), quotaCooling(time.Hour, time.Hour, 10080, "b's limit")),
			c("c", openai(), quotaCooling(2*time.Hour, 2*time.Hour, 0, "c's limit")),
		}, want: &want{time.Hour, 10080, weirv1.Provider_PROVIDER_CODEX, "b's limit", 3, 0}},
		{name: "the first to reopen is an openai account", surface: responses, cands: []Candidate{
			c("a", codex(), quotaCooling(3*time.Hour, 3*time.Hour, 300, "a's limit")),
			c("c", openai(), quotaCooling(2*time.Hour, 2*time.Hour, 0, "c's limit")),
		}, want: &want{2 * time.Hour, 0, weirv1.Provider_PROVIDER_OPENAI, "c's limit", 2, 0}},
		{name: "one account free", surface: responses, cands: []Candidate{
			c("a", codex(), quotaCooling(time.Hour, time.Hour, 300, "x")), c("b", codex()),
		}},
		{name: "one account at its concurrency cap", surface: responses, cands: []Candidate{
			c("a", codex(), quotaCooling(time.Hour, time.Hour, 300, "x")), c("b", codex(), capOf(2), live(2)),
		}},
		{name: "one tried, not cooling", surface: responses, exclude: []string{"b"}, cands: []Candidate{
			c("a", codex(), quotaCooling(time.Hour, time.Hour, 300, "x")), c("b", codex()),
		}},
		{name: "a tried account that is quota-blocked still counts", surface: responses, exclude: []string{"a"}, cands: []Candidate{
			c("a", codex(), quotaCooling(time.Hour, time.Hour, 300, "x")),
		}, want: &want{time.Hour, 300, weirv1.Provider_PROVIDER_CODEX, "x", 1, 0}},
		{name: "a rate_limited cooldown is not quota", surface: responses, cands: []Candidate{
			c("a", codex(), quotaCooling(time.Hour, time.Hour, 300, "x")), c("b", codex(), cooling(time.Hour, true)),
		}},
		{name: "a backoff outlasting its quota reset", surface: responses, cands: []Candidate{
			c("a", codex(), quotaCooling(time.Hour, time.Hour, 300, "x")),
			c("b", codex(), quotaCooling(10*time.Minute, 5*time.Minute, 300, "y")),
		}},
		{name: "quota evidence without a reset (insufficient_quota, a backoff): blocked, no reset", surface: responses, cands: []Candidate{
			c("a", codex(), quotaCooling(6*time.Hour, -1, 0, "billing")),
		}, want: &want{-1, 0, weirv1.Provider_PROVIDER_CODEX, "billing", 1, 1}},
		{name: "a short backoff without a reset blocks as long as credits would", surface: responses, cands: []Candidate{
			c("a", codex(), quotaCooling(30*time.Second, -1, 300, "no reset")),
			c("b", openai(), quotaCooling(6*time.Hour, -1, 0, "billing")),
		}, want: &want{-1, 300, weirv1.Provider_PROVIDER_CODEX, "no reset", 2, 2}},
		{name: "a mixed pool: the earliest known reset, however the others are out", surface: responses, cands: []Candidate{
			c("a", openai(), quotaCooling(6*time.Hour, -1, 0, "billing")),
			c("b", codex(), quotaCooling(3*time.Hour, 3*time.Hour, 10080, "b's limit")),
			c("d", codex(), quotaCooling(2*time.Hour, 2*time.Hour, 300, "d's limit")),
		}, want: &want{2 * time.Hour, 300, weirv1.Provider_PROVIDER_CODEX, "d's limit", 3, 1}},
		{name: "no reset wins over a spent window of the same account", surface: messages, cands: []Candidate{
			c("a", quotaCooling(6*time.Hour, -1, 0, "out of credits"), fiveHour(1.0, 2*time.Hour)),
		}, want: &want{-1, 0, weirv1.Provider_PROVIDER_ANTHROPIC, "out of credits", 1, 1}},
		{name: "an expired quota cooldown is no block", surface: responses, cands: []Candidate{
			c("a", codex(), quotaCooling(-time.Second, -time.Second, 300, "x")),
		}},
		{name: "a spent five-hour window without a cooldown", surface: messages, cands: []Candidate{
			c("a", fiveHour(1.0, 2*time.Hour), weekly(0.4, 72*time.Hour)),
		}, want: &want{2 * time.Hour, 300, weirv1.Provider_PROVIDER_ANTHROPIC, "usage view: 300-minute window at 100%", 1, 0}},
		{name: "a spent window covers a shorter rate_limited cooldown", surface: messages, cands: []Candidate{
			c("a", cooling(time.Minute, true), weekly(0.99, 30*time.Hour)),
		}, want: &want{30 * time.Hour, 10080, weirv1.Provider_PROVIDER_ANTHROPIC, "usage view: 10080-minute window at 99%", 1, 0}},
		{name: "a rate_limited cooldown outlasting a spent window", surface: messages, cands: []Candidate{
			c("a", cooling(3*time.Hour, true), fiveHour(1.0, 2*time.Hour)),
		}},
		{name: "a five-hour window under the spent mark", surface: messages, cands: []Candidate{
			c("a", fiveHour(0.98, 2*time.Hour), cooling(time.Minute, true)),
		}},
		{name: "a family gate on a Retry-After has no reset behind it", surface: messages, cands: []Candidate{
			c("a", gatedNoReset(40*time.Hour)),
		}},
		{name: "a family gate counts", surface: messages, cands: []Candidate{
			c("a", gated(40*time.Hour)),
		}, want: &want{40 * time.Hour, 10080, weirv1.Provider_PROVIDER_ANTHROPIC, "model family weekly window spent (opus)", 1, 0}},
		{name: "paused and broken accounts are ignored", surface: responses, cands: []Candidate{
			c("a", codex(), quotaCooling(time.Hour, time.Hour, 300, "x")), c("b", codex(), paused()), c("d", codex(), broken()),
		}, want: &want{time.Hour, 300, weirv1.Provider_PROVIDER_CODEX, "x", 1, 0}},
		{name: "a rejected credential is ignored", surface: responses, cands: []Candidate{
			c("a", codex(), quotaCooling(time.Hour, time.Hour, 300, "x")), c("b", codex(), credentialRejected(time.Hour)),
		}, want: &want{time.Hour, 300, weirv1.Provider_PROVIDER_CODEX, "x", 1, 0}},
		{name: "a rejected credential under a spent window is ignored", surface: messages, cands: []Candidate{
			c("a", gated(time.Hour)), c("b", credentialRejected(time.Hour), fiveHour(1.0, 30*time.Minute)),
		}, want: &want{time.Hour, 10080, weirv1.Provider_PROVIDER_ANTHROPIC, "model family weekly window spent (opus)", 1, 0}},
		{name: "other providers than the surface's are ignored", surface: responses, cands: []Candidate{
			c("a", codex(), quotaCooling(time.Hour, time.Hour, 300, "x")), c("anthropic"),
		}, want: &want{time.Hour, 300, weirv1.Provider_PROVIDER_CODEX, "x", 1, 0}},
		{name: "messages ignores codex and openai accounts", surface: messages, cands: []Candidate{
			c("a", gated(2*time.Hour)), c("b", codex()), c("d", openai()),
		}, want: &want{2 * time.Hour, 10080, weirv1.Provider_PROVIDER_ANTHROPIC, "model family weekly window spent (opus)", 1, 0}},
		// Its account serves again when the breaker closes: overloaded
		// is not out of quota.
		{name: "an account behind its open breaker is not out of quota", surface: responses, breaker: "openai", cands: []Candidate{
			c("a", codex(), quotaCooling(time.Hour, time.Hour, 300, "x")), c("b", openai()),
		}},
		{name: "a spent account behind its open breaker is", surface: responses, breaker: "openai", cands: []Candidate{
			c("a", codex(), quotaCooling(time.Hour, time.Hour, 300, "x")), c("b", openai(), quotaCooling(2*time.Hour, 2*time.Hour, 300, "y")),
		}, want: &want{time.Hour, 300, weirv1.Provider_PROVIDER_CODEX, "x", 2, 0}},
		{name: "the other provider's breaker: its free account counts", surface: responses, breaker: "codex", cands: []Candidate{
			c("a", codex(), quotaCooling(time.Hour, time.Hour, 300, "x")), c("b", openai()),
		}},
		{name: "no eligible account", surface: responses, cands: []Candidate{
			c("a", codex(), paused()), c("b", openai(), broken()), c("anthropic"),
		}},
		{name: "no account at all", surface: responses},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := RouteRequest{Model: "claude-opus-4-1", Surface: tc.surface, Exclude: map[uuid.UUID]bool{}}
			for _, x := range tc.exclude {
				req.Exclude[c(x).Account.ID] = true
			}
			if tc.breaker != "" {
				req.BreakerOpen = map[weirv1.Provider]bool{vocab.Value[weirv1.Provider](tc.breaker): true}
			}
			got := QuotaBlock(tc.cands, req, epoch)
			if tc.want == nil {
				if got != nil {
					t.Fatalf("quota block %v, want none", got)
				}
				return
			}
			w := tc.want
			if got == nil {
				t.Fatalf("no quota block, want %+v", *w)
			}
			resetOK := got.ResetsAt == nil
			if w.resetsAt >= 0 {
				resetOK = got.ResetsAt != nil && got.ResetsAt.AsTime().Equal(epoch.Add(w.resetsAt))
			}
			if !resetOK || got.WindowMinutes != w.window || got.Provider != w.provider ||
				got.LastUpstreamError != w.message || got.Accounts != w.accounts || got.AccountsWithoutReset != w.noReset {
				t.Errorf("quota block resets %v window %d provider %v message %q accounts %d (%d without a reset), want %v %d %v %q %d (%d)",
					got.GetResetsAt(), got.WindowMinutes, got.Provider, got.LastUpstreamError, got.Accounts, got.AccountsWithoutReset,
					w.resetsAt, w.window, w.provider, w.message, w.accounts, w.noReset)
			}
		})
	}
}

// TestQuotaUntil: which evidence covers an account's deadline. The
// latest among the cooldown's quota, the spent windows and the gate
// covers it; a deadline stored a fraction of a second after its reset
// (microseconds against seconds) is still covered, and the block reports
// the deadline itself.
func TestQuotaUntil(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		x       Candidate
		ok      bool
		resets  time.Time
		window  int32
		message string
	}{
		{name: "the cooldown's own reset", x: c("a", quotaCooling(time.Hour, time.Hour, 300, "m")),
			ok: true, resets: epoch.Add(time.Hour), window: 300, message: "m"},
		{name: "a deadline half a second after its reset",
			x:  c("a", quotaCooling(time.Hour+500*time.Millisecond, time.Hour, 300, "m")),
			ok: true, resets: epoch.Add(time.Hour + 500*time.Millisecond), window: 300, message: "m"},
		{name: "a deadline two seconds after its reset", x: c("a", quotaCooling(time.Hour+2*time.Second, time.Hour, 300, "m"))},
		{name: "a later spent weekly window outlasts the cooldown", x: c("a", quotaCooling(time.Hour, time.Hour, 300, "m"), weekly(1.0, 48*time.Hour)),
			ok: true, resets: epoch.Add(48 * time.Hour), window: 10080, message: "usage view: 10080-minute window at 100%"},
		{name: "a later gate outlasts the cooldown", x: c("a", quotaCooling(time.Hour, time.Hour, 300, "m"), gated(5*time.Hour)),
			ok: true, resets: epoch.Add(5 * time.Hour), window: 10080, message: "model family weekly window spent (opus)"},
		{name: "not blocked", x: c("a")},
		{name: "a rejected credential", x: c("a", credentialRejected(time.Hour), fiveHour(1.0, time.Hour))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, ok := tc.x.quotaUntil(epoch)
			if ok != tc.ok || !e.resetsAt.Equal(tc.resets) || e.windowMinutes != tc.window || e.text() != tc.message {
				t.Errorf("quotaUntil %+v %v, want {%v %d %q} %v", e, ok, tc.resets, tc.window, tc.message, tc.ok)
			}
		})
	}
}

// TestQuotaRouteNoAccount: Route() attaches the block to its answer, and
// a pool out of quota is still an ALL_COOLING answer that recovers on its
// own at the first reset.
func TestQuotaRouteNoAccount(t *testing.T) {
	t.Parallel()
	cands := []Candidate{
		c("a", codex(), quotaCooling(2*time.Hour, 2*time.Hour, 300, "a")),
		c("b", codex(), quotaCooling(time.Hour, time.Hour, 300, "b")),
		c("p", codex(), paused()),
	}
	order, none := Route(cands, RouteRequest{Model: "gpt-5-codex", Surface: weirv1.Surface_SURFACE_RESPONSES}, epoch)
	if order != nil || none == nil {
		t.Fatalf("order %v none %v, want no account", labelsOf(order), none)
	}
	if none.Reason != weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING || none.Permanent ||
		!none.GetRetryAt().AsTime().Equal(epoch.Add(time.Hour)) {
		t.Errorf("no account %v permanent %v retry at %v, want ALL_COOLING, recoverable, at now+1h", none.Reason, none.Permanent, none.GetRetryAt().AsTime())
	}
	b := none.GetQuotaBlock()
	if b == nil || !b.GetResetsAt().AsTime().Equal(epoch.Add(time.Hour)) || b.Accounts != 2 || b.LastUpstreamError != "b" ||
		b.Provider != weirv1.Provider_PROVIDER_CODEX || b.WindowMinutes != 300 {
		t.Errorf("quota block %v, want b's reset at now+1h over 2 codex accounts", b)
	}
	if none.QuotaResponseMode != weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_UNSPECIFIED {
		t.Errorf("route set the response mode %v; Acquire fills it", none.QuotaResponseMode)
	}
}
