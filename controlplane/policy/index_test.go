package policy

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// slicePool is an IndexedPool over base candidates, by position.
type slicePool struct {
	base []*Candidate
	pos  map[uuid.UUID]int
}

func newSlicePool(base []*Candidate) *slicePool {
	p := &slicePool{base: base, pos: make(map[uuid.UUID]int, len(base))}
	for i, c := range base {
		p.pos[c.Account.ID] = i
	}
	return p
}

func (p *slicePool) Len() int                          { return len(p.base) }
func (p *slicePool) Base(i int) *Candidate             { return p.base[i] }
func (p *slicePool) Position(id uuid.UUID) (int, bool) { i, ok := p.pos[id]; return i, ok }

// basesOf is what an index reads of a pool of candidates as one request
// sees them: each without its live leases, waiters and gate, and now and
// then with an older last use (or none) than the request sees, as when
// this replica leased the account since the pool was read.
func basesOf(rng *rand.Rand, cands []Candidate) []*Candidate {
	out := make([]*Candidate, len(cands))
	for i, c := range cands {
		c.Live, c.WaitingAhead, c.Waiting, c.Gate = 0, 0, 0, nil
		if c.Account.LastUsedAt != nil && rng.IntN(3) == 0 {
			if rng.IntN(2) == 0 {
				c.Account.LastUsedAt = nil
			} else {
				t := c.Account.LastUsedAt.Add(-time.Duration(rng.IntN(3)) * time.Minute)
				c.Account.LastUsedAt = &t
			}
		}
		out[i] = &c
	}
	return out
}

// indexHolds checks what an index keeps of its pool: each account's
// member is its Base keyed at the index's instant, with its bounds; the
// index serves no instant at which some member's key does not hold; each
// part's order is its accounts that may serve, sorted; and the counts and
// owners are the pool's.
func indexHolds(ix *Index) error {
	want := NewIndex(ix.pool, ix.at)
	for i, m := range ix.members {
		w := want.members[i]
		if m.c != ix.pool.Base(i) || compareMembers(m, w) != 0 || m.in != w.in || !m.from.Equal(w.from) || !m.until.Equal(w.until) {
			return fmt.Errorf("account %d (%s) is not its pool's keyed at %v", i, m.c.Account.Label, ix.at)
		}
		if ix.from.Before(m.from) || (!m.until.IsZero() && (ix.until.IsZero() || m.until.Before(ix.until))) {
			return fmt.Errorf("the index serves [%v, %v), beyond account %d's key's [%v, %v)", ix.from, ix.until, i, m.from, m.until)
		}
	}
	parts := func(x *Index) map[[2]int]indexPart {
		out := map[[2]int]indexPart{}
		for _, p := range x.parts {
			metered := 0
			if p.metered {
				metered = 1
			}
			out[[2]int{int(p.provider), metered}] = p
		}
		return out
	}
	have, should := parts(ix), parts(want)
	for k, p := range should {
		h := have[k]
		if h.accounts != p.accounts || h.owned != p.owned || !slices.Equal(h.order, nil) && !slices.IsSortedFunc(h.order, compareMembers) {
			return fmt.Errorf("part %v: %d accounts, %d owned, want %d, %d", k, h.accounts, h.owned, p.accounts, p.owned)
		}
		if len(h.order) != len(p.order) {
			return fmt.Errorf("part %v: %d accounts in its order, want %d", k, len(h.order), len(p.order))
		}
		for j := range h.order {
			if h.order[j] != ix.members[h.order[j].key.idx] || h.order[j].key.idx != p.order[j].key.idx {
				return fmt.Errorf("part %v: its order differs at %d", k, j)
			}
		}
	}
	for k, h := range have {
		if _, ok := should[k]; !ok && (h.accounts != 0 || len(h.order) != 0) {
			return fmt.Errorf("part %v: %d accounts, none in the pool", k, h.accounts)
		}
	}
	if ix.odd != want.odd || !reflect.DeepEqual(ix.byKey, want.byKey) || !reflect.DeepEqual(ix.byTeam, want.byTeam) {
		return fmt.Errorf("caps or owners: %d odd caps, owners %v %v; want %d, %v %v", ix.odd, ix.byKey, ix.byTeam, want.odd, want.byKey, want.byTeam)
	}
	return nil
}

// indexShifts are how far from the instant of the route an index may be
// keyed: across the overload window, usage resets (the random pools'
// resets are whole hours from epoch) and reserve releases, and after it.
var indexShifts = []time.Duration{0, time.Nanosecond, time.Second, 5 * time.Second, AnsweringWindow, 11 * time.Second,
	time.Hour, time.Hour + time.Nanosecond, 2 * time.Hour, 5 * time.Hour, 13 * time.Hour, 30 * time.Hour, 170 * time.Hour,
	-time.Second, -AnsweringWindow, -time.Hour, -12 * time.Hour}

// TestRouteIndexedIsRouteGatedFirst: over random pools in every state and
// random requests, behind random breaker gates, for every k, and over
// indexes keyed at other instants (across overload expiries, usage
// resets and reserve releases) and from earlier states of the pool,
// RouteIndexed answers exactly what RouteGatedFirst does over the whole
// pool whenever some account is eligible (the same first accounts, whole,
// in the same order; the same SpillFrom; the same new round), and
// declines exactly when none is or when its index does not serve the
// instant (then the whole pool is routed, as before).
func TestRouteIndexedIsRouteGatedFirst(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(19, 23))
	var answered, stale, none, spills, rounds, moved, updated int
	for pool := range 4000 {
		cands, req := randomPool(rng, pool)
		bases := basesOf(rng, cands)
		fill := func(i int, c *Candidate) { *c = cands[i] }
		built := epoch.Add(-indexShifts[rng.IntN(len(indexShifts))])
		var ix *Index
		switch rng.IntN(4) {
		case 0:
			ix = NewIndex(newSlicePool(bases), epoch)
		case 1:
			// Keyed at another instant, used as it is: it must decline
			// unless none of its keys changed.
			ix = NewIndex(newSlicePool(bases), built)
		case 2:
			ix, moved = NewIndex(newSlicePool(bases), built).Update(newSlicePool(bases), nil, epoch), moved+1
		default:
			// An earlier state of some accounts (the same ids, in
			// another state), updated for them.
			other, _ := randomPool(rng, pool)
			earlier := make([]*Candidate, len(bases))
			copy(earlier, bases)
			var changed []int
			for i := range min(len(other), len(bases)) {
				if rng.IntN(3) == 0 {
					o := other[i]
					earlier[i], changed = &o, append(changed, i)
				}
			}
			if rng.IntN(4) == 0 && len(bases) > 0 {
				changed = append(changed, rng.IntN(len(bases))) // named though unchanged
			}
			ix = NewIndex(newSlicePool(earlier), built).Update(newSlicePool(bases), changed, epoch)
			updated++
		}
		if err := indexHolds(ix); err != nil {
			t.Fatalf("pool %d: %v", pool, err)
		}
		if ix.at.Equal(epoch) && !ix.ValidAt(epoch) {
			t.Fatalf("pool %d: an index keyed or moved to an instant does not serve it (from %v, until %v)", pool, ix.from, ix.until)
		}
		g := BreakerGate{}
		if rng.IntN(3) == 0 {
			g.Avoid = map[uuid.UUID]bool{}
			for i := range cands {
				if rng.IntN(2) == 0 {
					g.Avoid[cands[i].Account.ID] = true
				}
			}
		}
		n := len(cands)
		// Mostly routed at the instant the index was made for, else at
		// another: it must answer exactly or decline there too.
		at := epoch
		if rng.IntN(4) == 0 {
			at = epoch.Add(indexShifts[rng.IntN(len(indexShifts))])
		}
		for _, k := range []int{1, 2, 3, 8, n, n + 5, 0} {
			want, wantNone, wantRound := RouteGatedFirst(cands, req, g, at, k)
			o, round, ok := RouteIndexed(ix, fill, req, g, at, k)
			where := fmt.Sprintf("pool %d (%d accounts, index keyed at epoch%+v, routed at epoch%+v), k=%d", pool, n, ix.at.Sub(epoch), at.Sub(epoch), k)
			switch {
			case !ix.ValidAt(at):
				stale++
				if ok {
					t.Fatalf("%s: an index that does not serve the instant answered", where)
				}
			case wantNone != nil:
				none++
				if ok {
					t.Fatalf("%s: RouteIndexed answers %s, RouteGatedFirst %v", where, labelsOf(o.First), wantNone)
				}
			case !ok:
				t.Fatalf("%s: RouteIndexed declined, RouteGatedFirst answers %s", where, labelsOf(want.First))
			default:
				answered++
				if !reflect.DeepEqual(o.First, want.First) || o.SpillFrom != want.SpillFrom || round != wantRound {
					t.Fatalf("%s: %s spill from %d, new round %v; want %s spill from %d, new round %v",
						where, labelsOf(o.First), o.SpillFrom, round, labelsOf(want.First), want.SpillFrom, wantRound)
				}
				if want.SpillFrom < len(want.First) {
					spills++
				}
				if round {
					rounds++
				}
			}
		}
	}
	if answered < 10000 || stale < 1000 || none < 1000 || spills < 200 || rounds < 100 {
		t.Errorf("the pools met too few cases: %d answered, %d over a stale index, %d no account, %d spills inside First, %d new rounds",
			answered, stale, none, spills, rounds)
	}
	t.Logf("%d answered, %d over a stale index, %d no account, %d spills inside First, %d new rounds; %d indexes moved in time, %d updated",
		answered, stale, none, spills, rounds, moved, updated)
}

// TestRouteIndexedLargePools: over larger pools of mostly alike accounts
// (long runs of equal keys, which the walk must cut exactly), with a
// live lease here and there and this replica's own recent uses, the
// indexed route is the whole route, and it looks at far fewer accounts
// than the pool has: under last_resort too, where subscriptions are
// few among many metered accounts (the walk takes the subscriptions
// first, then the metered accounts).
func TestRouteIndexedLargePools(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(29, 31))
	for pool := range 40 {
		n := 500 + rng.IntN(1500)
		cands := make([]Candidate, n)
		subscriptions := []int{3, 50}[rng.IntN(2)] // one account in so many
		for i := range cands {
			var opts []func(*Candidate)
			if rng.IntN(subscriptions) == 0 {
				opts = append(opts, oauth())
			}
			switch rng.IntN(6) {
			case 0:
				opts = append(opts, weekly([]float64{0.2, 0.5}[rng.IntN(2)], time.Duration(1+rng.IntN(3))*time.Hour))
			case 1:
				opts = append(opts, cooling(time.Hour, true))
			}
			if rng.IntN(10) == 0 {
				opts = append(opts, live(int32(rng.IntN(5))))
			}
			if rng.IntN(4) == 0 {
				opts = append(opts, usedAt(-time.Duration(rng.IntN(3))*time.Minute))
			}
			cands[i] = c(fmt.Sprintf("big%d-%05d", pool, i), opts...)
		}
		bases := basesOf(rng, cands)
		looked := 0
		fill := func(i int, c *Candidate) { looked++; *c = cands[i] }
		ix := NewIndex(newSlicePool(bases), epoch)
		req := RouteRequest{Model: "claude-sonnet-4-5", Metered: []weirv1.MeteredAccounts{meteredNormal, meteredLastResort}[rng.IntN(2)]}
		for _, k := range []int{1, 8} {
			want, wantNone, _ := RouteGatedFirst(cands, req, BreakerGate{}, epoch, k)
			looked = 0
			o, _, ok := RouteIndexed(ix, fill, req, BreakerGate{}, epoch, k)
			if wantNone != nil || !ok || !reflect.DeepEqual(o.First, want.First) || o.SpillFrom != want.SpillFrom {
				t.Fatalf("pool %d (%d accounts), k=%d: %s spill from %d (%v); want %s spill from %d (%v)", pool, n, k,
					labelsOf(o.First), o.SpillFrom, ok, labelsOf(want.First), want.SpillFrom, wantNone)
			}
			if looked > n/4 {
				t.Errorf("pool %d, k=%d: filled %d of %d accounts", pool, k, looked, n)
			}
		}
	}
}
