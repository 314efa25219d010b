package controlplane

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/pgtest"
)

// TestLeaseReuseUntil: a plain lease may be reused for LeaseReuse; a
// recovery probe, a breaker probe and a retry's lease may not.
func TestLeaseReuseUntil(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, key := e.createKey("")
	a, _ := e.createAccount(acct{maxConc: 8})
	now := e.clock.Now()
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: key, Model: "claude-sonnet-4-5"})
	if want := now.Add(reuseFor(15*time.Second, uuid.MustParse(l.Id))); l.ReuseUntil == nil || !l.ReuseUntil.AsTime().Equal(want) {
		t.Errorf("reuse_until %v, want %v (the default 15s, spread by the id)", l.ReuseUntil, want)
	}
	for name, req := range map[string]*weirv1.AcquireRequest{
		"exclude": {KeyHash: key, Model: "claude-sonnet-4-5", ExcludeAccountIds: []string{uuid.NewString()}},
		"prefer":  {KeyHash: key, Model: "claude-sonnet-4-5", PreferAccountId: a.Id},
	} {
		if l := e.mustLease(req); l.ReuseUntil != nil {
			t.Errorf("%s: a retry's lease has reuse_until %v", name, l.ReuseUntil)
		}
	}

	// A breaker whose open interval passed lets one probe through.
	family := policy.ModelFamily("claude-sonnet-4-5")
	if _, err := e.pool.Exec(t.Context(), `INSERT INTO overload_breakers (provider, family, overloads, window_start, open_until, open_count, updated_at)
		VALUES ('anthropic', $1, 0, $2, $3, 1, $2)`, family, now, now.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: key, Model: "claude-sonnet-4-5"}); l.ReuseUntil != nil {
		t.Errorf("a breaker probe's lease has reuse_until %v", l.ReuseUntil)
	}
	if _, err := e.pool.Exec(t.Context(), `DELETE FROM overload_breakers`); err != nil {
		t.Fatal(err)
	}

	if _, err := e.pool.Exec(t.Context(), `DELETE FROM leases`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(t.Context(), `UPDATE accounts SET recovery_probe = true WHERE id = $1`, uuid.MustParse(a.Id)); err != nil {
		t.Fatal(err)
	}
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: key, Model: "claude-sonnet-4-5"}); l.ReuseUntil != nil {
		t.Errorf("a recovery probe's lease has reuse_until %v", l.ReuseUntil)
	}
}

// TestLeaseReuseOff: a negative LeaseReuse turns reuse off.
func TestLeaseReuseOff(t *testing.T) {
	t.Parallel()
	clock := newClock()
	cfg := testConfig(clock)
	cfg.LeaseReuse = -1
	e := newEnv(t, pgtest.NewPool(t), cfg, clock)
	_, key := e.createKey("")
	e.createAccount(acct{})
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: key}); l.ReuseUntil != nil {
		t.Errorf("reuse off: reuse_until %v", l.ReuseUntil)
	}

	cfg = testConfig(clock)
	cfg.LeaseReuse = 500 * time.Millisecond
	e = newEnv(t, pgtest.NewPool(t), cfg, clock)
	_, key = e.createKey("")
	e.createAccount(acct{})
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: key}); l.ReuseUntil == nil ||
		!l.ReuseUntil.AsTime().Equal(clock.Now().Add(reuseFor(500*time.Millisecond, uuid.MustParse(l.Id)))) {
		t.Errorf("reuse 500ms: reuse_until %v", l.ReuseUntil)
	}
}

// TestReuseForSpreads: reuse windows fall between three quarters of
// LeaseReuse and all of it, and leases with different ids lapse apart.
func TestReuseForSpreads(t *testing.T) {
	t.Parallel()
	const reuse = 2 * time.Second
	seen := map[time.Duration]bool{}
	for b := range 256 {
		var id uuid.UUID
		id[15] = byte(b)
		d := reuseFor(reuse, id)
		if d < reuse*3/4 || d > reuse {
			t.Fatalf("id byte %d: %v, want within [%v, %v]", b, d, reuse*3/4, reuse)
		}
		seen[d] = true
	}
	if reuseFor(reuse, uuid.UUID{}) != reuse || reuseFor(reuse, uuid.UUID{15: 255}) != reuse*3/4 {
		t.Errorf("ends: %v and %v", reuseFor(reuse, uuid.UUID{}), reuseFor(reuse, uuid.UUID{15: 255}))
	}
	if len(seen) < 200 {
		t.Errorf("only %d distinct windows over 256 ids", len(seen))
	}
}
