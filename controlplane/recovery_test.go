package controlplane

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Rung 1 and 4 of the ladder, usage-view routing, and recovery probes, on
// a real Postgres with the injected clock.

// setWindow stores a usage reading for an account as a poll would.
func (e *env) setWindow(id, window string, utilization float64, resetsAt time.Time) {
	e.t.Helper()
	if _, err := e.pool.Exec(e.t.Context(), `INSERT INTO usage_windows
		(account_id, window_name, utilization, resets_at, source, observed_at, credential_revision, poll_epoch)
		VALUES ($1, $2, $3, $4, 'poll', $5, 1, 1)
		ON CONFLICT (account_id, window_name) DO UPDATE SET utilization = EXCLUDED.utilization, resets_at = EXCLUDED.resets_at`,
		uuid.MustParse(id), window, utilization, resetsAt, e.clock.Now()); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) setRecoveryProbe(id string) {
	e.t.Helper()
	if _, err := e.pool.Exec(e.t.Context(), `UPDATE accounts SET recovery_probe = true WHERE id = $1`, uuid.MustParse(id)); err != nil {
		e.t.Fatal(err)
	}
}

func TestLadderRungsOneAndFour(t *testing.T) {
	t.Parallel()
	week := epoch.Add(30 * time.Hour)
	spent := []claimEvidence{{Claim: "7d", Minutes: 10080, Reset: week.Unix()}}
	for _, tc := range []struct {
		name   string
		in     ladderInput
		rung   rung
		reason weirv1.CooldownReason
		until  time.Time
	}{
		{"cached exhaustion outranks a burst", ladderInput{headers: hdr("retry-after", "3"), oauth: true, spent: spent},
			rungCachedQuota, weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, week},
		{"cached exhaustion outranks a scoped claim", ladderInput{headers: hdr("7d_oi-status", "rejected", "7d_oi-reset", at(90*time.Hour)), oauth: true, family: "opus", spent: spent},
			rungCachedQuota, weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, week},
		{"a live claim outranks the cache", ladderInput{headers: hdr("5h-status", "rejected", "5h-reset", at(2*time.Hour)), oauth: true, spent: spent},
			rungAccountQuota, weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, epoch.Add(2 * time.Hour)},
		{"the latest spent reset", ladderInput{headers: nil, spent: append([]claimEvidence{{Claim: "5h", Minutes: 300, Reset: epoch.Add(time.Hour).Unix()}}, spent...)},
			rungCachedQuota, weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, week},
		{"a probe's transient failure re-cools briefly", ladderInput{headers: hdr("retry-after", "600", "status", "allowed", "5h-status", "allowed", "5h-utilization", "0.2"), oauth: true, recoveryProbe: true},
			rungRecovery, weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, epoch.Add(recoveryReprobe)},
		{"a probe that meets a rejection is no re-probe", ladderInput{headers: hdr("status", "rejected", "7d-status", "rejected", "7d-reset", at(50*time.Hour)), oauth: true, recoveryProbe: true},
			rungAccountQuota, weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, epoch.Add(50 * time.Hour)},
		{"out of credits outranks the cache", ladderInput{headers: hdr("status", "rejected", "overage-disabled-reason", "out_of_credits"), spent: spent},
			rungOutOfCredits, weirv1.CooldownReason_COOLDOWN_REASON_OUT_OF_CREDITS, epoch.Add(outOfCreditsFloor)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.now = epoch
			d := ladder(tc.in)
			if d.rung != tc.rung || d.reason != tc.reason || !d.until.Equal(tc.until) || d.action != weirv1.Action_ACTION_FAILOVER {
				t.Errorf("rung %s %v until %v action %v, want %s %v until %v", d.rung, d.reason, d.until, d.action, tc.rung, tc.reason, tc.until)
			}
		})
	}
}

// TestCachedExhaustionThroughRelease: a 429 without a live rejection on an
// account whose view shows the week spent cools it until the weekly reset
// and re-arms the poller for right after it; a rejected answer's own
// headers never feed the view.
func TestCachedExhaustionThroughRelease(t *testing.T) {
	t.Parallel()
	e, a, keyHash := subscription(t)
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
	week := epoch.Add(30 * time.Hour)
	e.setWindow(a.Id, windowSevenDay, 0.99, week)
	epochBefore := e.count(`SELECT epoch FROM usage_polls WHERE account_id = $1`, a.Id)
	e.clock.Advance(time.Second)
	d := e.release(l.Id, rateLimited(hdr("retry-after", "5", "x-should-retry", "true")))
	if d.Action != weirv1.Action_ACTION_FAILOVER || d.Cooldown.GetReason() != weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED ||
		!d.Cooldown.Until.AsTime().Equal(week) {
		t.Fatalf("decision %v, want quota_exhausted until the weekly reset", d)
	}
	var ev storedEvidence
	if err := json.Unmarshal(e.cooldownRow(a.Id).Evidence, &ev); err != nil || ev.Rung != rungCachedQuota || len(ev.Claims) != 1 || ev.Claims[0].Claim != "7d" {
		t.Errorf("evidence %+v (%v)", ev, err)
	}
	p, err := e.q.GetUsagePoll(t.Context(), uuid.MustParse(a.Id))
	if err != nil {
		t.Fatal(err)
	}
	if int(p.Epoch) != epochBefore+1 || p.NextReadAt == nil || !p.NextReadAt.Equal(week) {
		t.Errorf("poll epoch %d next %v, want re-armed to read at %v", p.Epoch, p.NextReadAt, week)
	}

	// A live rejection's headers (the window at 1.0) do not land in the view.
	e2, b, key2 := subscription(t)
	l = e2.mustLease(&weirv1.AcquireRequest{KeyHash: key2, Model: sonnetModel})
	d = e2.release(l.Id, rateLimited(hdr("status", "rejected", "5h-status", "rejected", "5h-utilization", "1.0", "5h-reset", at(2*time.Hour),
		"7d-status", "rejected", "7d-utilization", "1.0", "7d-reset", at(40*time.Hour))))
	if d.Cooldown.GetReason() != weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED {
		t.Fatalf("decision %v", d)
	}
	if n := e2.count(`SELECT count(*) FROM usage_windows WHERE account_id = $1`, b.Id); n != 0 {
		t.Errorf("%d usage rows from a rejected answer", n)
	}
	p, _ = e2.q.GetUsagePoll(t.Context(), uuid.MustParse(b.Id))
	if p.NextReadAt == nil || !p.NextReadAt.Equal(epoch.Add(40*time.Hour)) {
		t.Errorf("next read %v, want the cooldown's end", p.NextReadAt)
	}
}

// TestAcquireSkipsSpentAccounts: routing reads the view; a spent window is
// a cooldown until its reset, never permanent.
func TestAcquireSkipsSpentAccounts(t *testing.T) {
	t.Parallel()
	e, a, keyHash := subscription(t)
	b, _ := e.createAccount(acct{label: "other", kind: weirv1.AuthKind_AUTH_KIND_OAUTH, credential: oauthToken()})
	e.setWindow(a.Id, windowSevenDay, 1, epoch.Add(5*time.Hour))
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel}); l.AccountId != b.Id {
		t.Fatalf("lease on %s, want the account with room (despite priority)", l.AccountLabel)
	}
	e.setWindow(b.Id, windowFiveHour, 0.995, epoch.Add(2*time.Hour))
	none := e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
	if none.Permanent || !none.RetryAt.AsTime().Equal(epoch.Add(2*time.Hour)) {
		t.Fatalf("no account %v, want retry_at the 5h reset", none)
	}
	e.clock.Advance(2 * time.Hour)
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel}); l.AccountId != b.Id {
		t.Fatalf("lease on %s after the 5h reset", l.AccountLabel)
	}
	e.clock.Advance(3 * time.Hour)
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel}); l.AccountId != a.Id {
		t.Fatalf("lease on %s after the weekly reset, want the priority account back", l.AccountLabel)
	}
}

// TestRecoveryClearsByCompareAndSet: a reading that shows the rejected
// window rolled over lifts a quota cooldown, but only one written before
// the reading, never another reason; it admits one probe, which a success
// ends.
func TestRecoveryClearsByCompareAndSet(t *testing.T) {
	t.Parallel()
	script := maxAccount("max") // 7d at 10%, resetting in 100h
	u, accts := setupUsage(t, script)
	a := accts["max"]
	_, keyHash := u.createKey("")

	// A rate_limited cooldown is never lifted by a reading.
	l := u.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
	u.release(l.Id, rateLimited(hdr("status", "rejected", "retry-after", "60")))
	if cd := u.cooldownRow(a.Id); cd == nil || cd.Reason != "rate_limited" {
		t.Fatalf("cooldown %+v", cd)
	}
	u.refresh(a.Id)
	if cd := u.cooldownRow(a.Id); cd == nil || cd.Reason != "rate_limited" {
		t.Fatalf("a reading lifted a burst cooldown: %+v", cd)
	}
	if !strings.Contains(u.logs.String(), "recovery refused: the cooldown is not quota-derived") {
		t.Error("no refusal logged")
	}

	// A quota cooldown written at the reading's instant is not older than it.
	u.clock.Advance(151 * time.Second)
	l = u.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
	u.release(l.Id, rateLimited(hdr("status", "rejected", "7d-status", "rejected", "7d-reset", epochAfter(u.clock.Now(), 3*time.Hour))))
	if cd := u.cooldownRow(a.Id); cd == nil || cd.Reason != "quota_exhausted" {
		t.Fatalf("cooldown %+v", cd)
	}
	if !u.refresh(a.Id).Read {
		t.Fatal("refresh not read")
	}
	if u.cooldownRow(a.Id) == nil || !strings.Contains(u.logs.String(), "recovery refused: the cooldown is newer than the reading") {
		t.Fatal("a cooldown as new as the reading was lifted")
	}

	// A later reading whose weekly window resets after the rejected one
	// lifts it and admits exactly one probe.
	u.clock.Advance(151 * time.Second)
	if !u.refresh(a.Id).Read {
		t.Fatal("refresh not read")
	}
	if cd := u.cooldownRow(a.Id); cd != nil {
		t.Fatalf("cooldown %+v survived a reading that shows recovery", cd)
	}
	if !u.accountRow(a.Id).RecoveryProbe {
		t.Fatal("no recovery probe admitted")
	}
	probe := u.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
	u.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
	u.release(probe.Id, succeeded())
	if u.accountRow(a.Id).RecoveryProbe {
		t.Fatal("a successful probe left the account probing")
	}
	u.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
	u.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
}

// TestRecoveryProbeReprobe: rung 1 through Release. A probe that meets a
// transient 429 re-cools the account for a minute under the quota reason
// and stays a probe; then one more probe.
func TestRecoveryProbeReprobe(t *testing.T) {
	t.Parallel()
	e, a, keyHash := subscription(t)
	e.setRecoveryProbe(a.Id)
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
	now := e.clock.Now()
	d := e.release(l.Id, rateLimited(hdr("retry-after", "900", "x-should-retry", "true")))
	if d.Action != weirv1.Action_ACTION_FAILOVER || d.Cooldown.GetReason() != weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED ||
		!d.Cooldown.Until.AsTime().Equal(now.Add(recoveryReprobe)) {
		t.Fatalf("decision %v, want quota_exhausted for %v", d, recoveryReprobe)
	}
	if !e.accountRow(a.Id).RecoveryProbe {
		t.Fatal("the failed probe ended the probe")
	}
	e.clock.Advance(recoveryReprobe)
	e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
	e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
}

// TestExactlyOneRecoveryProbe: concurrent Acquires on two replicas grant
// one lease on a recovering account, whatever its cap.
func TestExactlyOneRecoveryProbe(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.replica()
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{label: "max", kind: weirv1.AuthKind_AUTH_KIND_OAUTH, credential: oauthToken(), maxConc: 8})
	e.setRecoveryProbe(a.Id)
	const n = 16
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		mu     sync.Mutex
		leases []*weirv1.Lease
		errs   []error
	)
	for i := range n {
		c := e.dp.leases
		if i%2 == 1 {
			c = r.dp.leases
		}
		wg.Go(func() {
			<-start
			resp, err := c.Acquire(t.Context(), connect.NewRequest(&weirv1.AcquireRequest{KeyHash: keyHash, RequestId: "burst", Model: sonnetModel}))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, err)
			case resp.Msg.GetLease() != nil:
				leases = append(leases, resp.Msg.GetLease())
			}
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d Acquires failed, first: %v", len(errs), errs[0])
	}
	if len(leases) != 1 {
		t.Fatalf("%d leases on a recovering account, want exactly one probe", len(leases))
	}
	r.release(leases[0].Id, succeeded())
	for range 8 {
		e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetModel})
	}
}

func TestRecoveredReading(t *testing.T) {
	t.Parallel()
	f := func(v float64) *float64 { return &v }
	ts := func(d time.Duration) *time.Time { x := epoch.Add(d); return &x }
	ev := func(claims ...claimEvidence) []byte {
		b, _ := json.Marshal(storedEvidence{Class: "OUTCOME_CLASS_RATE_LIMITED", Claims: claims})
		return b
	}
	weekClaim := claimEvidence{Claim: "7d", Minutes: 10080, Reset: epoch.Add(2 * time.Hour).Unix()}
	fiveClaim := claimEvidence{Claim: "5h", Minutes: 300, Reset: epoch.Add(time.Hour).Unix()}
	newWeek := usageReading{window: windowSevenDay, utilization: f(0.1), resetsAt: ts(170 * time.Hour)}
	for _, tc := range []struct {
		name     string
		evidence []byte
		readings []usageReading
		want     bool
	}{
		{"the rejected week rolled over", ev(weekClaim), []usageReading{newWeek}, true},
		{"the same week, whatever it reads", ev(weekClaim), []usageReading{{window: windowSevenDay, utilization: f(0.1), resetsAt: ts(2 * time.Hour)}}, false},
		{"a new week, still spent", ev(weekClaim), []usageReading{{window: windowSevenDay, utilization: f(0.99), resetsAt: ts(170 * time.Hour)}}, false},
		{"no utilization is no evidence", ev(weekClaim), []usageReading{{window: windowSevenDay, resetsAt: ts(170 * time.Hour)}}, false},
		{"both claims must recover", ev(fiveClaim, weekClaim), []usageReading{newWeek}, false},
		{"both recovered", ev(fiveClaim, weekClaim), []usageReading{{window: windowFiveHour, utilization: f(0), resetsAt: ts(6 * time.Hour)}, newWeek}, true},
		{"a scoped claim is not the account's", ev(claimEvidence{Claim: "7d_oi", Reset: epoch.Add(time.Hour).Unix()}), []usageReading{newWeek}, true},
		{"no claims: every window read must have room", ev(), []usageReading{newWeek, {window: windowFiveHour, utilization: f(0.995), resetsAt: ts(time.Hour)}}, false},
		{"no claims, nothing read", ev(), nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cd := db.Cooldown{Reason: "quota_exhausted", Evidence: tc.evidence}
			if got := recovered(cd, tc.readings, epoch, false); got != tc.want {
				t.Errorf("recovered = %v, want %v", got, tc.want)
			}
		})
	}
}
