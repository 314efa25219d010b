package policy

import (
	"encoding/json"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// The 429 decision ladder, one table per rung, built from real header
// sets: the production weekly capture (429-weekly-rejected) and the shapes
// docs/wire.md records. Every case runs through Decide(), the one entry point.

const (
	actFailover  = weirv1.Action_ACTION_FAILOVER
	actRetrySame = weirv1.Action_ACTION_RETRY_SAME
	reasonNone   = weirv1.CooldownReason_COOLDOWN_REASON_UNSPECIFIED
	reasonRL     = weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED
	reasonQuota  = weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED
	reasonOOC    = weirv1.CooldownReason_COOLDOWN_REASON_OUT_OF_CREDITS
)

// hdr builds a 429's decision headers from pairs; every name but
// retry-after, retry-after-ms and x-should-retry is a unified header and
// is given its prefix.
func hdr(kv ...string) map[string]string {
	h := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		k := kv[i]
		if !strings.HasPrefix(k, "retry-after") && !strings.HasPrefix(k, "x-") {
			k = unifiedPrefix + k
		}
		h[k] = kv[i+1]
	}
	return h
}

// at is an epoch-seconds reset d after the test epoch.
func at(d time.Duration) string { return strconv.FormatInt(epoch.Add(d).Unix(), 10) }

type ladderCase struct {
	name     string
	h        map[string]string
	apiKey   bool   // default: an OAuth account
	family   string // default "opus"; "-" for a model-less call
	bursts   int32  // prior burst retries of the request on the account
	backoffs int32  // the account's prior quota backoffs

	rung   Rung
	action weirv1.Action
	reason weirv1.CooldownReason // UNSPECIFIED: no cooldown
	gate   bool                  // a family gate instead of a cooldown
	until  time.Duration         // the cooldown's or gate's end, after epoch
	retry  time.Duration         // RETRY_SAME's wait
	claims string                // the rejecting claims recorded, "5h+7d"
}

func runLadder(t *testing.T, cases []ladderCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkLadder(t, tc, epoch)
		})
	}
}

func checkLadder(t *testing.T, tc ladderCase, now time.Time) {
	t.Helper()
	f := Facts{OAuth: !tc.apiKey, Family: tc.family, QuotaBackoffs: tc.backoffs}
	switch f.Family {
	case "":
		f.Family = "opus"
	case "-":
		f.Family = ""
	}
	o := &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, ErrorType: "rate_limit_error",
		Headers: tc.h, PriorBursts: tc.bursts}
	d := Decide(o, f, now)
	if d.Rung != tc.rung || d.Action != tc.action || d.RetryAfter != tc.retry {
		t.Fatalf("rung %s action %v retry %v, want %s %v %v", d.Rung, d.Action, d.RetryAfter, tc.rung, tc.action, tc.retry)
	}
	var evidence []byte
	switch {
	case tc.gate:
		if d.Cooldown != nil {
			t.Fatalf("cooldown %v until now+%v, want a family gate and no account-wide cooldown", d.Cooldown.Reason, d.Cooldown.Until.Sub(now))
		}
		if d.Gate == nil || d.Gate.Family != f.Family || !d.Gate.Until.Equal(now.Add(tc.until)) {
			t.Fatalf("gate %+v, want %s until now+%v", d.Gate, f.Family, tc.until)
		}
		evidence = d.Gate.Evidence
	case tc.reason == reasonNone:
		if d.Cooldown != nil || d.Gate != nil {
			t.Fatalf("cooldown %+v gate %+v, want neither", d.Cooldown, d.Gate)
		}
		return
	default:
		if d.Gate != nil {
			t.Errorf("gate %+v, want none", d.Gate)
		}
		if d.Cooldown == nil || d.Cooldown.Reason != tc.reason || !d.Cooldown.Until.Equal(now.Add(tc.until)) {
			t.Fatalf("cooldown %+v (until now+%v), want %v until now+%v", d.Cooldown, untilOf(d.Cooldown, now), tc.reason, tc.until)
		}
		evidence = d.Cooldown.Evidence
	}
	var ev Evidence
	if err := json.Unmarshal(evidence, &ev); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range ev.Claims {
		names = append(names, c.Claim)
	}
	if got := strings.Join(names, "+"); got != tc.claims || ev.Rung != tc.rung {
		t.Errorf("evidence rung %q claims %q, want %q %q", ev.Rung, got, tc.rung, tc.claims)
	}
}

func untilOf(c *CooldownWrite, now time.Time) time.Duration {
	if c == nil {
		return 0
	}
	return c.Until.Sub(now)
}

// TestLadderOutOfCredits: rung 2. A rejection the account's extra usage
// cannot pay for: a long floor, never a burst retry.
func TestLadderOutOfCredits(t *testing.T) {
	t.Parallel()
	const ooc = "out_of_credits"
	runLadder(t, []ladderCase{
		{name: "rejected, out of credits: the floor", h: hdr("status", "rejected", "overage-disabled-reason", ooc, "overage-status", "rejected",
			"reset", at(time.Hour), "representative-claim", "five_hour"),
			rung: rungOutOfCredits, action: actFailover, reason: reasonOOC, until: OutOfCreditsFloor, claims: "5h"},
		{name: "a later reset outlasts the floor", h: hdr("status", "rejected", "overage-disabled-reason", ooc,
			"reset", at(72*time.Hour), "7d-status", "rejected", "7d-reset", at(72*time.Hour)),
			rung: rungOutOfCredits, action: actFailover, reason: reasonOOC, until: 72 * time.Hour, claims: "7d"},
		{name: "an absurd reset does not", h: hdr("status", "rejected", "overage-disabled-reason", ooc, "reset", at(30*24*time.Hour)),
			rung: rungOutOfCredits, action: actFailover, reason: reasonOOC, until: OutOfCreditsFloor},
		{name: "no burst retry even with a burst's headers", h: hdr("status", "rejected", "overage-disabled-reason", ooc,
			"retry-after", "2", "x-should-retry", "true"),
			rung: rungOutOfCredits, action: actFailover, reason: reasonOOC, until: OutOfCreditsFloor},
		{name: "API key too", apiKey: true, h: hdr("status", "rejected", "overage-disabled-reason", ooc),
			rung: rungOutOfCredits, action: actFailover, reason: reasonOOC, until: OutOfCreditsFloor},
		{name: "case and spaces", h: hdr("status", " Rejected ", "overage-disabled-reason", "OUT_OF_CREDITS "),
			rung: rungOutOfCredits, action: actFailover, reason: reasonOOC, until: OutOfCreditsFloor},
		// Without a rejection the reason only says overage is unavailable:
		// the plan windows have room, and a 429 is a burst.
		{name: "out of credits, allowed: a burst", h: hdr("status", "allowed", "overage-disabled-reason", ooc, "retry-after", "3"),
			rung: rungBurst, action: actRetrySame, retry: 3 * time.Second},
		{name: "another disabled reason is not out of credits", h: hdr("status", "rejected", "overage-disabled-reason", "org_level_disabled",
			"retry-after", "40"),
			rung: rungResidual, action: actFailover, reason: reasonRL, until: 40 * time.Second},
	})
}

// TestLadderAccountQuota: rung 3. A live account-wide claim cools the
// account until the latest valid reset among the rejecting 5h/7d claims:
// never a scoped claim's reset, never retry-after when a valid reset
// exists.
func TestLadderAccountQuota(t *testing.T) {
	t.Parallel()
	runLadder(t, []ladderCase{
		{name: "5h rejected", h: hdr("status", "rejected", "5h-status", "rejected", "5h-reset", at(2*time.Hour), "5h-utilization", "1.0",
			"7d-status", "allowed", "7d-utilization", "0.4", "7d-reset", at(96*time.Hour)),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: 2 * time.Hour, claims: "5h"},
		{name: "7d rejected", h: hdr("status", "rejected", "7d-status", "rejected", "7d-reset", at(51811*time.Second), "7d-utilization", "1.0"),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: 51811 * time.Second, claims: "7d"},
		{name: "both: the latest reset", h: hdr("status", "rejected", "5h-status", "rejected", "5h-reset", at(2*time.Hour),
			"7d-status", "rejected", "7d-reset", at(72*time.Hour)),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: 72 * time.Hour, claims: "5h+7d"},
		{name: "latest valid reset, an invalid one ignored", h: hdr("status", "rejected", "5h-status", "rejected", "5h-reset", at(2*time.Hour),
			"7d-status", "rejected", "7d-reset", "next week"),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: 2 * time.Hour, claims: "5h+7d"},
		{name: "never retry-after when a valid reset exists", h: hdr("status", "rejected", "5h-status", "rejected", "5h-reset", at(2*time.Hour),
			"retry-after", "60"),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: 2 * time.Hour, claims: "5h"},
		{name: "never a scoped claim's reset", h: hdr("status", "rejected", "7d-status", "rejected", "7d-reset", at(24*time.Hour),
			"7d_oi-status", "rejected", "7d_oi-reset", at(120*time.Hour)),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: 24 * time.Hour, claims: "7d"},
		{name: "never the overall reset of a scoped representative", h: hdr("status", "rejected", "representative-claim", "seven_day_opus",
			"reset", at(120*time.Hour), "5h-status", "rejected", "5h-reset", at(time.Hour)),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: time.Hour, claims: "5h"},
		{name: "the representative claim speaks for its window", h: hdr("status", "rejected", "representative-claim", "five_hour",
			"reset", at(90*time.Minute)),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: 90 * time.Minute, claims: "5h"},
		{name: "its own reset first", h: hdr("status", "rejected", "representative-claim", "seven_day", "reset", at(3*time.Hour),
			"7d-reset", at(4*time.Hour)),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: 4 * time.Hour, claims: "7d"},
		{name: "reset at the 8-day bound", h: hdr("7d-status", "rejected", "7d-reset", at(maxClaimReset)),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: maxClaimReset, claims: "7d"},
		{name: "API key too", apiKey: true, h: hdr("5h-status", "rejected", "5h-reset", at(time.Hour)),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: time.Hour, claims: "5h"},
		// No valid reset: the adaptive backoff's first step.
		{name: "reset in the past", h: hdr("status", "rejected", "5h-status", "rejected", "5h-reset", at(-time.Minute), "retry-after", "600"),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: quotaBackoffBase, claims: "5h"},
		{name: "reset now", h: hdr("5h-status", "rejected", "5h-reset", at(0)),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: quotaBackoffBase, claims: "5h"},
		{name: "reset absurdly far", h: hdr("7d-status", "rejected", "7d-reset", at(maxClaimReset+time.Second)),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: quotaBackoffBase, claims: "7d"},
		{name: "reset in milliseconds", h: hdr("7d-status", "rejected", "7d-reset", strconv.FormatInt(epoch.Add(time.Hour).UnixMilli(), 10)),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: quotaBackoffBase, claims: "7d"},
		{name: "reset as a date", h: hdr("7d-status", "rejected", "7d-reset", epoch.Add(time.Hour).Format(time.RFC3339)),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: quotaBackoffBase, claims: "7d"},
		{name: "no reset at all", h: hdr("5h-status", "rejected"),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: quotaBackoffBase, claims: "5h"},
		// An untrusted status is no claim.
		{name: "unknown window status", apiKey: true, h: hdr("5h-status", "exhausted", "5h-reset", at(time.Hour), "retry-after", "20"),
			rung: rungResidual, action: actFailover, reason: reasonRL, until: 20 * time.Second},
	})
}

// TestLadderQuotaBackoff: consecutive account-wide rejections without a
// valid reset back off 30 s, doubling, to 5 min; the evidence counts them.
func TestLadderQuotaBackoff(t *testing.T) {
	t.Parallel()
	h := hdr("status", "rejected", "7d-status", "rejected", "retry-after", "3", "x-should-retry", "true")
	for prior, want := range []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute, 5 * time.Minute} {
		d := Decide(&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, Headers: h},
			Facts{OAuth: true, Family: "sonnet", QuotaBackoffs: int32(prior)}, epoch)
		if d.Cooldown == nil || d.Cooldown.Reason != reasonQuota || d.Cooldown.Until.Sub(epoch) != want || !d.QuotaBackoff || d.Action != actFailover {
			t.Fatalf("after %d: %+v (until now+%v), want quota_exhausted for %v, counted", prior, d, untilOf(d.Cooldown, epoch), want)
		}
		var ev Evidence
		if err := json.Unmarshal(d.Cooldown.Evidence, &ev); err != nil || ev.BackoffStep != int32(prior+1) {
			t.Errorf("after %d: evidence backoff step %d (%v), want %d", prior, ev.BackoffStep, err, prior+1)
		}
	}
	d := Decide(&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Headers: h}, Facts{QuotaBackoffs: 1 << 30}, epoch)
	if d.Cooldown.Until.Sub(epoch) != quotaBackoffMax {
		t.Errorf("after many: %v, want the 5 min cap", d.Cooldown.Until.Sub(epoch))
	}
	// A valid reset is no backoff, and is not counted.
	d = Decide(&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED,
		Headers: hdr("7d-status", "rejected", "7d-reset", at(time.Hour))}, Facts{QuotaBackoffs: 3}, epoch)
	if d.QuotaBackoff || d.Cooldown.Until.Sub(epoch) != time.Hour {
		t.Errorf("valid reset: counted %v, until now+%v", d.QuotaBackoff, d.Cooldown.Until.Sub(epoch))
	}
}

// TestLadderFamilyGate: rung 5. A scoped weekly claim rejected while 5h
// and 7d have room gates the request's model family only.
func TestLadderFamilyGate(t *testing.T) {
	t.Parallel()
	runLadder(t, []ladderCase{
		{name: "7d_oi rejected", h: hdr("status", "rejected", "representative-claim", "seven_day_overage_included", "reset", at(40*time.Hour),
			"5h-status", "allowed", "5h-utilization", "0.3", "7d-status", "allowed_warning", "7d-utilization", "0.94",
			"7d_oi-status", "rejected", "7d_oi-utilization", "1.0", "7d_oi-reset", at(40*time.Hour), "retry-after", "144000"),
			rung: rungFamilyGate, action: actFailover, gate: true, until: 40 * time.Hour, claims: "7d_oi"},
		{name: "representative seven_day_opus, no window headers", h: hdr("status", "rejected", "representative-claim", "seven_day_opus",
			"reset", at(50*time.Hour), "retry-after", "180000"),
			rung: rungFamilyGate, action: actFailover, gate: true, until: 50 * time.Hour, claims: "seven_day_opus"},
		{name: "the lease's family, whatever the claim", family: "sonnet", h: hdr("status", "rejected", "representative-claim", "seven_day_sonnet",
			"reset", at(20*time.Hour)),
			rung: rungFamilyGate, action: actFailover, gate: true, until: 20 * time.Hour, claims: "seven_day_sonnet"},
		{name: "the scoped claim's own reset", h: hdr("status", "rejected", "representative-claim", "seven_day_overage_included",
			"reset", at(30*time.Hour), "7d_oi-status", "rejected", "7d_oi-reset", at(10*time.Hour), "retry-after", "99"),
			rung: rungFamilyGate, action: actFailover, gate: true, until: 10 * time.Hour, claims: "7d_oi"},
		{name: "the latest of two scoped claims", h: hdr("7d_oi-status", "rejected", "7d_oi-reset", at(10*time.Hour),
			"7d_opus-status", "rejected", "7d_opus-reset", at(11*time.Hour)),
			rung: rungFamilyGate, action: actFailover, gate: true, until: 11 * time.Hour, claims: "7d_oi+7d_opus"},
		{name: "no valid reset: retry-after", h: hdr("status", "rejected", "7d_oi-status", "rejected", "7d_oi-reset", "soon", "retry-after", "600"),
			rung: rungFamilyGate, action: actFailover, gate: true, until: 10 * time.Minute, claims: "7d_oi"},
		{name: "neither: one hour", h: hdr("status", "rejected", "7d_oi-status", "rejected"),
			rung: rungFamilyGate, action: actFailover, gate: true, until: familyGateDefault, claims: "7d_oi"},
		{name: "API key too", apiKey: true, h: hdr("7d_oi-status", "rejected", "7d_oi-reset", at(time.Hour)),
			rung: rungFamilyGate, action: actFailover, gate: true, until: time.Hour, claims: "7d_oi"},
		// A model-less call has no family to gate: the residual rung.
		{name: "no family", family: "-", h: hdr("status", "rejected", "7d_oi-status", "rejected", "retry-after", "600"),
			rung: rungResidual, action: actFailover, reason: reasonRL, until: 10 * time.Minute},
		// The overage window is not a model family's.
		{name: "overage rejected alone is no gate", h: hdr("overage-status", "rejected", "retry-after", "4"),
			rung: rungBurst, action: actRetrySame, retry: 4 * time.Second},
	})
}

// TestLadderBurst: rung 6. A subscription account's 429 that rejects no
// claim and shows headroom is retried on the same account, twice at most,
// without a cooldown.
func TestLadderBurst(t *testing.T) {
	t.Parallel()
	runLadder(t, []ladderCase{
		{name: "no unified status", h: hdr("retry-after", "2", "x-should-retry", "true"), rung: rungBurst, action: actRetrySame, retry: 2 * time.Second},
		{name: "no retry-after", h: hdr(), rung: rungBurst, action: actRetrySame, retry: BurstRetryMin},
		{name: "short retry-after is a floor of 2 s", h: hdr("retry-after", "1"), rung: rungBurst, action: actRetrySame, retry: BurstRetryMin},
		{name: "retry-after-ms", h: hdr("retry-after-ms", "3500"), rung: rungBurst, action: actRetrySame, retry: 3500 * time.Millisecond},
		{name: "retry-after 10 s", h: hdr("retry-after", "10"), rung: rungBurst, action: actRetrySame, retry: 10 * time.Second},
		{name: "retry-after over 10 s is not a burst's", h: hdr("retry-after", "11"), rung: rungBurst, action: actRetrySame, retry: BurstRetryMin},
		{name: "retry-after date", h: hdr("retry-after", epoch.Add(7*time.Second).Format(http.TimeFormat)), rung: rungBurst, action: actRetrySame, retry: 7 * time.Second},
		{name: "allowed with headroom", h: hdr("status", "allowed", "5h-status", "allowed", "5h-utilization", "0.4", "7d-utilization", "0.2"),
			rung: rungBurst, action: actRetrySame, retry: BurstRetryMin},
		{name: "allowed_warning at the 0.99 saturation", h: hdr("status", "allowed_warning", "5h-status", "allowed_warning", "5h-utilization", "0.99"),
			rung: rungBurst, action: actRetrySame, retry: BurstRetryMin},
		{name: "second retry", bursts: 1, h: hdr("retry-after", "2"), rung: rungBurst, action: actRetrySame, retry: 2 * time.Second},
		// Not a burst: the residual rung.
		{name: "retries spent", bursts: BurstRetries, h: hdr("retry-after", "2"),
			rung: rungResidual, action: actFailover, reason: reasonRL, until: 2 * time.Second},
		{name: "API key", apiKey: true, h: hdr("retry-after", "2"),
			rung: rungResidual, action: actFailover, reason: reasonRL, until: 2 * time.Second},
		{name: "a spent window says allowed", h: hdr("status", "allowed", "5h-utilization", "1.0", "retry-after", "2"),
			rung: rungResidual, action: actFailover, reason: reasonRL, until: 2 * time.Second},
		{name: "an unreadable utilization", h: hdr("7d-utilization", "high", "retry-after", "2"),
			rung: rungResidual, action: actFailover, reason: reasonRL, until: 2 * time.Second},
		{name: "rejected without a claim weir knows", h: hdr("status", "rejected", "representative-claim", "overage", "retry-after", "2"),
			rung: rungResidual, action: actFailover, reason: reasonRL, until: 2 * time.Second},
		{name: "an unknown overall status", h: hdr("status", "throttled", "retry-after", "2"),
			rung: rungResidual, action: actFailover, reason: reasonRL, until: 2 * time.Second},
	})
}

// TestLadderResidual: rung 7, today's behaviour: retry-after, else the
// unified reset, else 60 s; another account serves.
func TestLadderResidual(t *testing.T) {
	t.Parallel()
	runLadder(t, []ladderCase{
		{name: "retry-after", apiKey: true, h: hdr("retry-after", "30"), rung: rungResidual, action: actFailover, reason: reasonRL, until: 30 * time.Second},
		{name: "retry-after-ms", apiKey: true, h: hdr("retry-after-ms", "1500"), rung: rungResidual, action: actFailover, reason: reasonRL, until: 1500 * time.Millisecond},
		{name: "retry-after date", apiKey: true, h: hdr("retry-after", epoch.Add(90*time.Second).Format(http.TimeFormat)),
			rung: rungResidual, action: actFailover, reason: reasonRL, until: 90 * time.Second},
		{name: "unified reset", apiKey: true, h: hdr("reset", at(17*time.Minute)), rung: rungResidual, action: actFailover, reason: reasonRL, until: 17 * time.Minute},
		{name: "nothing", apiKey: true, h: nil, rung: rungResidual, action: actFailover, reason: reasonRL, until: defaultRateLimitCooldown},
		{name: "bursts spent, nothing", bursts: 5, h: nil, rung: rungResidual, action: actFailover, reason: reasonRL, until: defaultRateLimitCooldown},
	})
}

// TestLadderOrder: the order is load-bearing.
func TestLadderOrder(t *testing.T) {
	t.Parallel()
	runLadder(t, []ladderCase{
		// x-should-retry: true and a small retry-after come with real
		// limits too (docs/wire.md): a spent window is never a burst.
		{name: "spent 7d with a burst's headers", h: hdr("status", "rejected", "7d-status", "rejected", "7d-reset", at(51811*time.Second),
			"retry-after", "2", "x-should-retry", "true"),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: 51811 * time.Second, claims: "7d"},
		{name: "spent 5h with a burst's headers, no valid reset", h: hdr("5h-status", "rejected", "retry-after", "1", "x-should-retry", "true"),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: quotaBackoffBase, claims: "5h"},
		{name: "spent scoped window with a burst's headers", h: hdr("status", "rejected", "7d_oi-status", "rejected", "7d_oi-reset", at(time.Hour),
			"retry-after", "2", "x-should-retry", "true"),
			rung: rungFamilyGate, action: actFailover, gate: true, until: time.Hour, claims: "7d_oi"},
		{name: "out of credits outranks a live claim", h: hdr("status", "rejected", "overage-disabled-reason", "out_of_credits",
			"5h-status", "rejected", "5h-reset", at(time.Hour)),
			rung: rungOutOfCredits, action: actFailover, reason: reasonOOC, until: OutOfCreditsFloor, claims: "5h"},
		{name: "out of credits outranks a scoped claim", h: hdr("status", "rejected", "overage-disabled-reason", "out_of_credits",
			"7d_oi-status", "rejected", "7d_oi-reset", at(time.Hour)),
			rung: rungOutOfCredits, action: actFailover, reason: reasonOOC, until: OutOfCreditsFloor},
		{name: "account-wide outranks scoped", h: hdr("status", "rejected", "representative-claim", "seven_day_overage_included",
			"7d-status", "rejected", "7d-reset", at(30*time.Hour), "7d_oi-status", "rejected", "7d_oi-reset", at(40*time.Hour)),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: 30 * time.Hour, claims: "7d"},
		{name: "account-wide without a reset still outranks scoped", h: hdr("5h-status", "rejected", "7d_oi-status", "rejected", "7d_oi-reset", at(time.Hour)),
			rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: quotaBackoffBase, claims: "5h"},
	})
}

// TestLadderProductionCapture: the production weekly 429 (status
// rejected, 7d allowed_warning at 0.94, 7d_oi rejected at 1.0,
// retry-after 51811) is an opus family gate until the weekly reset, not an
// account-wide cooldown: 5h and 7d are not rejected.
func TestLadderProductionCapture(t *testing.T) {
	t.Parallel()
	c := captureNamed(t, "429-weekly-rejected")
	now, err := http.ParseTime(c.date)
	if err != nil {
		t.Fatal(err)
	}
	checkLadder(t, ladderCase{h: maps.Clone(c.headers), family: "opus",
		rung: rungFamilyGate, action: actFailover, gate: true, until: 51811 * time.Second, claims: "7d_oi"}, now)
	// The same answer to a sonnet request gates sonnet: the gate follows
	// the request, since the account answered for it.
	checkLadder(t, ladderCase{h: maps.Clone(c.headers), family: "sonnet",
		rung: rungFamilyGate, action: actFailover, gate: true, until: 51811 * time.Second, claims: "7d_oi"}, now)
	// With 7d rejected too it is the account's weekly window.
	h := maps.Clone(c.headers)
	h[unifiedPrefix+"7d-status"], h[unifiedPrefix+"7d-utilization"] = "rejected", "1.0"
	checkLadder(t, ladderCase{h: h,
		rung: rungAccountQuota, action: actFailover, reason: reasonQuota, until: 51811 * time.Second, claims: "7d"}, now)

	// The burst captures, on a subscription account: retried in place.
	for _, c := range readCaptureOutcomes(t) {
		if c.name != "429-burst" && c.name != "429-retry-after-date" {
			continue
		}
		now, err := http.ParseTime(c.date)
		if err != nil {
			t.Fatal(err)
		}
		want := 2 * time.Second // 429-burst's retry-after; the other's is 91 s: not a burst's
		checkLadder(t, ladderCase{h: maps.Clone(c.headers), rung: rungBurst, action: actRetrySame, retry: want}, now)
	}
}

// TestLadderEvidence: what operators and the usage poller read back.
func TestLadderEvidence(t *testing.T) {
	t.Parallel()
	o := &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, ErrorType: "rate_limit_error",
		Headers: hdr("status", "rejected", "5h-status", "rejected", "5h-reset", at(time.Hour), "7d-status", "rejected", "7d-reset", at(48*time.Hour))}
	d := Decide(o, Facts{OAuth: true, Family: "opus"}, epoch)
	var ev Evidence
	if err := json.Unmarshal(d.Cooldown.Evidence, &ev); err != nil {
		t.Fatal(err)
	}
	want := []Claim{{Claim: "5h", Minutes: 300, Reset: epoch.Add(time.Hour).Unix()}, {Claim: "7d", Minutes: 10080, Reset: epoch.Add(48 * time.Hour).Unix()}}
	if len(ev.Claims) != 2 || ev.Claims[0] != want[0] || ev.Claims[1] != want[1] || ev.Rung != rungAccountQuota || ev.Family != "" {
		t.Errorf("evidence %+v, want claims %+v", ev, want)
	}
	if got := EvidenceSummary(d.Cooldown.Evidence); got != "rate_limited, status 429, rate_limit_error, unified rejected, 5h+7d rejected" {
		t.Errorf("summary %q", got)
	}

	o.Headers = hdr("status", "rejected", "7d-status", "rejected")
	d = Decide(o, Facts{QuotaBackoffs: 2}, epoch)
	if got := EvidenceSummary(d.Cooldown.Evidence); got != "rate_limited, status 429, rate_limit_error, unified rejected, 7d rejected, no valid reset, backoff step 3" {
		t.Errorf("summary %q", got)
	}

	o.Headers = hdr("status", "rejected", "overage-disabled-reason", "out_of_credits", "retry-after", "20")
	d = Decide(o, Facts{}, epoch)
	if got := EvidenceSummary(d.Cooldown.Evidence); got != "rate_limited, status 429, rate_limit_error, retry-after 20, unified rejected, out of credits" {
		t.Errorf("summary %q", got)
	}

	o.Headers = hdr("status", "rejected", "7d_oi-status", "rejected")
	d = Decide(o, Facts{Family: "opus"}, epoch)
	if err := json.Unmarshal(d.Gate.Evidence, &ev); err != nil || ev.Family != "opus" || ev.Rung != rungFamilyGate {
		t.Errorf("gate evidence %+v (%v)", ev, err)
	}

	// A burst writes nothing; bytes already sent turn it into an answer.
	o = &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, BytesToClient: true}
	d = Decide(o, Facts{OAuth: true}, epoch)
	if d.Action != weirv1.Action_ACTION_RESPOND || d.RetryAfter != 0 || d.Cooldown != nil || d.Rung != rungBurst {
		t.Errorf("burst after bytes: %+v", d)
	}
}

// FuzzLadder: no header set makes the ladder write a deadline in the past,
// one past the 8-day bound (the out-of-credits floor aside), or a burst
// retry with a cooldown.
func FuzzLadder(f *testing.F) {
	for _, c := range readCaptureOutcomes(f) {
		f.Add(c.headers["retry-after"], c.headers[unifiedPrefix+"status"], c.headers[unifiedPrefix+"5h-status"], c.headers[unifiedPrefix+"5h-reset"],
			c.headers[unifiedPrefix+"7d_oi-status"], c.headers[unifiedPrefix+"representative-claim"], c.headers[unifiedPrefix+"reset"], true, int32(0))
	}
	f.Fuzz(func(t *testing.T, ra, status, st5h, reset5h, stScoped, rep, reset string, oauth bool, bursts int32) {
		h := hdr("retry-after", ra, "status", status, "5h-status", st5h, "5h-reset", reset5h, "7d_oi-status", stScoped,
			"representative-claim", rep, "reset", reset)
		d := Decide(&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Headers: h, PriorBursts: bursts},
			Facts{OAuth: oauth, Family: "opus", QuotaBackoffs: bursts}, epoch)
		switch d.Action {
		case actRetrySame:
			if d.Cooldown != nil || d.Gate != nil || d.RetryAfter < BurstRetryMin || d.RetryAfter > burstRetryAfterMax {
				t.Fatalf("burst %+v", d)
			}
		case actFailover:
			var until time.Time
			switch {
			case d.Gate != nil && d.Cooldown == nil:
				until = d.Gate.Until
			case d.Cooldown != nil && d.Gate == nil:
				until = d.Cooldown.Until
			default:
				t.Fatalf("failover with cooldown %+v and gate %+v", d.Cooldown, d.Gate)
			}
			if !until.After(epoch) || until.After(epoch.Add(maxClaimReset)) {
				t.Fatalf("deadline now%+v", until.Sub(epoch))
			}
		default:
			t.Fatalf("action %v", d.Action)
		}
	})
}
