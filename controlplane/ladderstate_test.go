package controlplane

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// hdr builds a 429's decision headers from pairs; every name but
// retry-after, retry-after-ms and x-should-retry is a unified header and
// is given its prefix (as policy/ladder_test.go's).
func hdr(kv ...string) map[string]string {
	h := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		k := kv[i]
		if !strings.HasPrefix(k, "retry-after") && !strings.HasPrefix(k, "x-") {
			k = "anthropic-ratelimit-unified-" + k
		}
		h[k] = kv[i+1]
	}
	return h
}

// at is an epoch-seconds reset d after the test epoch.
func at(d time.Duration) string { return strconv.FormatInt(epoch.Add(d).Unix(), 10) }

// The 429 ladder through Release and Acquire, on a real Postgres: what it
// writes, and what routing makes of it.

const (
	opusModel   = "claude-opus-4-1-20250805"
	sonnetModel = "claude-sonnet-4-5-20250929"
)

func rateLimited(h map[string]string) *weirv1.Outcome {
	return &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, ErrorType: "rate_limit_error", Headers: h}
}

func succeeded() *weirv1.Outcome {
	return &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200}
}

// epochAfter is an epoch-seconds reset d after now.
func epochAfter(now time.Time, d time.Duration) string { return at(now.Sub(epoch) + d) }

// weeklyOpusRejected is the production weekly capture moved to now: 5h
// allowed at 0.21, 7d allowed_warning at 0.94, 7d_oi rejected at 1.0,
// every weekly reset and retry-after 51811 s away.
func weeklyOpusRejected(now time.Time) map[string]string {
	week := epochAfter(now, 51811*time.Second)
	return hdr("retry-after", "51811", "x-should-retry", "true",
		"status", "rejected", "reset", week, "representative-claim", "seven_day_overage_included", "fallback-percentage", "0.5",
		"5h-status", "allowed", "5h-utilization", "0.21", "5h-reset", epochAfter(now, 41811*time.Second),
		"7d-status", "allowed_warning", "7d-utilization", "0.94", "7d-reset", week, "7d-surpassed-threshold", "0.75",
		"7d_oi-status", "rejected", "7d_oi-utilization", "1.0", "7d_oi-reset", week,
		"overage-status", "rejected", "overage-disabled-reason", "org_level_disabled")
}

// subscription is a fresh environment with one OAuth account.
func subscription(t *testing.T) (*env, *weirv1.Account, string) {
	t.Helper()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{label: "max", kind: weirv1.AuthKind_AUTH_KIND_OAUTH, credential: oauthToken(), priority: 1})
	return e, a, keyHash
}

// gateRows reads an account's family gates, live or not.
func (e *env) gateRows(id string) []db.FamilyGate {
	e.t.Helper()
	rows, err := e.pool.Query(e.t.Context(), `SELECT account_id, family, until, written_at, evidence FROM family_gates WHERE account_id = $1 ORDER BY family`, uuid.MustParse(id))
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	var out []db.FamilyGate
	for rows.Next() {
		var g db.FamilyGate
		if err := rows.Scan(&g.AccountID, &g.Family, &g.Until, &g.WrittenAt, &g.Evidence); err != nil {
			e.t.Fatal(err)
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// probeLease inserts a lease admitted now on a cooling account, the way
// the recovery re-probe will; nothing else routes to a cooling account.
func (e *env) probeLease(accountID, model string) string {
	e.t.Helper()
	var id uuid.UUID
	now := e.clock.Now()
	err := e.pool.QueryRow(e.t.Context(), `INSERT INTO leases (account_id, request_id, model, credential_revision, acquired_at, expires_at)
		VALUES ($1, 'probe', $2, 1, $3, $4) RETURNING id`, uuid.MustParse(accountID), model, now, now.Add(time.Minute)).Scan(&id)
	if err != nil {
		e.t.Fatal(err)
	}
	return id.String()
}

// TestFamilyGateExcludesOnlyThatFamily: the production weekly 429 on an
// opus request gates the account for opus until the weekly reset; sonnet
// still uses it, opus goes elsewhere, and the gate's expiry restores it.
func TestFamilyGateExcludesOnlyThatFamily(t *testing.T) {
	t.Parallel()
	e, maxAcct, keyHash := subscription(t)
	other, _ := e.createAccount(acct{label: "other"})

	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: opusModel})
	if l.AccountId != maxAcct.Id {
		t.Fatalf("leased %s, want max", l.AccountLabel)
	}
	now := e.clock.Advance(time.Second)
	until := now.Add(51811 * time.Second)
	d := e.release(l.Id, rateLimited(weeklyOpusRejected(now)))
	if d.Action != weirv1.Action_ACTION_FAILOVER || d.Cooldown != nil || d.RetryAfter != nil {
		t.Fatalf("decision %v, want failover without an account-wide cooldown", d)
	}
	if cd := e.cooldownRow(maxAcct.Id); cd != nil {
		t.Fatalf("cooldown %+v written for a family limit", cd)
	}
	gates := e.gateRows(maxAcct.Id)
	if len(gates) != 1 || gates[0].Family != "opus" || !gates[0].Until.Equal(until) || !gates[0].WrittenAt.Equal(now) {
		t.Fatalf("gates %+v, want opus until now+51811s", gates)
	}
	var ev policy.Evidence
	if err := json.Unmarshal(gates[0].Evidence, &ev); err != nil || ev.Rung != "family_gate" || ev.Family != "opus" ||
		len(ev.Claims) != 1 || ev.Claims[0].Claim != "7d_oi" || ev.Claims[0].Reset != until.Unix() || ev.Headers["retry-after"] != "51811" {
		t.Errorf("gate evidence %+v (%v)", ev, err)
	}

	// Operators see an active account with an opus gate.
	got := e.getAccount(maxAcct.Id)
	if got.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE || got.Cooldown != nil || len(got.FamilyGates) != 1 {
		t.Fatalf("account view: state %v cooldown %v gates %v", got.State, got.Cooldown, got.FamilyGates)
	}
	if g := got.FamilyGates[0]; g.Family != "opus" || !g.Until.AsTime().Equal(until) || !strings.Contains(g.Evidence, "7d_oi rejected") {
		t.Errorf("gate view %v", g)
	}
	list, err := e.admin.accounts.ListAccounts(t.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range list.Msg.Accounts {
		if want := map[string]int{"max": 1, "other": 0}[a.Label]; len(a.FamilyGates) != want {
			t.Errorf("ListAccounts: %s has %d gates, want %d", a.Label, len(a.FamilyGates), want)
		}
	}

	// Opus goes to the other account; sonnet still to max, its favourite.
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: opusModel}); l.AccountId != other.Id {
		t.Errorf("opus leased %s, want other", l.AccountLabel)
	}
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel}); l.AccountId != maxAcct.Id {
		t.Errorf("sonnet leased %s, want max", l.AccountLabel)
	}
	// A model-less call has no family: the gate does not apply.
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}); l.AccountId != maxAcct.Id {
		t.Errorf("model-less call leased %s, want max", l.AccountLabel)
	}

	// With the other account paused, opus has nothing to lease: cooling,
	// back when the gate ends, and waiting is not hopeless.
	e.pause(other.Id)
	none := e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: opusModel}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
	if none.Permanent || none.RetryAt == nil || !none.RetryAt.AsTime().Equal(until) || !strings.Contains(none.Message, "gated for opus") {
		t.Errorf("no account %v, want retry_at the gate's end, not permanent", none)
	}

	// The gate's expiry restores the account for opus.
	e.clock.Advance(until.Sub(e.clock.Now()) - time.Millisecond)
	e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: opusModel}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
	e.clock.Advance(time.Millisecond)
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: opusModel}); l.AccountId != maxAcct.Id {
		t.Errorf("after the gate: opus leased %s, want max", l.AccountLabel)
	}
	if got := e.getAccount(maxAcct.Id); len(got.FamilyGates) != 0 {
		t.Errorf("expired gate still shown: %v", got.FamilyGates)
	}
}

// TestWriteFamilyGateMerge: a gate's deadline is never shortened by a
// later write; an expired gate is replaced; families are independent.
func TestWriteFamilyGateMerge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, _ := e.createAccount(acct{})
	id := uuid.MustParse(a.Id)
	write := func(family string, until, at time.Duration, ev string) db.FamilyGate {
		t.Helper()
		g, err := e.q.WriteFamilyGate(t.Context(), db.WriteFamilyGateParams{AccountID: id, Family: family,
			Until: epoch.Add(until), Now: epoch.Add(at), Evidence: []byte(`{"class":"` + ev + `"}`)})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	check := func(g db.FamilyGate, until time.Duration, ev string) {
		t.Helper()
		if !g.Until.Equal(epoch.Add(until)) || policy.EvidenceSummary(g.Evidence) != ev {
			t.Errorf("gate until t0+%v evidence %s, want t0+%v %s", g.Until.Sub(epoch), policy.EvidenceSummary(g.Evidence), until, ev)
		}
	}
	check(write("opus", time.Hour, 0, "1"), time.Hour, "1")
	check(write("opus", 30*time.Minute, time.Second, "2"), time.Hour, "1")
	check(write("opus", 2*time.Hour, 2*time.Second, "3"), 2*time.Hour, "3")
	check(write("sonnet", time.Minute, 3*time.Second, "4"), time.Minute, "4")
	check(write("opus", 3*time.Hour, 3*time.Hour, "5"), 3*time.Hour, "5") // the deadline passed: replaced
	check(write("opus", 3*time.Hour+time.Minute, 3*time.Hour, "6"), 3*time.Hour+time.Minute, "6")
	if n := e.count(`SELECT count(*) FROM family_gates WHERE account_id = $1`, id); n != 2 {
		t.Errorf("%d gate rows, want one per family", n)
	}
}

// TestQuotaCooldownUntilLatestReset: rejected 5h and 7d claims cool the
// whole account until the later of their resets, never the scoped claim's
// reset nor retry-after; routing waits for it without calling it
// permanent.
func TestQuotaCooldownUntilLatestReset(t *testing.T) {
	t.Parallel()
	e, a, keyHash := subscription(t)
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: opusModel})
	now := e.clock.Advance(time.Second)
	until := now.Add(72 * time.Hour)
	d := e.release(l.Id, rateLimited(hdr("status", "rejected", "retry-after", "30", "x-should-retry", "true",
		"5h-status", "rejected", "5h-utilization", "1.0", "5h-reset", epochAfter(now, 2*time.Hour),
		"7d-status", "rejected", "7d-utilization", "1.0", "7d-reset", epochAfter(now, 72*time.Hour),
		"7d_oi-status", "rejected", "7d_oi-reset", epochAfter(now, 120*time.Hour))))
	if d.Action != weirv1.Action_ACTION_FAILOVER || d.Cooldown == nil || d.Cooldown.Reason != weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED ||
		!d.Cooldown.Transient || !d.Cooldown.Until.AsTime().Equal(until) {
		t.Fatalf("decision %v, want quota_exhausted until now+72h", d)
	}
	cd := e.cooldownRow(a.Id)
	if cd == nil || cd.Reason != "quota_exhausted" || !cd.Transient || !cd.Until.Equal(until) {
		t.Fatalf("stored cooldown %+v", cd)
	}
	var ev policy.Evidence
	if err := json.Unmarshal(cd.Evidence, &ev); err != nil || len(ev.Claims) != 2 || ev.Claims[0].Minutes != 300 || ev.Claims[1].Minutes != 10080 {
		t.Errorf("evidence %+v (%v), want the 5h and 7d windows", ev, err)
	}
	if g := e.gateRows(a.Id); len(g) != 0 {
		t.Errorf("gates %+v: an account-wide limit needs no family gate", g)
	}
	if got := e.getAccount(a.Id); got.State != weirv1.AccountState_ACCOUNT_STATE_COOLING ||
		got.Cooldown.Evidence != "rate_limited, status 429, rate_limit_error, retry-after 30, unified rejected, 5h+7d rejected" {
		t.Errorf("account view: %v %q", got.State, got.Cooldown.GetEvidence())
	}
	for _, model := range []string{opusModel, sonnetModel} {
		none := e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: model}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
		if none.Permanent || !none.RetryAt.AsTime().Equal(until) {
			t.Errorf("%s: no account %v, want retry_at the weekly reset, not permanent", model, none)
		}
	}
	e.clock.Advance(until.Sub(e.clock.Now()))
	e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
}

// TestQuotaBackoffThroughRelease: account-wide rejections without a valid
// reset back off 30 s, 1 min, 2 min; a success starts over.
func TestQuotaBackoffThroughRelease(t *testing.T) {
	t.Parallel()
	e, a, keyHash := subscription(t)
	noReset := hdr("status", "rejected", "5h-status", "rejected", "5h-reset", "0", "retry-after", "5")
	reject := func(want time.Duration, step int32) {
		t.Helper()
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
		now := e.clock.Now()
		d := e.release(l.Id, rateLimited(noReset))
		if d.Cooldown.GetReason() != weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED || !d.Cooldown.Until.AsTime().Equal(now.Add(want)) {
			t.Fatalf("step %d: decision %v, want quota_exhausted for %v", step, d, want)
		}
		if got := e.accountRow(a.Id).QuotaBackoffs; got != step {
			t.Errorf("quota_backoffs %d, want %d", got, step)
		}
		if !strings.Contains(d.Cooldown.Evidence, "backoff step") {
			t.Errorf("evidence %q", d.Cooldown.Evidence)
		}
		e.clock.Advance(want)
	}
	reject(30*time.Second, 1)
	reject(time.Minute, 2)
	reject(2*time.Minute, 3)
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
	e.release(l.Id, succeeded())
	if got := e.accountRow(a.Id).QuotaBackoffs; got != 0 {
		t.Fatalf("after a success quota_backoffs %d", got)
	}
	reject(30*time.Second, 1)
}

// TestOutOfCreditsClearedOnlyByLaterSuccess: out of credits cools for the
// 6 h floor. A success clears it only when its request was admitted after
// the cooldown was written (a recovery probe; nothing else routes to a
// cooling account); one already in flight proves nothing. A success never
// clears another reason.
func TestOutOfCreditsClearedOnlyByLaterSuccess(t *testing.T) {
	t.Parallel()
	e, a, keyHash := subscription(t)
	straggler := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
	e.clock.Advance(time.Second)
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
	now := e.clock.Advance(time.Second)
	d := e.release(l.Id, rateLimited(hdr("status", "rejected", "overage-status", "rejected", "overage-disabled-reason", "out_of_credits",
		"representative-claim", "five_hour", "reset", epochAfter(now, time.Hour), "retry-after", "2", "x-should-retry", "true")))
	if d.Action != weirv1.Action_ACTION_FAILOVER || d.Cooldown.GetReason() != weirv1.CooldownReason_COOLDOWN_REASON_OUT_OF_CREDITS ||
		!d.Cooldown.Transient || !d.Cooldown.Until.AsTime().Equal(now.Add(policy.OutOfCreditsFloor)) {
		t.Fatalf("decision %v, want out_of_credits for 6h, no burst retry", d)
	}
	none := e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
	if none.Permanent {
		t.Error("out of credits called permanent: it ends by time")
	}

	e.clock.Advance(time.Second)
	e.release(straggler.Id, succeeded())
	if cd := e.cooldownRow(a.Id); cd == nil || cd.Reason != "out_of_credits" {
		t.Fatalf("a request admitted before the cooldown cleared it: %+v", cd)
	}

	e.clock.Advance(time.Second)
	e.release(e.probeLease(a.Id, sonnetModel), succeeded())
	if cd := e.cooldownRow(a.Id); cd != nil {
		t.Fatalf("a later success left %+v", cd)
	}
	if got := e.getAccount(a.Id); got.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE {
		t.Errorf("state %v after the success", got.State)
	}

	// Quota and burst cooldowns are not the success's to lift.
	for _, h := range []map[string]string{
		hdr("status", "rejected", "7d-status", "rejected", "7d-reset", epochAfter(e.clock.Now(), time.Hour)),
		hdr("status", "rejected", "retry-after", "600"),
	} {
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
		e.release(l.Id, rateLimited(h))
		before := e.cooldownRow(a.Id)
		e.clock.Advance(time.Second)
		e.release(e.probeLease(a.Id, sonnetModel), succeeded())
		if after := e.cooldownRow(a.Id); after == nil || after.Reason != before.Reason {
			t.Errorf("a success cleared %s", before.Reason)
		}
		e.resume(a.Id)
	}
}

// TestResumeClearsLadderState: an operator's resume is how an account
// comes back early: cooldown, family gates and backoff step all go.
func TestResumeClearsLadderState(t *testing.T) {
	t.Parallel()
	e, a, keyHash := subscription(t)
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: opusModel})
	e.release(l.Id, rateLimited(weeklyOpusRejected(e.clock.Now())))
	l = e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
	e.release(l.Id, rateLimited(hdr("status", "rejected", "overage-disabled-reason", "out_of_credits")))
	if _, err := e.pool.Exec(t.Context(), `UPDATE accounts SET quota_backoffs = 3, overloaded_at = now() WHERE id = $1`, a.Id); err != nil {
		t.Fatal(err)
	}
	if got := e.getAccount(a.Id); got.State != weirv1.AccountState_ACCOUNT_STATE_COOLING || len(got.FamilyGates) != 1 {
		t.Fatalf("before resume: %v gates %v", got.State, got.FamilyGates)
	}
	got := e.resume(a.Id)
	if got.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE || got.Cooldown != nil || len(got.FamilyGates) != 0 || e.accountRow(a.Id).QuotaBackoffs != 0 ||
		got.OverloadedAt != nil {
		t.Fatalf("after resume: %v cooldown %v gates %v", got.State, got.Cooldown, got.FamilyGates)
	}
	e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: opusModel})
}

// TestBurstThroughRelease: a subscription account's burst is retried in
// place twice, with no cooldown; the third, or an API key's, cools it.
func TestBurstThroughRelease(t *testing.T) {
	t.Parallel()
	e, a, keyHash := subscription(t)
	burst := hdr("retry-after", "1", "x-should-retry", "true")
	for prior := range int32(policy.BurstRetries) {
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel, PreferAccountId: a.Id})
		o := rateLimited(burst)
		o.PriorBursts = prior
		d := e.release(l.Id, o)
		if d.Action != weirv1.Action_ACTION_RETRY_SAME || d.RetryAfter.AsDuration() != policy.BurstRetryMin || d.Cooldown != nil {
			t.Fatalf("burst %d: decision %v, want the same account after 2s", prior, d)
		}
		if cd := e.cooldownRow(a.Id); cd != nil {
			t.Fatalf("burst %d wrote %+v", prior, cd)
		}
	}
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
	o := rateLimited(burst)
	o.PriorBursts = policy.BurstRetries
	now := e.clock.Now()
	d := e.release(l.Id, o)
	if d.Action != weirv1.Action_ACTION_FAILOVER || d.Cooldown.GetReason() != weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED ||
		!d.Cooldown.Until.AsTime().Equal(now.Add(time.Second)) {
		t.Fatalf("after %d bursts: %v, want a rate_limited cooldown for retry-after", policy.BurstRetries, d)
	}

	k, _ := e.createAccount(acct{label: "key"})
	l = e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
	if l.AccountId != k.Id {
		t.Fatalf("leased %s", l.AccountLabel)
	}
	if d := e.release(l.Id, rateLimited(burst)); d.Action != weirv1.Action_ACTION_FAILOVER || d.Cooldown.GetReason() != weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED {
		t.Errorf("API key burst: %v, want the residual cooldown", d)
	}
	body := scrape(t, e)
	for _, want := range []string{`weir_controlplane_rate_limit_decisions_total{rung="burst"} 2`, `weir_controlplane_rate_limit_decisions_total{rung="residual"} 2`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
