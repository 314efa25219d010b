package policy

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/backoff"
	"github.com/weirhq/weir/internal/failpolicy"
	"github.com/weirhq/weir/internal/vocab"
)

// Cooldown lengths when the upstream gives no deadline of its own.
const (
	TransportCooldown        = 10 * time.Second
	defaultRateLimitCooldown = 60 * time.Second
	authCooldownBase         = time.Minute
	authCooldownMax          = time.Hour
)

// An overloaded answer is retried once on the same account, after 1 s (a
// blip: switching accounts throws away the prompt cache), then the request
// fails over to an account that answers; when another account is known
// to be answering (Facts.OthersAnswering), it fails over at once. Each further retry would double
// the wait, to at most 8 s; one keeps a healthy account at most a second
// away. When every account is overloaded, the shared breaker paces the
// provider (breaker.go).
const (
	overloadRetries   = 1
	overloadRetryBase = time.Second
	overloadRetryMax  = 8 * time.Second
)

// Effects is what the control plane concludes from one attempt: what it
// writes (the cooldown with its quota record, the family gate, the
// breaker change, the ladder state, the success record) and what it
// answers the worker (the action, its wait, the rung). The control plane
// applies them in one place (applyEffects).
type Effects struct {
	Action weirv1.Action
	// RetryAfter is the wait before ACTION_RETRY_SAME.
	RetryAfter time.Duration
	// Rung is the 429 ladder's rung that decided a rate limit.
	Rung Rung
	// Cooldown is the cooldown to write; nil for none.
	Cooldown *CooldownWrite
	// Gate excludes the account for one model family only.
	Gate *GateWrite
	// Breaker is what the attempt does to its provider and family's
	// overload breaker.
	Breaker BreakerChange
	// Success records the account's success (which ends a recovery probe,
	// clears an out-of-credits cooldown written before the attempt and
	// the ladder's state); AuthFailure is a credential rejection the
	// account's record counts; Overload feeds the family's breaker;
	// QuotaBackoff counts an account-wide quota rejection that had no
	// usable reset (the ladder's state).
	Success, AuthFailure, Overload, QuotaBackoff bool
}

// BreakerChange is what an attempt does to its family's overload breaker.
type BreakerChange int

const (
	// BreakerUnchanged: a call with no model family, or evidence too old
	// to say anything of the provider now.
	BreakerUnchanged BreakerChange = iota
	// BreakerClose: a real answer from the provider (a success, a rate
	// limit, a client error) shows it serving again.
	BreakerClose
	// BreakerFreeProbe: the attempt ended without an answer (a dropped
	// connection, a gateway error, a broken stream, a client that left);
	// it only gives back the probe slot it may have held.
	BreakerFreeProbe
	// BreakerOverload: one more overload answer (AfterOverload).
	BreakerOverload
)

// CooldownWrite is a cooldown to write.
type CooldownWrite struct {
	Reason   weirv1.CooldownReason
	Until    time.Time
	Evidence []byte
	// Quota is the quota evidence behind Until, when quota is the reason.
	Quota *QuotaRecord
}

// QuotaRecord is the quota evidence stored with the cooldown it justified.
type QuotaRecord struct {
	Kind weirv1.QuotaKind
	// ResetsAt is the reset the evidence names; zero when it named none
	// (insufficient_quota, out of credits, a rejection without a usable
	// reset): such evidence blocks the account with no known end (routing,
	// quotaUntil).
	ResetsAt time.Time
	// WindowMinutes is the exhausted window (300, 10080); 0 when unknown.
	WindowMinutes int32
	// Message is the upstream's error, one line.
	Message string
}

// GateWrite is a family gate to write.
type GateWrite struct {
	Family   string
	Until    time.Time
	Evidence []byte
}

// Facts is what Decide knows of an attempt beyond its outcome: the
// account's state and the request's model family.
type Facts struct {
	// AuthFailures is the account's count of consecutive credential
	// rejections including this one (it sets how long an invalid
	// credential is kept out).
	AuthFailures int32
	OAuth        bool
	// Family is ModelFamily of the lease's model.
	Family string
	// QuotaBackoffs is the account's count of consecutive account-wide
	// quota rejections without a usable reset, before this attempt.
	QuotaBackoffs int32
	// RecoveryProbe: the lease was the recovery probe of an account whose
	// quota cooldown a reading lifted. Spent are the account-wide windows
	// the usage view shows spent (utilization at SpentAt or above, reset
	// ahead), as claims (SpentClaim).
	RecoveryProbe bool
	Spent         []Claim
	// Stale: the account's credential was replaced while the attempt ran,
	// so a rejection was of the old one and says nothing of the new.
	Stale bool
	// OthersAnswering: another account of the provider answered within
	// AnsweringWindow. An overloaded account's request then fails over at
	// once: a peer serves it in milliseconds, where a same-account retry
	// costs a second.
	OthersAnswering bool
}

// AnsweringWindow is how recent another account's answer must be for an
// overload to fail over at once.
const AnsweringWindow = 10 * time.Second

// freshOverload is how old an overload answer may be and still move a
// breaker.
const freshOverload = 10 * time.Second

// maxReportDelay bounds how far back a redelivered report is dated: a
// lease row outlives its expiry by the reaper's grace, 10 minutes; an
// older report finds no lease.
const maxReportDelay = 10 * time.Minute

// attemptEnded dates an outcome: now, or for a report a worker redelivers
// after an outage, now less its delay, by at most maxReportDelay.
func attemptEnded(o *weirv1.Outcome, now time.Time) time.Time {
	d := o.GetDelay().AsDuration()
	if d <= 0 {
		return now
	}
	return now.Add(-min(d, maxReportDelay))
}

// Decide turns an attempt's evidence into its effects at now: the class's
// default action (failpolicy, the table a worker also acts on when it
// cannot ask), refined by the evidence as of when the attempt ended (a
// redelivered report's is earlier). What a stale credential's rejection
// would write is dropped, so is a cooldown already over, and only fresh
// evidence moves a breaker.
func Decide(o *weirv1.Outcome, f Facts, now time.Time) Effects {
	at := attemptEnded(o, now)
	d := decideAt(o, f, at)
	if f.Stale {
		d.Cooldown, d.AuthFailure = nil, false
	}
	if d.Cooldown != nil && !d.Cooldown.Until.After(now) {
		// A redelivered report whose cooldown is already over.
		d.Cooldown = nil
	}
	d.Breaker = breakerChange(o.GetClass(), d.Overload, f.Family, now.Sub(at) <= freshOverload)
	return d
}

// breakerChange is what an attempt of class does to family's breaker. A
// success closes it (its record does, whenever it is reported); an
// overload answer from before an outage says nothing of the upstream now,
// so any other evidence moves the breaker only while fresh.
func breakerChange(class weirv1.OutcomeClass, overload bool, family string, fresh bool) BreakerChange {
	switch {
	case family == "":
		return BreakerUnchanged
	case class == weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS:
		return BreakerClose
	case !fresh:
		return BreakerUnchanged
	case overload:
		return BreakerOverload
	}
	switch class {
	case weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR,
		weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR, weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED,
		weirv1.OutcomeClass_OUTCOME_CLASS_NOT_SENT:
		return BreakerFreeProbe
	}
	return BreakerClose
}

// decideAt is Decide's verdict on the evidence alone, for an attempt that
// ended at now.
func decideAt(o *weirv1.Outcome, f Facts, now time.Time) Effects {
	d := Effects{Action: failpolicy.Default(o.GetClass())}
	switch o.GetClass() {
	case weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS:
		d.Success = true
	case weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR:
		d.AuthFailure = true
		wait := backoff.Capped(authCooldownBase, authCooldownMax, int(f.AuthFailures)-1)
		d.Cooldown = newCooldown(weirv1.CooldownReason_COOLDOWN_REASON_INVALID_CREDENTIAL, now.Add(wait), o)
	case weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED:
		if q := o.GetQuota(); knownQuota(q) {
			// The upstream said outright that the account's quota is spent
			// (Codex usage_limit_reached, OpenAI insufficient_quota, Google
			// QUOTA_EXHAUSTED): no ladder to climb.
			d = providerQuota(o, q, f, now)
			break
		}
		l := ladder(ladderInput{headers: o.GetHeaders(), oauth: f.OAuth, family: f.Family,
			priorBursts: o.GetPriorBursts(), quotaBackoffs: f.QuotaBackoffs,
			recoveryProbe: f.RecoveryProbe, spent: f.Spent, now: now})
		d.Action, d.RetryAfter, d.QuotaBackoff, d.Rung = l.action, l.retryAfter, l.quotaBackoff, l.rung
		switch {
		case l.gate:
			d.Gate = &GateWrite{Family: f.Family, Until: l.until, Evidence: ladderEvidenceJSON(o, l, f.Family)}
		case l.reason != weirv1.CooldownReason_COOLDOWN_REASON_UNSPECIFIED:
			d.Cooldown = &CooldownWrite{Reason: l.reason, Until: l.until, Evidence: ladderEvidenceJSON(o, l, ""),
				Quota: ladderQuota(l, o)}
		}
	case weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR:
		// A run of one, until the control plane finds the run it continues
		// (ContinueRun).
		e := newEvidence(o)
		e.Since, e.Attempts = &now, 1
		b, _ := json.Marshal(e)
		d.Cooldown = &CooldownWrite{Reason: weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT, Until: now.Add(TransportCooldown), Evidence: b}
	case weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED:
		// The provider's condition, not the account's: no cooldown.
		d.Overload = true
		if prior := o.GetPriorOverloads(); prior < overloadRetries && !f.OthersAnswering {
			d.Action = weirv1.Action_ACTION_RETRY_SAME
			d.RetryAfter = min(overloadRetryBase<<prior, overloadRetryMax)
		}
	case weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR:
		if q := o.GetQuota(); knownQuota(q) {
			// The quota ran out mid-answer: the account is as spent as if it
			// had said so up front.
			d = providerQuota(o, q, f, now)
		}
	case weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR:
		// A gateway on the way failed; the account and the provider may be
		// fine. Try another account at once (the default), cool nothing.
	}
	if o.GetBytesToClient() {
		// Once the client has bytes, nothing can be replayed.
		d.Action, d.RetryAfter = weirv1.Action_ACTION_RESPOND, 0
	}
	return d
}

// providerQuota decides a 429 that carried explicit quota evidence: cool
// the account until the reset the upstream named (resets_at, else
// resets_in_seconds or retryDelay), or back off like an Anthropic
// rejection without a usable reset. insufficient_quota names no reset: it
// is a billing matter, kept out for the out-of-credits floor.
func providerQuota(o *weirv1.Outcome, q *weirv1.QuotaEvidence, f Facts, now time.Time) Effects {
	d := Effects{Action: weirv1.Action_ACTION_FAILOVER, Rung: rungProviderQuota}
	rec := &QuotaRecord{Kind: q.GetKind(), WindowMinutes: q.GetWindowMinutes(), Message: oneLine(q.GetMessage())}
	if rec.Message == "" {
		rec.Message = oneLine(o.GetErrorMessage())
	}
	e := newEvidence(o)
	e.Rung = rungProviderQuota
	if q.GetKind() == weirv1.QuotaKind_QUOTA_KIND_OPENAI_INSUFFICIENT_QUOTA {
		b, _ := json.Marshal(e)
		d.Cooldown = &CooldownWrite{Reason: weirv1.CooldownReason_COOLDOWN_REASON_OUT_OF_CREDITS,
			Until: now.Add(OutOfCreditsFloor), Evidence: b, Quota: rec}
		return d
	}
	if reset, ok := quotaReset(q, now); ok {
		rec.ResetsAt = reset
		b, _ := json.Marshal(e)
		d.Cooldown = &CooldownWrite{Reason: weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED,
			Until: reset, Evidence: b, Quota: rec}
		return d
	}
	d.QuotaBackoff = true
	e.BackoffStep = f.QuotaBackoffs + 1
	b, _ := json.Marshal(e)
	d.Cooldown = &CooldownWrite{Reason: weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED,
		Until: now.Add(min(quotaBackoffBase<<min(max(f.QuotaBackoffs, 0), 10), quotaBackoffMax)), Evidence: b, Quota: rec}
	return d
}

// knownQuota says whether q is quota evidence of a kind this build knows:
// a newer worker's kind is read as no quota evidence at all (the ladder
// decides), never stored under a name the vocabulary lacks.
func knownQuota(q *weirv1.QuotaEvidence) bool {
	if q == nil || q.GetKind() == weirv1.QuotaKind_QUOTA_KIND_UNSPECIFIED {
		return false
	}
	return q.GetKind().Descriptor().Values().ByNumber(q.GetKind().Number()) != nil
}

// quotaReset is when quota evidence says the quota reopens: resets_at when
// it lies ahead and is believable, else now plus reset_after.
func quotaReset(q *weirv1.QuotaEvidence, now time.Time) (time.Time, bool) {
	if q.GetResetsAt() != nil {
		t := q.GetResetsAt().AsTime()
		if t.After(now) && t.Sub(now) <= maxClaimReset {
			return t.Truncate(time.Second), true
		}
	}
	if q.GetResetAfter() != nil {
		if d := q.GetResetAfter().AsDuration(); d > 0 && d <= maxClaimReset {
			return now.Add(d), true
		}
	}
	return time.Time{}, false
}

// ladderQuota is the quota evidence of a ladder decision that cooled an
// account on its quota: out of credits (rung 2), which names no reset (an
// operator adds credits), or its spent windows (rungs 3 and 4), the window
// whose reset is the deadline kept. A backoff without a usable reset names
// no reset.
func ladderQuota(l ladderDecision, o *weirv1.Outcome) *QuotaRecord {
	switch l.rung {
	case rungOutOfCredits:
		return &QuotaRecord{Kind: weirv1.QuotaKind_QUOTA_KIND_ANTHROPIC_OUT_OF_CREDITS, Message: oneLine(o.GetErrorMessage())}
	case rungAccountQuota, rungCachedQuota:
	default:
		return nil
	}
	rec := &QuotaRecord{Kind: weirv1.QuotaKind_QUOTA_KIND_ANTHROPIC_WINDOW, Message: oneLine(o.GetErrorMessage())}
	if l.quotaBackoff {
		return rec
	}
	rec.ResetsAt = l.until
	for _, c := range l.claims {
		if c.Reset == l.until.Unix() && int32(c.Minutes) > rec.WindowMinutes {
			rec.WindowMinutes = int32(c.Minutes)
		}
	}
	return rec
}

// oneLine collapses s to one line of at most 300 bytes.
func oneLine(s string) string {
	return Truncate(strings.Join(strings.Fields(s), " "), 300)
}

// Truncate is s cut to at most n bytes, on a rune boundary.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func newCooldown(reason weirv1.CooldownReason, until time.Time, o *weirv1.Outcome) *CooldownWrite {
	return &CooldownWrite{Reason: reason, Until: until, Evidence: EvidenceOf(o)}
}

// maxRetryAfter caps what an upstream can ask for: a weekly window plus a
// day. A larger or non-finite value would overflow a time.Duration.
const maxRetryAfter = 8 * 24 * time.Hour

// retryAfter reads retry-after-ms, then retry-after (seconds or an HTTP
// date). Non-positive, non-finite, unparseable or sub-nanosecond values
// are ignored.
func retryAfter(h map[string]string, now time.Time) (time.Duration, bool) {
	if v, ok := h["retry-after-ms"]; ok {
		if ms, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && ms > 0 && !math.IsInf(ms, 0) {
			if d := min(time.Duration(min(ms, float64(maxRetryAfter/time.Millisecond))*float64(time.Millisecond)), maxRetryAfter); d > 0 {
				return d, true
			}
		}
	}
	v, ok := h["retry-after"]
	if !ok {
		return 0, false
	}
	v = strings.TrimSpace(v)
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s > 0 && !math.IsInf(s, 0) {
			d := min(time.Duration(min(s, maxRetryAfter.Seconds())*float64(time.Second)), maxRetryAfter)
			return d, d > 0
		}
		return 0, false
	}
	if t, ok := httpDate(v); ok && t.After(now) {
		return min(t.Sub(now), maxRetryAfter), true
	}
	return 0, false
}

// Evidence is the JSON kept with every cooldown and family gate.
type Evidence struct {
	Class          string            `json:"class"`
	Status         int32             `json:"status,omitempty"`
	ErrorType      string            `json:"error_type,omitempty"`
	TransportError string            `json:"transport_error,omitempty"`
	Headers        map[string]string `json:"headers,omitempty"`
	// Rung is the 429 ladder's rung that decided; Claims the rejecting
	// unified claims it read (which windows, their resets); Family the
	// gated model family; BackoffStep the consecutive account-wide
	// rejections without a usable reset, this one included.
	Rung        Rung    `json:"rung,omitempty"`
	Claims      []Claim `json:"claims,omitempty"`
	Family      string  `json:"family,omitempty"`
	BackoffStep int32   `json:"backoff_step,omitempty"`
	// Cause is a transport failure's (TransportCause: "dns", "refused",
	// …); Since and Attempts its run: when the first failure with no
	// success since came, and how many there were (unreachable.go).
	Cause    string     `json:"cause,omitempty"`
	Since    *time.Time `json:"since,omitempty"`
	Attempts int32      `json:"attempts,omitempty"`
}

func newEvidence(o *weirv1.Outcome) Evidence {
	return Evidence{
		Class:          vocab.Name(o.GetClass()),
		Status:         o.GetStatus(),
		ErrorType:      o.GetErrorType(),
		TransportError: o.GetTransportError(),
		Cause:          causeName(o.GetTransportCause()),
		Headers:        o.GetHeaders(),
	}
}

// EvidenceOf is the stored evidence of an outcome, JSON.
func EvidenceOf(o *weirv1.Outcome) []byte {
	b, _ := json.Marshal(newEvidence(o))
	return b
}

// ladderEvidenceJSON is the evidence of a 429 with the ladder's reading.
func ladderEvidenceJSON(o *weirv1.Outcome, l ladderDecision, family string) []byte {
	e := newEvidence(o)
	e.Rung, e.Claims, e.Family, e.BackoffStep = l.rung, l.claims, family, l.backoffStep
	b, _ := json.Marshal(e)
	return b
}

// EvidenceSummary renders stored evidence as one line for operators.
func EvidenceSummary(raw []byte) string {
	var e Evidence
	if json.Unmarshal(raw, &e) != nil {
		return ""
	}
	parts := []string{e.Class}
	if e.Status != 0 {
		parts = append(parts, fmt.Sprintf("status %d", e.Status))
	}
	if e.ErrorType != "" {
		parts = append(parts, e.ErrorType)
	}
	if v := e.Headers["retry-after"]; v != "" {
		parts = append(parts, "retry-after "+v)
	}
	if v := e.Headers["anthropic-ratelimit-unified-status"]; v != "" {
		parts = append(parts, "unified "+v)
	}
	if e.Rung == rungOutOfCredits {
		parts = append(parts, "out of credits")
	}
	if len(e.Claims) > 0 {
		var names []string
		for _, c := range e.Claims {
			names = append(names, c.Claim)
		}
		parts = append(parts, strings.Join(names, "+")+" rejected")
	}
	if e.BackoffStep > 0 {
		parts = append(parts, fmt.Sprintf("no valid reset, backoff step %d", e.BackoffStep))
	}
	switch {
	case e.Cause != "" && e.TransportError != "":
		parts = append(parts, e.Cause+": "+e.TransportError)
	case e.TransportError != "":
		parts = append(parts, e.TransportError)
	}
	if e.Attempts > 1 && e.Since != nil {
		parts = append(parts, fmt.Sprintf("%d attempts since %s", e.Attempts, e.Since.UTC().Format(time.RFC3339)))
	}
	return strings.Join(parts, ", ")
}

// httpDate reads an HTTP date in the three forms RFC 9110 admits (as
// net/http's ParseTime does).
func httpDate(v string) (time.Time, bool) {
	for _, layout := range []string{"Mon, 02 Jan 2006 15:04:05 GMT", time.RFC850, time.ANSIC} {
		if t, err := time.Parse(layout, v); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}
