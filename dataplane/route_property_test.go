package dataplane

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/sim"
)

// A trouble is one account's state when a request arrives, and when it
// can serve again.
type trouble int

const (
	healthy  trouble = iota
	cooling          // the control plane knows when it ends
	lifted           // it ends sooner than the control plane said, announced by WatchPool
	storming         // the upstream fails until it ends; the first failure tells the control plane when
	spent            // out of quota until its reset
	disabled         // never, until an operator acts
	troubles
)

var troubleNames = [...]string{"healthy", "cooling", "lifted", "storming", "spent", "disabled"}

type troubledAccount struct {
	kind trouble
	// back is when it can serve again, from the request's arrival.
	back time.Duration
	// said is when the control plane says a lifted cooldown ends.
	said time.Duration
}

func (a troubledAccount) String() string {
	if a.kind == lifted {
		return fmt.Sprintf("%s@%v(said %v)", troubleNames[a.kind], a.back, a.said)
	}
	return fmt.Sprintf("%s@%v", troubleNames[a.kind], a.back)
}

// TestPartsRouteProperty: for random pools of troubled accounts, a request
// is served within wakeBound of the earliest time any account can serve it
// when that comes within the hold budget, else answered at once with the
// error its pool calls for.
func TestPartsRouteProperty(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(26, 0))
	for i := range 60 {
		hold := []time.Duration{2 * time.Minute, 5 * time.Minute}[rng.IntN(2)]
		var accts []troubledAccount
		for range 1 + rng.IntN(3) {
			a := troubledAccount{kind: trouble(rng.IntN(int(troubles)))}
			// Recovery times on a millisecond grid, some past the budget.
			a.back = time.Duration(1+rng.IntN(8*60*1000)) * time.Millisecond
			switch a.kind {
			case healthy, disabled:
				a.back = 0
			case lifted:
				// The control plane's own deadline lies within the budget:
				// past it the worker gives up at once, announcement or not.
				a.back = min(a.back, hold-2*time.Second)
				a.said = a.back + time.Duration(1+rng.IntN(int((hold-a.back)/time.Millisecond)-1))*time.Millisecond
			}
			accts = append(accts, a)
		}
		usageLimit := rng.IntN(2) == 0
		t.Run(fmt.Sprintf("%d:%v:hold=%v", i, accts, hold), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) { checkProperty(t, accts, hold, usageLimit) })
		})
	}
}

func checkProperty(t *testing.T, accts []troubledAccount, hold time.Duration, usageLimit bool) {
	t0 := time.Now()
	var fas []*fakeAccount
	faults := map[string][]sim.Fault{}
	for i, a := range accts {
		fa := &fakeAccount{id: fmt.Sprintf("acct%d", i)}
		switch a.kind {
		case cooling:
			fa.coolUntil, fa.coolReason = t0.Add(a.back), weirv1.CooldownReason_COOLDOWN_REASON_OVERLOADED
		case lifted:
			fa.coolUntil, fa.coolReason = t0.Add(a.said), weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED
		case storming:
			fa.recoverAt = t0.Add(a.back)
			faults[fa.id] = []sim.Fault{{Kind: sim.FaultOverloaded, Until: t0.Add(a.back - time.Millisecond)}}
		case spent:
			fa.spent, fa.spentReset = true, t0.Add(a.back)
		case disabled:
			fa.disabled = true
		}
		fas = append(fas, fa)
	}
	cp := newFakeCP(fas...)
	cp.settings.CapacityHold = durationpb.New(hold)
	if usageLimit {
		cp.settings.QuotaResponseMode = weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT
	}
	r := newRig(t, cp, func(c *Config) { c.CapacityHold = hold })
	for id, fs := range faults {
		if err := r.sim.AddFaults(id, fs...); err != nil {
			t.Fatal(err)
		}
	}
	for i, a := range accts {
		if a.kind == lifted {
			id := fas[i].id
			r.at(a.back, func() {
				r.cp.set(func(f *fakeCP) { f.account(id).coolUntil = time.Time{} })
				r.cp.announce(&weirv1.WatchPoolResponse{AccountIds: []string{id}})
			})
		}
	}
	synctest.Wait()
	got := r.send(t.Context(), false)

	// The oracle.
	earliest, anyServes, allQuota := time.Duration(-1), false, true
	for _, a := range accts {
		if a.kind == disabled {
			continue
		}
		anyServes = true
		allQuota = allQuota && a.kind == spent
		if earliest < 0 || a.back < earliest {
			earliest = a.back
		}
	}
	switch {
	case !anyServes:
		if got.status != 503 || got.at != 0 {
			t.Errorf("every account disabled: got %d at %v, want 503 at once: %s", got.status, got.at, got.body)
		}
	case earliest < hold:
		if got.status != 200 || got.at < earliest || got.at > earliest+wakeBound {
			t.Errorf("the first account back at %v: got %d at %v, want 200 in [%v, %v]: %s",
				earliest, got.status, got.at, earliest, earliest+wakeBound, got.body)
		}
	default:
		want := 529
		if allQuota {
			want = 429
		}
		if got.status != want || got.at > wakeBound {
			t.Errorf("no account back within the %v budget (the first at %v): got %d at %v, want %d at once: %s",
				hold, earliest, got.status, got.at, want, got.body)
		}
		if allQuota && usageLimit && !strings.Contains(got.body, "usage") {
			t.Errorf("a final usage limit without its words: %s", got.body)
		}
	}
}
