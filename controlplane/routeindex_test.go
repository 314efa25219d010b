package controlplane

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestRouteSnapIndex: along a run of routing cache states as the cache
// makes them (accounts read again alone and by slices, renamed, added and
// deleted; leased by this replica; time passing over overload marks,
// usage resets and cooldowns), Acquire's route over the snapshot's index
// (routeIndex, RouteIndexed with view.fill) is the route over every
// account's candidate (candidates, RouteGatedFirst), for random requests
// with random live leases, waiters and gates; and a key's pins (view.pool)
// are its pinned accounts of the whole view.
func TestRouteSnapIndex(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(41, 43))
	start := time.Date(2031, time.May, 6, 7, 8, 9, 0, time.UTC)
	now := start
	keys := []uuid.UUID{uuid.New(), uuid.New()}
	teams := []uuid.UUID{uuid.New(), uuid.New()}
	families := []string{"sonnet", "opus"}
	row := func(id uuid.UUID, label string) db.RoutingAccountsRow {
		at := func(d time.Duration) *time.Time { t := now.Add(d); return &t }
		r := db.RoutingAccountsRow{ID: id, Label: label, Provider: providerAnthropic, AuthKind: "api_key",
			MaxConcurrency: int32(1 + rng.IntN(3)), Priority: int32(rng.IntN(2)), CredentialRevision: 1}
		switch rng.IntN(8) {
		case 0:
			r.AuthKind = "oauth"
		case 1:
			r.Provider, r.AuthKind = "codex", "oauth"
		case 2:
			r.Provider = "openai"
		}
		switch rng.IntN(12) {
		case 0:
			r.Paused = true
		case 1:
			r.BrokenAt = at(-time.Hour)
		case 2:
			r.RecoveryProbe = true
		case 3, 4:
			reason := "rate_limited"
			r.CooldownReason, r.CooldownUntil, r.CooldownWrittenAt = &reason, at(time.Duration(rng.IntN(120)-20)*time.Second), at(-time.Second)
		}
		if rng.IntN(2) == 0 {
			r.LastUsedAt = at(-time.Duration(rng.IntN(5)) * time.Minute)
		}
		if rng.IntN(6) == 0 {
			r.OverloadedAt = at(-time.Duration(rng.IntN(12)) * time.Second)
		}
		switch rng.IntN(8) {
		case 0:
			r.OwnerKeyID = uuid.NullUUID{UUID: keys[rng.IntN(2)], Valid: true}
		case 1:
			r.OwnerTeamID = uuid.NullUUID{UUID: teams[rng.IntN(2)], Valid: true}
		}
		utils := []float64{0.3, 0.85, 0.92, 1}
		if rng.IntN(2) == 0 {
			u := utils[rng.IntN(len(utils))]
			r.SevenDayUtilization, r.SevenDayResetsAt = &u, at(time.Duration(rng.IntN(30*60))*time.Second+time.Duration(rng.IntN(3))*12*time.Hour)
		}
		if rng.IntN(3) == 0 {
			u := utils[rng.IntN(len(utils))]
			r.FiveHourUtilization, r.FiveHourResetsAt = &u, at(time.Duration(rng.IntN(30*60))*time.Second)
		}
		return r
	}
	gatesOf := func(ids []uuid.UUID) []db.FamilyGate {
		var out []db.FamilyGate
		for _, id := range ids {
			if rng.IntN(6) == 0 {
				out = append(out, db.FamilyGate{AccountID: id, Family: families[rng.IntN(2)], Until: now.Add(time.Duration(rng.IntN(600)) * time.Second), WrittenAt: now})
			}
		}
		return out
	}
	var rows []db.RoutingAccountsRow
	var ids []uuid.UUID
	for i := range 80 {
		id := uuid.New()
		ids = append(ids, id)
		rows = append(rows, row(id, fmt.Sprintf("acct-%03d", i)))
	}
	snap := newRouteSnap(rows, gatesOf(ids), 1)
	made := len(ids)
	var indexed, inherited, chained, whole int
	for step := range 600 {
		// The cache's next state.
		switch what := rng.IntN(10); {
		case what < 5: // accounts read again, alone or as a slice
			n := 1 + rng.IntN(3)
			if what == 0 {
				n = 20
			}
			var read []uuid.UUID
			var again []db.RoutingAccountsRow
			for range n {
				e := snap.entries[rng.IntN(len(snap.entries))]
				read = append(read, e.cand.Account.ID)
				again = append(again, row(e.cand.Account.ID, e.cand.Account.Label))
			}
			snap = snap.with(read, again, gatesOf(read))
		case what == 5: // renamed
			e := snap.entries[rng.IntN(len(snap.entries))]
			snap = snap.with([]uuid.UUID{e.cand.Account.ID}, []db.RoutingAccountsRow{row(e.cand.Account.ID, fmt.Sprintf("acct-%03d", rng.IntN(200)))}, nil)
		case what == 6: // added or deleted
			if rng.IntN(2) == 0 || len(snap.entries) < 20 {
				made++
				id := uuid.New()
				snap = snap.with([]uuid.UUID{id}, []db.RoutingAccountsRow{row(id, fmt.Sprintf("acct-%03d", made))}, nil)
			} else {
				snap = snap.with([]uuid.UUID{snap.entries[rng.IntN(len(snap.entries))].cand.Account.ID}, nil, nil)
			}
		case what == 7: // leased here
			snap.leased(snap.entries[rng.IntN(len(snap.entries))].cand.Account.ID, now)
		}
		now = now.Add(time.Duration(rng.IntN(40)) * time.Second)
		if from := snap.from.Load(); from != nil {
			inherited++
			if len(from.changed) > 3 {
				chained++
			}
		} else if snap.ix.Load() == nil {
			whole++
		}
		// Some states are never routed over: the next one's index comes
		// from further back.
		for range rng.IntN(4) {
			family := families[rng.IntN(2)]
			var f db.AcquireFactsRow
			for range rng.IntN(12) {
				f.LiveIds, f.LiveCounts = append(f.LiveIds, snap.entries[rng.IntN(len(snap.entries))].cand.Account.ID), append(f.LiveCounts, int32(1+rng.IntN(3)))
			}
			for range rng.IntN(3) {
				f.WaiterIds = append(f.WaiterIds, snap.entries[rng.IntN(len(snap.entries))].cand.Account.ID)
				f.WaitersAhead, f.Waiters = append(f.WaitersAhead, int32(rng.IntN(2))), append(f.Waiters, int32(rng.IntN(3)))
			}
			viewAt := now.Add(-time.Duration(rng.IntN(3)) * time.Millisecond) // read a moment before the route
			v := view{snap: snap, facts: f, family: family, now: viewAt}
			any := func() uuid.UUID {
				if rng.IntN(5) == 0 {
					return uuid.Nil
				}
				return snap.entries[rng.IntN(len(snap.entries))].cand.Account.ID
			}
			key := keyGrant{id: keys[rng.IntN(2)], team: teams[rng.IntN(2)],
				metered: []weirv1.MeteredAccounts{0, weirv1.MeteredAccounts_METERED_ACCOUNTS_LAST_RESORT, weirv1.MeteredAccounts_METERED_ACCOUNTS_NEVER}[rng.IntN(3)],
				owned:   []weirv1.OwnedAccounts{0, weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY}[rng.IntN(2)]}
			rr := key.route(policy.RouteRequest{Model: "claude-" + family + "-4-5", Surface: weirv1.Surface(rng.IntN(4)),
				SessionAccount: any(), PreferAccount: any(), Exclude: map[uuid.UUID]bool{any(): true}})
			var g policy.BreakerGate
			if rng.IntN(4) == 0 {
				g.Avoid = map[uuid.UUID]bool{any(): true, any(): true}
			}
			want, wantNone, wantRound := policy.RouteGatedFirst(v.all(), rr, g, now, claimRank)
			o, round, ok := policy.RouteIndexed(snap.routeIndex(now), v.fill, rr, g, now, claimRank)
			if ok != (wantNone == nil) || (ok && (!reflect.DeepEqual(o.First, want.First) || o.SpillFrom != want.SpillFrom || round != wantRound)) {
				t.Fatalf("step %d: over the index %v %s (spill from %d, new round %v); over every account %v %s (spill from %d, new round %v)",
					step, ok, describeCands(o.First), o.SpillFrom, round, wantNone, describeCands(want.First), want.SpillFrom, wantRound)
			}
			if ok {
				indexed++
			}
			// A pinned key's pool is the accounts of the whole view it
			// may use.
			key.pinned, key.pins = true, []uuid.UUID{any(), any(), uuid.New(), any()}
			allowed := slices.DeleteFunc(slices.Clone(v.all()), func(c policy.Candidate) bool { return !key.allows(c.Account.ID) })
			if got := v.pool(key); !reflect.DeepEqual(got, allowed) || len(got) == 0 && len(allowed) != 0 {
				t.Fatalf("step %d: the pins read alone %s, of the whole view %s", step, describeCands(got), describeCands(allowed))
			}
			pinned, pinnedNone, _ := policy.RouteGatedFirst(v.pool(key), rr, g, now, claimRank)
			wantPinned, wantPinnedNone, _ := policy.RouteGatedFirst(allowed, rr, g, now, claimRank)
			if !reflect.DeepEqual(pinned.First, wantPinned.First) || !proto.Equal(pinnedNone, wantPinnedNone) {
				t.Fatalf("step %d: a pinned key routed %s %v, want %s %v", step, describeCands(pinned.First), pinnedNone,
					describeCands(wantPinned.First), wantPinnedNone)
			}
			v.done()
		}
	}
	if indexed < 300 || inherited < 100 || chained < 20 || whole < 20 {
		t.Errorf("too few cases met: %d routed over an index, %d snapshots inheriting an earlier one's index (%d from further back), %d indexed anew",
			indexed, inherited, chained, whole)
	}
	t.Logf("%d routed over an index; %d snapshots inheriting an earlier one's index (%d from further back), %d indexed anew",
		indexed, inherited, chained, whole)
}
