package controlplane

import (
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// renewBatch renews ids through the data plane's RPC and returns the ids
// the control plane renewed.
func (e *env) renewBatch(ids ...string) []string {
	e.t.Helper()
	resp, err := e.dp.leases.RenewBatch(e.t.Context(), connect.NewRequest(&weirv1.RenewBatchRequest{LeaseIds: ids}))
	if err != nil {
		e.t.Fatalf("RenewBatch: %v", err)
	}
	got := resp.Msg.RenewedLeaseIds
	slices.Sort(got)
	return got
}

func sorted(ids ...string) []string {
	slices.Sort(ids)
	return ids
}

// TestCapAcrossOutage: an account capped at 2 with two long streams in
// flight keeps both places through an outage of every control plane (or
// of Postgres: to the database the two look the same, nobody touches the
// lease clock) shorter or longer than the lease TTL. The first Acquire
// after it is refused, whether it comes before or after the workers'
// renewals; a lease whose worker died in the outage lapses one TTL later.
func TestCapAcrossOutage(t *testing.T) {
	t.Parallel()
	for _, outage := range []time.Duration{20 * time.Second, 45 * time.Second, 15 * time.Minute} {
		t.Run(outage.String(), func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			_, keyHash := e.createKey("")
			e.createAccount(acct{maxConc: 2})
			req := &weirv1.AcquireRequest{KeyHash: keyHash}
			running, dead := e.mustLease(req), e.mustLease(req)
			e.advanceAlive(5 * time.Second)

			e.clock.Advance(outage) // nobody reaches Postgres
			e.mustNoAccount(req, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
			if got := e.renewBatch(running.Id); !slices.Equal(got, []string{running.Id}) {
				t.Fatalf("renewed %v after the outage, want the running lease", got)
			}
			e.mustNoAccount(req, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)

			// The running stream's worker renews every 10 s; the dead
			// one's lease lapses a TTL after the outage.
			for range 3 {
				e.advanceAlive(10 * time.Second)
				if got := e.renewBatch(running.Id); len(got) != 1 {
					t.Fatalf("running lease not renewed: %v", got)
				}
			}
			e.mustLease(req)
			e.mustNoAccount(req, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
			if got := e.renewBatch(running.Id, dead.Id); !slices.Equal(got, []string{running.Id}) {
				t.Errorf("renewed %v, want only the running lease (the dead one's place went to another)", got)
			}
		})
	}
}

// TestRenewLapsedLease: a lease that lapsed while the control planes were
// up (its worker alone was cut off from them) is renewed when its account
// still has room, and refused when its place was granted again: the
// worker then ends the request (dataplane/keeper.go).
func TestRenewLapsedLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	full, _ := e.createAccount(acct{label: "full", maxConc: 1, priority: 10})
	e.createAccount(acct{label: "roomy", maxConc: 2, priority: 1})
	onFull := &weirv1.AcquireRequest{KeyHash: keyHash}
	a := e.mustLease(onFull)
	if a.AccountId != full.Id {
		t.Fatalf("first lease on %s, want full", a.AccountLabel)
	}
	b := e.mustLease(onFull) // roomy
	e.advanceAlive(e.cfg.LeaseTTL + time.Second)

	c := e.mustLease(onFull) // a's place on full
	if c.AccountId != full.Id {
		t.Fatalf("lease after the lapse on %s, want full", c.AccountLabel)
	}
	if got, want := e.renewBatch(a.Id, b.Id, c.Id), sorted(b.Id, c.Id); !slices.Equal(got, want) {
		t.Errorf("renewed %v, want %v: a's place was taken, b's account has room", got, want)
	}
	// b counts again: roomy has one place left.
	e.mustLease(onFull)
	e.mustNoAccount(onFull, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
}

// TestLeaseClockHeartbeat: a started control plane touches the lease
// clock on every tick, so that a quiet stretch with no Acquire is not
// taken for an outage.
func TestLeaseClockHeartbeat(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tick := make(chan time.Time)
	e.srv.clock.tick = tick
	e.srv.startLeaseClock(t.Context())
	t.Cleanup(e.srv.clock.stop)
	_, keyHash := e.createKey("")
	e.createAccount(acct{maxConc: 1})
	req := &weirv1.AcquireRequest{KeyHash: keyHash}
	l := e.mustLease(req)
	for range e.cfg.LeaseTTL / time.Second {
		e.clock.Advance(time.Second)
		tick <- e.clock.Now()
	}
	tick <- e.clock.Now() // the previous tick is done once this one is taken
	e.clock.Advance(time.Second)
	// 31 s on, with the heartbeat going all along: the lease lapsed (were
	// the clock untouched, this Acquire would renew it and be refused).
	e.mustLease(req)
	if got := e.renewBatch(l.Id); len(got) != 0 {
		t.Errorf("the lapsed lease was renewed over a taken place: %v", got)
	}
}
