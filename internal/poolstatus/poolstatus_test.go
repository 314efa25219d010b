package poolstatus

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestBuildCountsAgainstOracle: over random pools of accounts in every
// state, overloaded at different times and gated for different families
// until different times, Build's counts per provider and family are what a
// plain count of each account says.
func TestBuildCountsAgainstOracle(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	states := []weirv1.AccountState{weirv1.AccountState_ACCOUNT_STATE_ACTIVE, weirv1.AccountState_ACCOUNT_STATE_COOLING,
		weirv1.AccountState_ACCOUNT_STATE_PAUSED, weirv1.AccountState_ACCOUNT_STATE_BROKEN}
	providers := []weirv1.Provider{weirv1.Provider_PROVIDER_ANTHROPIC, weirv1.Provider_PROVIDER_CODEX}
	families := []string{"opus", "sonnet"}
	for seed := range 200 {
		r := rand.New(rand.NewPCG(uint64(seed), 26))
		var accts []*weirv1.Account
		for i := range 1 + r.IntN(12) {
			a := &weirv1.Account{Label: fmt.Sprintf("a%d", i), Provider: providers[r.IntN(2)], State: states[r.IntN(4)], MaxConcurrency: 4}
			if r.IntN(3) == 0 {
				a.OverloadedAt = timestamppb.New(now.Add(-time.Duration(r.IntN(120)) * time.Second))
			}
			for _, f := range families {
				if r.IntN(3) == 0 {
					// Some gates have lifted already.
					a.FamilyGates = append(a.FamilyGates, &weirv1.FamilyGate{Family: f, Until: timestamppb.New(now.Add(time.Duration(r.IntN(7200)-600) * time.Second))})
				}
			}
			accts = append(accts, a)
		}
		st := Build(accts, &weirv1.Settings{}, nil, now)
		for _, p := range st.Providers {
			var total, serving, overloaded int
			canServe := map[string]int{}
			gated := map[string]int{}
			for _, a := range accts {
				if shortEnum(a.Provider.String(), "PROVIDER_") != p.Provider {
					continue
				}
				total++
				over := a.OverloadedAt != nil && now.Sub(a.OverloadedAt.AsTime()) < time.Minute
				ok := a.State == weirv1.AccountState_ACCOUNT_STATE_ACTIVE && !over
				if a.State == weirv1.AccountState_ACCOUNT_STATE_ACTIVE && over {
					overloaded++
				}
				if ok {
					serving++
				}
				for _, f := range families {
					isGated := false
					for _, g := range a.FamilyGates {
						isGated = isGated || (g.Family == f && g.Until.AsTime().After(now))
					}
					if isGated {
						gated[f]++
					} else if ok {
						canServe[f]++
					}
				}
			}
			if p.Total != total || p.Serving != serving || p.Overloaded != overloaded || p.Serving+p.Overloaded != p.Active {
				t.Fatalf("seed %d %s: total %d serving %d overloaded %d active %d, want %d %d %d", seed, p.Provider,
					p.Total, p.Serving, p.Overloaded, p.Active, total, serving, overloaded)
			}
			listed := map[string]Family{}
			for _, f := range p.Families {
				listed[f.Family] = f
			}
			for _, f := range families {
				got, ok := listed[f]
				if gated[f] == 0 {
					if ok {
						t.Fatalf("seed %d %s: %s listed with no gate: %+v", seed, p.Provider, f, got)
					}
					continue
				}
				if !ok || got.Gated != gated[f] || got.Serving != canServe[f] {
					t.Fatalf("seed %d %s %s: %+v, want %d gated and %d serving", seed, p.Provider, f, got, gated[f], canServe[f])
				}
			}
		}
	}
}
