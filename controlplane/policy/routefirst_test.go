package policy

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// randomPool is a pool of up to 60 accounts in every state routing reads,
// drawn from few values so that whole rank keys tie often (in a plain pool,
// most accounts are alike), with a request over it that names some of
// them (session, preferred, excluded, unreadable) and owners among theirs.
func randomPool(rng *rand.Rand, pool int) ([]Candidate, RouteRequest) {
	owners := []uuid.UUID{uuid.NewSHA1(uuid.NameSpaceOID, []byte("key-a")), uuid.NewSHA1(uuid.NameSpaceOID, []byte("key-b"))}
	teams := []uuid.UUID{uuid.NewSHA1(uuid.NameSpaceOID, []byte("team-a")), uuid.NewSHA1(uuid.NameSpaceOID, []byte("team-b"))}
	pick := func(p float64) bool { return rng.Float64() < p }
	plain := pick(0.3)
	vary := func(p float64) bool { // an account's state beyond the common one
		if plain {
			p /= 10
		}
		return pick(p)
	}
	hours := func(max int) time.Duration { return time.Duration(rng.IntN(max)+1) * time.Hour }
	utils := []float64{0.1, 0.5, 0.8, 0.85, 0.9, 0.93, 0.99, 1}
	n := rng.IntN(61)
	cands := make([]Candidate, 0, n)
	for i := range n {
		var opts []func(*Candidate)
		add := func(o func(*Candidate)) { opts = append(opts, o) }
		switch rng.IntN(20) {
		case 0:
			add(provider("openai"))
		case 1:
			add(provider("codex"))
		}
		if pick(0.5) {
			add(oauth()) // a subscription; else metered (an API key)
		}
		state := rng.IntN(40)
		if plain {
			state = rng.IntN(200)
		}
		switch state {
		case 0:
			add(cooling(time.Duration(1+rng.IntN(5))*time.Minute, true))
		case 1:
			add(cooling(time.Hour, false))
		case 2:
			add(cooling(-time.Second, true)) // expired: no cooldown
		case 3:
			add(gated(hours(50)))
		case 4:
			add(gatedNoReset(time.Hour))
		case 5:
			add(quotaCooling(hours(5), hours(5), 300, "limit"))
		case 6:
			add(unreachableSince(-time.Minute, -time.Hour, 3, "dns"))
		case 7:
			add(paused())
		case 8:
			add(broken())
		case 9:
			add(recoveryProbe())
		}
		if vary(0.6) {
			add(weekly(utils[rng.IntN(len(utils))], time.Duration(rng.IntN(170)-2)*time.Hour)) // some expired
		}
		if vary(0.4) {
			add(fiveHour(utils[rng.IntN(len(utils))], time.Duration(rng.IntN(6)-1)*time.Hour))
		}
		if vary(0.3) {
			add(prio(int32(rng.IntN(3) - 1)))
		}
		if vary(0.8) {
			add(capOf(int32(1 + rng.IntN(4))))
			add(live(int32(rng.IntN(4))))
		}
		if vary(0.1) {
			add(ahead(1))
		}
		if vary(0.7) {
			add(usedAt(-time.Duration(rng.IntN(4)) * time.Minute))
		}
		if vary(0.1) {
			add(overloadedAgo(time.Duration(rng.IntN(2)) * AnsweringWindow))
		}
		switch owner := rng.IntN(6); {
		case plain && owner < 4:
		case owner == 0:
			key := owners[rng.IntN(2)]
			add(func(x *Candidate) { x.Account.OwnerKey = key })
		case owner == 1:
			team := teams[rng.IntN(2)]
			add(func(x *Candidate) { x.Account.OwnerTeam = team })
		}
		cands = append(cands, c(fmt.Sprintf("pool%d-acct%d", pool, i), opts...))
	}
	req := RouteRequest{Model: "claude-opus-4-1", Exclude: map[uuid.UUID]bool{}, Unreadable: map[uuid.UUID]bool{},
		BreakerOpen: map[weirv1.Provider]bool{}, Key: owners[0]}
	anyID := func() uuid.UUID {
		if n == 0 || pick(0.2) {
			return uuid.New() // an account not in the pool
		}
		return cands[rng.IntN(n)].Account.ID
	}
	switch rng.IntN(8) {
	case 0:
		req.Surface = weirv1.Surface_SURFACE_RESPONSES
	case 1:
		req.Surface = weirv1.Surface_SURFACE_CHAT_COMPLETIONS
	case 2:
		req.Surface = weirv1.Surface_SURFACE_MESSAGES
	}
	req.Metered = []weirv1.MeteredAccounts{weirv1.MeteredAccounts_METERED_ACCOUNTS_UNSPECIFIED,
		meteredNormal, meteredLastResort, meteredLastResort, meteredNeverMode}[rng.IntN(5)]
	req.MeteredByKey = pick(0.5)
	req.Owned = []weirv1.OwnedAccounts{weirv1.OwnedAccounts_OWNED_ACCOUNTS_UNSPECIFIED,
		weirv1.OwnedAccounts_OWNED_ACCOUNTS_SHARED, weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY}[rng.IntN(3)]
	if pick(0.5) {
		req.Team = teams[0]
	}
	if pick(0.5) {
		req.SessionAccount = anyID()
	}
	if pick(0.3) {
		req.PreferAccount = anyID()
	}
	for range rng.IntN(4) {
		req.Exclude[anyID()] = true
	}
	if pick(0.1) {
		req.Unreadable[anyID()] = true
	}
	if pick(0.05) {
		req.BreakerOpen[weirv1.Provider_PROVIDER_ANTHROPIC] = true
	}
	return cands, req
}

// TestRouteFirstIsRoutesPrefix: over random pools in every state, and for
// every k, RouteFirst answers what Route does cut at k: the same first
// accounts in the same order (ties broken by the pool's order), the same
// NoAccount when none can serve, and
// SpillFrom where Route's order puts it whenever that is inside First.
func TestRouteFirstIsRoutesPrefix(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 11))
	var cut, whole, none, spills int // the cases met, so that the test keeps meeting them
	for pool := range 3000 {
		cands, req := randomPool(rng, pool)
		order, wantNone := Route(cands, req, epoch)
		spill := SpillFrom(cands, order, req)
		n := len(order)
		for _, k := range []int{1, 2, 3, 8, n, n + 5, 0} {
			o, gotNone := RouteFirst(cands, req, epoch, k)
			where := fmt.Sprintf("pool %d (%d accounts, %d eligible), k=%d", pool, len(cands), n, k)
			if wantNone != nil {
				none++
				if !proto.Equal(gotNone, wantNone) || o.First != nil {
					t.Fatalf("%s: RouteFirst %v %+v, Route %v", where, gotNone, o, wantNone)
				}
				continue
			}
			if gotNone != nil {
				t.Fatalf("%s: RouteFirst says no account (%v), Route orders %s", where, gotNone, labelsOf(order))
			}
			want := order
			if k > 0 && k < n {
				want, cut = order[:k], cut+1
			} else {
				whole++
			}
			if labelsOf(o.First) != labelsOf(want) {
				t.Fatalf("%s: first %s, want %s", where, labelsOf(o.First), labelsOf(want))
			}
			if got, want := o.SpillFrom, min(spill, len(o.First)); got != want {
				t.Fatalf("%s: SpillFrom %d, want %d (Route's order %s: %d)", where, got, want, labelsOf(order), spill)
			}
			if spill < len(o.First) {
				spills++
			}
		}
	}
	if cut < 3000 || whole < 3000 || none < 1000 || spills < 300 {
		t.Errorf("the pools met too few cases: %d cut, %d whole, %d no account, %d spills inside First", cut, whole, none, spills)
	}
	t.Logf("%d cut, %d whole, %d no account, %d spills inside First", cut, whole, none, spills)
}

// TestRouteGatedFirst: behind a breaker gate as well, RouteGatedFirst is
// RouteGated cut at k, new round and answer alike.
func TestRouteGatedFirst(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(13, 17))
	for pool := range 500 {
		cands, req := randomPool(rng, pool)
		g := BreakerGate{Avoid: map[uuid.UUID]bool{}}
		for i := range cands {
			if rng.IntN(2) == 0 {
				g.Avoid[cands[i].Account.ID] = true
			}
		}
		if rng.IntN(3) == 0 {
			g.None = &weirv1.NoAccount{Reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING, Message: "breaker open"}
		}
		order, wantNone, wantRound := RouteGated(cands, req, g, epoch)
		for _, k := range []int{1, 3, 0} {
			o, gotNone, gotRound := RouteGatedFirst(cands, req, g, epoch, k)
			want := order
			if k > 0 && k < len(order) {
				want = order[:k]
			}
			if labelsOf(o.First) != labelsOf(want) || gotRound != wantRound || !proto.Equal(gotNone, wantNone) {
				t.Fatalf("pool %d, k=%d: %s, round %v, %v; want %s, round %v, %v", pool, k,
					labelsOf(o.First), gotRound, gotNone, labelsOf(want), wantRound, wantNone)
			}
		}
	}
}
