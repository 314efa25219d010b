package controlplane

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/policy"
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
	var ev policy.Evidence
	if err := json.Unmarshal(e.cooldownRow(a.Id).Evidence, &ev); err != nil || ev.Rung != "cached_quota" || len(ev.Claims) != 1 || ev.Claims[0].Claim != "7d" {
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
		!d.Cooldown.Until.AsTime().Equal(now.Add(policy.RecoveryReprobe)) {
		t.Fatalf("decision %v, want quota_exhausted for %v", d, policy.RecoveryReprobe)
	}
	if !e.accountRow(a.Id).RecoveryProbe {
		t.Fatal("the failed probe ended the probe")
	}
	e.clock.Advance(policy.RecoveryReprobe)
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
