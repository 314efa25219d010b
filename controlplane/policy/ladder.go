package policy

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/backoff"
)

// The Anthropic 429 decision ladder (the captures behind it: docs/wire.md): what a rate-limited answer
// means for the account, most specific evidence first. The order is
// load-bearing. x-should-retry: true and a small retry-after come with real
// limits as well as with bursts, so only the unified claims tell them
// apart: out of credits outranks a live claim, an account-wide claim
// outranks a scoped one, and nothing that names a spent window may ever be
// read as a burst.

// Lengths the ladder chooses when the evidence gives none.
const (
	// OutOfCreditsFloor is the least an out-of-credits account is kept out.
	OutOfCreditsFloor = 6 * time.Hour
	// An account-wide rejection without a usable reset backs off 30 s,
	// doubling with each consecutive one, to 5 min.
	quotaBackoffBase = 30 * time.Second
	quotaBackoffMax  = 5 * time.Minute
	// familyGateDefault gates a family when the scoped claim has no usable
	// reset and the answer no retry-after.
	familyGateDefault = time.Hour
	// A burst is retried on the same account at most BurstRetries times
	// per request, after max(retry-after if at most burstRetryAfterMax,
	// BurstRetryMin).
	BurstRetries       = 2
	BurstRetryMin      = 2 * time.Second
	burstRetryAfterMax = 10 * time.Second
	// RecoveryReprobe re-cools a recovering account whose probe failed
	// transiently: briefly, under the quota reason, then one more probe.
	RecoveryReprobe = 60 * time.Second
	// maxClaimReset is the furthest a believable reset lies ahead: a weekly
	// window plus a day. Further is a bug or a unit mix-up, not a reset.
	maxClaimReset = 8 * 24 * time.Hour
)

// Rung names the ladder's rung that decided a 429; it is stored in the
// evidence and labels the metric.
type Rung string

const (
	rungRecovery     Rung = "recovery_reprobe"
	rungOutOfCredits Rung = "out_of_credits"
	rungAccountQuota Rung = "account_quota"
	rungCachedQuota  Rung = "cached_quota"
	rungFamilyGate   Rung = "family_gate"
	rungBurst        Rung = "burst"
	rungResidual     Rung = "residual"
	// rungProviderQuota is not a rung of the Anthropic ladder: an OpenAI-side
	// answer that named its quota outright (providerQuota).
	rungProviderQuota Rung = "provider_quota"
)

// ladderInput is what the ladder reads: the 429's headers and what the
// control plane knows of the account and the request.
type ladderInput struct {
	headers map[string]string
	oauth   bool
	// family is modelFamily of the lease's model; "" for model-less calls.
	family string
	// priorBursts is how often this request already retried a burst on
	// this account; quotaBackoffs the account's consecutive account-wide
	// rejections without a usable reset before this one.
	priorBursts, quotaBackoffs int32
	// recoveryProbe: the lease was the recovery probe of an account whose
	// quota cooldown a reading lifted.
	recoveryProbe bool
	// spent are the account-wide windows the usage view shows spent
	// (utilization at SpentAt or above, reset ahead), as claims.
	spent []Claim
	now   time.Time
}

// ladderDecision is the ladder's verdict on one 429.
type ladderDecision struct {
	rung   Rung
	action weirv1.Action
	// reason is the cooldown's; UNSPECIFIED means no cooldown.
	reason weirv1.CooldownReason
	// until ends the cooldown, or the gate when gate is set.
	until time.Time
	// gate: exclude the account for the request's model family only.
	gate bool
	// retryAfter is the wait before ACTION_RETRY_SAME.
	retryAfter time.Duration
	// claims are the rejecting claims that decided it.
	claims []Claim
	// quotaBackoff: an account-wide rejection without a usable reset, to be
	// counted; backoffStep is its count including this one.
	quotaBackoff bool
	backoffStep  int32
}

// Claim is one rejecting unified claim, as the evidence records it.
type Claim struct {
	// Claim is the header infix (5h, 7d, 7d_oi) or the representative
	// claim (seven_day_opus) that said rejected.
	Claim string `json:"claim"`
	// Minutes is the window's length for the account-wide windows: 300
	// (five hours) or 10080 (seven days).
	Minutes int `json:"minutes,omitempty"`
	// Reset is the claim's valid reset in epoch seconds; 0 when it had none.
	Reset int64 `json:"reset,omitempty"`
}

// ladder decides a 429. Pure: a function of the evidence, the account's
// state and now.
func ladder(in ladderInput) ladderDecision {
	u := readUnified(in.headers, in.now)

	// Rung 1: the recovery re-probe. A probe of a recovering account that
	// fails transiently (no claim rejects, the view shows nothing spent)
	// re-cools it briefly under the quota reason, then probes again: not
	// a residual's full cooldown, nor a burst retry that would keep the
	// probe slot. Real evidence (a rejection, a spent window) falls to
	// the rungs below. A probe's success ends the probe and lifts an
	// out-of-credits cooldown (its success record, RecordReleaseSuccess).
	if in.recoveryProbe && !u.anyRejected && len(in.spent) == 0 {
		return ladderDecision{rung: rungRecovery, action: weirv1.Action_ACTION_FAILOVER,
			reason: weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, until: in.now.Add(RecoveryReprobe)}
	}

	// Rung 2: out of credits. No burst retry, and a long floor: the
	// account cannot pay for what its plan windows reject.
	if u.outOfCredits() {
		until := in.now.Add(OutOfCreditsFloor)
		if u.reset.After(until) {
			until = u.reset
		}
		return ladderDecision{rung: rungOutOfCredits, action: weirv1.Action_ACTION_FAILOVER,
			reason: weirv1.CooldownReason_COOLDOWN_REASON_OUT_OF_CREDITS, until: until, claims: u.accountWide}
	}

	// Rung 3: a live account-wide claim (5h or 7d rejected). Until the
	// latest valid reset among them: never a scoped claim's reset, never
	// retry-after when a valid reset exists.
	if len(u.accountWide) > 0 {
		d := ladderDecision{rung: rungAccountQuota, action: weirv1.Action_ACTION_FAILOVER,
			reason: weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, claims: u.accountWide}
		if reset, ok := latestReset(u.accountWide); ok {
			d.until = reset
			return d
		}
		d.quotaBackoff, d.backoffStep = true, in.quotaBackoffs+1
		d.until = in.now.Add(backoff.Capped(quotaBackoffBase, quotaBackoffMax, int(in.quotaBackoffs)))
		return d
	}

	// Rung 4: cached account-wide exhaustion. The answer rejects no
	// account-wide claim, but the usage view shows the 5h or weekly window
	// spent: cool until the latest reset among them. It outranks a scoped
	// claim and stops a spent account from being read as a burst below.
	// Its counterpart, a reading that shows a window recovered, may lift
	// only quota_exhausted cooldowns: per-IP burst cooldowns
	// (rate_limited) are never released on account-quota evidence, and
	// out_of_credits never by a reading (Recovered, and the control
	// plane's recoverQuota).
	if reset, ok := latestReset(in.spent); ok {
		return ladderDecision{rung: rungCachedQuota, action: weirv1.Action_ACTION_FAILOVER,
			reason: weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, until: reset, claims: in.spent}
	}

	// Rung 5: a scoped weekly window (7d_oi, seven_day_opus) is spent while
	// the account-wide windows have room: gate this model family only.
	if len(u.scoped) > 0 && in.family != "" {
		d := ladderDecision{rung: rungFamilyGate, action: weirv1.Action_ACTION_FAILOVER, gate: true, claims: u.scoped}
		if reset, ok := latestReset(u.scoped); ok {
			d.until = reset
		} else if ra, ok := retryAfter(in.headers, in.now); ok {
			d.until = in.now.Add(ra)
		} else {
			d.until = in.now.Add(familyGateDefault)
		}
		return d
	}

	// Rung 6: a burst. A subscription account whose answer rejects no claim
	// and shows headroom is retried in place after a short wait: no
	// cooldown, nothing recorded as exhaustion.
	if in.oauth && u.headroom() && in.priorBursts < BurstRetries {
		wait := BurstRetryMin
		if ra, ok := retryAfter(in.headers, in.now); ok && ra <= burstRetryAfterMax {
			wait = max(ra, BurstRetryMin)
		}
		return ladderDecision{rung: rungBurst, action: weirv1.Action_ACTION_RETRY_SAME, retryAfter: wait}
	}

	// Rung 7: the residual. Retry-After, else the unified reset, else the
	// default; another account serves.
	until := in.now.Add(defaultRateLimitCooldown)
	if ra, ok := retryAfter(in.headers, in.now); ok {
		until = in.now.Add(ra)
	} else if u.reset.After(in.now) {
		until = u.reset
	}
	return ladderDecision{rung: rungResidual, action: weirv1.Action_ACTION_FAILOVER,
		reason: weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED, until: until}
}

const unifiedPrefix = "anthropic-ratelimit-unified-"

// Claim statuses. Any other value is not trusted: it neither rejects nor
// shows headroom.
const (
	statusAllowed        = "allowed"
	statusAllowedWarning = "allowed_warning"
	statusRejected       = "rejected"
)

// accountWindows are the account-wide windows: header infix,
// representative claim, length in minutes.
var accountWindows = []struct {
	key, claim string
	minutes    int
}{
	{"5h", "five_hour", 300},
	{"7d", "seven_day", 10080},
}

// scopedClaims maps the representative claims of scoped weekly windows to
// their header infix, where they have one.
var scopedClaims = map[string]string{
	"seven_day_opus":             "",
	"seven_day_sonnet":           "",
	"seven_day_overage_included": "7d_oi",
}

// unified is what a 429's unified headers say, read once.
type unified struct {
	// status is the overall status when weir knows the value; rawStatus
	// is whatever was sent.
	status, rawStatus string
	// reset is the overall (representative) reset when valid, else zero.
	reset time.Time
	// accountWide and scoped are the rejecting claims.
	accountWide, scoped []Claim
	// anyRejected: some claim, or the overall status, says rejected.
	anyRejected bool
	// spent: an account-wide window reports a utilization of 1 or more,
	// or one that cannot be read.
	spent              bool
	overageDisabledWhy string
}

func readUnified(h map[string]string, now time.Time) unified {
	get := func(name string) string { return strings.ToLower(strings.TrimSpace(h[unifiedPrefix+name])) }
	u := unified{rawStatus: get("status"), overageDisabledWhy: get("overage-disabled-reason")}
	u.status = trustedStatus(u.rawStatus)
	u.reset, _ = validReset(h[unifiedPrefix+"reset"], now)
	rep := ""
	if u.status == statusRejected {
		rep = get("representative-claim")
	}

	for _, w := range accountWindows {
		raw := get(w.key + "-status")
		// The representative claim speaks for a window that has no status
		// header of its own.
		isRep := rep == w.claim && raw == ""
		if trustedStatus(raw) == statusRejected || isRep {
			c := Claim{Claim: w.key, Minutes: w.minutes}
			if t, ok := validReset(h[unifiedPrefix+w.key+"-reset"], now); ok {
				c.Reset = t.Unix()
			} else if isRep && !u.reset.IsZero() {
				c.Reset = u.reset.Unix()
			}
			u.accountWide = append(u.accountWide, c)
		}
		if v, ok := h[unifiedPrefix+w.key+"-utilization"]; ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil || !(f < 1) {
				u.spent = true
			}
		}
	}

	// Scoped claims: every other window with a status header of its own,
	// in a stable order, then a scoped representative claim.
	seen := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(h)) {
		key, ok := strings.CutPrefix(name, unifiedPrefix)
		if !ok {
			continue
		}
		key, ok = strings.CutSuffix(key, "-status")
		if !ok || key == "5h" || key == "7d" || key == "overage" || trustedStatus(get(key+"-status")) != statusRejected {
			continue
		}
		seen[key] = true
		c := Claim{Claim: key}
		if t, ok := validReset(h[unifiedPrefix+key+"-reset"], now); ok {
			c.Reset = t.Unix()
		} else if repKey, ok := scopedClaims[rep]; ok && repKey == key && !u.reset.IsZero() {
			// The representative's reset is this window's.
			c.Reset = u.reset.Unix()
		}
		u.scoped = append(u.scoped, c)
	}
	if key, ok := scopedClaims[rep]; ok && (key == "" || !seen[key]) {
		c := Claim{Claim: rep}
		if !u.reset.IsZero() {
			c.Reset = u.reset.Unix()
		}
		u.scoped = append(u.scoped, c)
	}
	u.anyRejected = u.status == statusRejected || len(u.accountWide) > 0 || len(u.scoped) > 0
	return u
}

// outOfCredits: rejected, and overage cannot pay for it.
func (u unified) outOfCredits() bool {
	return u.status == statusRejected && u.overageDisabledWhy == "out_of_credits"
}

// headroom: no claim rejects, the overall status is absent or allows, and
// no account-wide window is spent. A status weir does not know shows no
// headroom.
func (u unified) headroom() bool {
	allows := u.rawStatus == "" || u.status == statusAllowed || u.status == statusAllowedWarning
	return allows && !u.anyRejected && !u.spent
}

// trustedStatus is s when it is a status weir knows, else "".
func trustedStatus(s string) string {
	switch s {
	case statusAllowed, statusAllowedWarning, statusRejected:
		return s
	}
	return ""
}

// validReset reads a claim's reset: integer epoch seconds, in the future,
// no further than maxClaimReset.
func validReset(v string, now time.Time) (time.Time, bool) {
	sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	if sec <= now.Unix() || sec > now.Add(maxClaimReset).Unix() {
		return time.Time{}, false
	}
	return time.Unix(sec, 0), true
}

// latestReset is the latest valid reset among claims.
func latestReset(claims []Claim) (time.Time, bool) {
	var latest int64
	for _, c := range claims {
		latest = max(latest, c.Reset)
	}
	if latest == 0 {
		return time.Time{}, false
	}
	return time.Unix(latest, 0), true
}
