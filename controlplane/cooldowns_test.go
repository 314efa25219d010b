package controlplane

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestWriteCooldownMerge drives the merge upsert directly: one existing
// row, one write, the row in force afterwards.
func TestWriteCooldownMerge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	t0 := epoch
	type cd struct {
		reason    string
		transient bool
		until     time.Duration // after t0
		at        time.Duration // written at t0+at
		evidence  string
	}
	rl := func(until, at time.Duration, ev string) cd { return cd{"rate_limited", true, until, at, ev} }
	tr := func(until, at time.Duration, ev string) cd { return cd{"transport", true, until, at, ev} }
	ic := func(until, at time.Duration, ev string) cd { return cd{"invalid_credential", false, until, at, ev} }
	for _, tc := range []struct {
		name        string
		first, next cd
		want        cd // evidence names which write it came from
	}{
		{"later deadline wins", rl(30*time.Second, 0, "1"), rl(60*time.Second, time.Second, "2"),
			rl(60*time.Second, time.Second, "2")},
		{"earlier deadline never shortens", rl(60*time.Second, 0, "1"), tr(30*time.Second, time.Second, "2"),
			cd{"rate_limited", true, 60 * time.Second, time.Second, "1"}},
		{"equal deadline takes the newer evidence", rl(60*time.Second, 0, "1"), tr(60*time.Second, time.Second, "2"),
			tr(60*time.Second, time.Second, "2")},
		{"transient never overwrites non-transient", ic(60*time.Second, 0, "1"), rl(time.Hour, time.Second, "2"),
			ic(60*time.Second, 0, "1")},
		{"transient shorter than non-transient", ic(time.Hour, 0, "1"), rl(time.Minute, time.Second, "2"),
			ic(time.Hour, 0, "1")},
		{"non-transient takes over a transient, keeping the later deadline", rl(time.Hour, 0, "1"), ic(time.Minute, time.Second, "2"),
			cd{"invalid_credential", false, time.Hour, time.Second, "2"}},
		{"non-transient escalates", ic(time.Minute, 0, "1"), ic(2*time.Minute, time.Second, "2"),
			ic(2*time.Minute, time.Second, "2")},
		{"non-transient never shortens", ic(4*time.Minute, 0, "1"), ic(time.Minute, time.Second, "2"),
			cd{"invalid_credential", false, 4 * time.Minute, time.Second, "1"}},
		{"expired transient is replaced", rl(30*time.Second, 0, "1"), tr(50*time.Second, 40*time.Second, "2"),
			tr(50*time.Second, 40*time.Second, "2")},
		{"expired non-transient is replaced by a transient", ic(time.Minute, 0, "1"), rl(2*time.Minute, 90*time.Second, "2"),
			rl(2*time.Minute, 90*time.Second, "2")},
		{"deadline reached counts as expired", ic(time.Minute, 0, "1"), rl(70*time.Second, time.Minute, "2"),
			rl(70*time.Second, time.Minute, "2")},
		{"long-expired row is replaced", rl(time.Hour, 0, "1"), tr(2*time.Hour+10*time.Second, 2*time.Hour, "2"),
			tr(2*time.Hour+10*time.Second, 2*time.Hour, "2")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := e.createAccount(acct{})
			id := uuid.MustParse(a.Id)
			write := func(c cd) db.Cooldown {
				t.Helper()
				got, err := e.q.WriteCooldown(t.Context(), db.WriteCooldownParams{
					AccountID: id, Reason: c.reason, Transient: c.transient,
					Until: t0.Add(c.until), Now: t0.Add(c.at), Evidence: []byte(`{"class":"` + c.evidence + `"}`),
				})
				if err != nil {
					t.Fatalf("WriteCooldown: %v", err)
				}
				return got
			}
			write(tc.first)
			got := write(tc.next)
			w := tc.want
			if got.Reason != w.reason || got.Transient != w.transient || !got.Until.Equal(t0.Add(w.until)) ||
				!got.WrittenAt.Equal(t0.Add(w.at)) || policy.EvidenceSummary(got.Evidence) != w.evidence {
				t.Errorf("in force: %s transient=%v until t0+%v written t0+%v evidence %s\nwant:      %s transient=%v until t0+%v written t0+%v evidence %s",
					got.Reason, got.Transient, got.Until.Sub(t0), got.WrittenAt.Sub(t0), policy.EvidenceSummary(got.Evidence),
					w.reason, w.transient, w.until, w.at, w.evidence)
			}
			// The returned row is the stored row.
			if stored := e.cooldownRow(a.Id); stored == nil || stored.Reason != got.Reason || !stored.Until.Equal(got.Until) {
				t.Errorf("stored %+v, returned %+v", stored, got)
			}
		})
	}
}

// TestCooldownMergeThroughRelease: the same rules hold end to end.
func TestCooldownMergeThroughRelease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{})
	ls := make([]*weirv1.Lease, 3)
	for i := range ls {
		ls[i] = e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	}
	now := e.clock.Now()
	e.release(ls[0].Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429,
		Headers: map[string]string{"retry-after": "600"}})
	// A transport blip (10 s) does not shorten the 10-minute rate limit.
	e.release(ls[1].Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR})
	got := e.getAccount(a.Id).Cooldown
	if got.Reason != weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED || !got.Until.AsTime().Equal(now.Add(10*time.Minute)) {
		t.Fatalf("after the transport error: %v until %v", got.Reason, got.Until.AsTime())
	}
	// A rejected credential takes over (non-transient) and keeps the later deadline.
	e.release(ls[2].Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR, Status: 401})
	got = e.getAccount(a.Id).Cooldown
	if got.Reason != weirv1.CooldownReason_COOLDOWN_REASON_INVALID_CREDENTIAL || got.Transient ||
		!got.Until.AsTime().Equal(now.Add(10*time.Minute)) {
		t.Fatalf("after the rejection: %v transient=%v until %v", got.Reason, got.Transient, got.Until.AsTime())
	}
	none := e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
	if none.RetryAt != nil {
		t.Errorf("retry_at %v for an invalid credential", none.RetryAt.AsTime())
	}
}
