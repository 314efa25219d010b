package policy

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/vocab"
)

// Benchmarks of the control plane's pure decisions: selection over pools
// of 10, 100, 1,000 and 10,000 accounts, the pool-wide quota block, and the 429
// ladder and Decide() on representative answers. No database. Results and
// method: docs/benchmarks.md.

var benchPoolSizes = []int{10, 100, 1000, 10000}

// benchPool is a mixed pool of n Anthropic accounts as the routing view
// shows it: of every ten, one cooling, one gated for opus, one at its cap,
// one near its limit, one with a spent 5-hour window, one in the weekly
// reserve, one without usage evidence, and three healthy with assorted
// weekly readings; priorities, live leases and last use vary. It also
// returns a session-bound account among the eligible ones.
func benchPool(n int) ([]Candidate, uuid.UUID) {
	cands := make([]Candidate, 0, n)
	for i := range n {
		opts := []func(*Candidate){
			usedAt(-time.Duration(i%37) * time.Minute),
			live(int32(i % 3)),
		}
		if i%17 == 0 {
			opts = append(opts, prio(int32(i%3)))
		}
		switch i % 10 {
		case 0:
			opts = append(opts, cooling(time.Duration(1+i%5)*time.Minute, true))
		case 1:
			opts = append(opts, gated(time.Duration(10+i%50)*time.Hour))
		case 2:
			opts = append(opts, live(4))
		case 3:
			opts = append(opts, weekly(0.93, time.Duration(20+i%100)*time.Hour))
		case 4:
			opts = append(opts, fiveHour(0.995, time.Duration(1+i%4)*time.Hour), weekly(0.5, 90*time.Hour))
		case 5:
			opts = append(opts, weekly(0.85, time.Duration(30+i%100)*time.Hour))
		case 6:
			// no usage evidence
		default:
			opts = append(opts, fiveHour(float64(i%60)/100, time.Duration(1+i%4)*time.Hour),
				weekly(float64(i%70)/100, time.Duration(1+i%160)*time.Hour))
		}
		cands = append(cands, c(fmt.Sprintf("acct-%04d", i), opts...))
	}
	return cands, cands[len(cands)/20*10+7].Account.ID // an i%10 == 7 account: healthy
}

// benchBlockedPool is a pool of n accounts every one of which is out on
// quota evidence covering its deadline (a quota cooldown, a spent window,
// a family gate on its claim's reset): the no-account path, where route
// calls quotaBlock over the whole pool.
func benchBlockedPool(n int) []Candidate {
	cands := make([]Candidate, 0, n)
	for i := range n {
		var opt func(*Candidate)
		reset := time.Duration(1+i%90) * time.Hour
		switch i % 3 {
		case 0:
			opt = func(x *Candidate) {
				resets := epoch.Add(reset)
				x.Cooldown = &Cooldown{Reason: weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, Transient: true,
					Until: resets, WrittenAt: epoch, Quota: &QuotaRecord{Kind: vocab.Value[weirv1.QuotaKind]("anthropic_unified"),
						ResetsAt: resets, WindowMinutes: 300,
						Message: "This request would exceed your account's rate limit. Please try again later."}}
			}
		case 1:
			opt = weekly(1.0, reset)
		default:
			opt = gated(reset)
		}
		cands = append(cands, c(fmt.Sprintf("acct-%04d", i), opt))
	}
	return cands
}

func benchRouteRequest(session uuid.UUID) RouteRequest {
	return RouteRequest{Model: "claude-opus-4-1", Surface: weirv1.Surface_SURFACE_MESSAGES,
		BreakerOpen: map[weirv1.Provider]bool{}, Exclude: map[uuid.UUID]bool{}, SessionAccount: session}
}

func BenchmarkRoute(b *testing.B) {
	for _, n := range benchPoolSizes {
		cands, session := benchPool(n)
		req := benchRouteRequest(session)
		b.Run(fmt.Sprintf("mixed/%d", n), func(b *testing.B) {
			order, none := Route(cands, req, epoch)
			if none != nil || order[0].Account.ID != session {
				b.Fatalf("route: %v, first %v", none, order[0].Account.Label)
			}
			for b.Loop() {
				Route(cands, req, epoch)
			}
		})
	}
	for _, n := range benchPoolSizes {
		// What the claim loop asks for (leases.go): the best 8.
		cands, session := benchPool(n)
		req := benchRouteRequest(session)
		b.Run(fmt.Sprintf("first8/%d", n), func(b *testing.B) {
			all, _ := Route(cands, req, epoch)
			o, none := RouteFirst(cands, req, epoch, 8)
			if none != nil || len(o.First) != min(8, len(all)) || o.First[0].Account.ID != session {
				b.Fatalf("route: %v, %d first", none, len(o.First))
			}
			for b.Loop() {
				RouteFirst(cands, req, epoch, 8)
			}
		})
	}
	for _, n := range benchPoolSizes {
		// The same over the pool's index, as Acquire ranks now: the index
		// is made once per state of the routing cache (BenchmarkRouteIndex
		// times that), the accounts the walk looks at filled one by one.
		cands, session := benchPool(n)
		req := benchRouteRequest(session)
		ix := NewIndex(newSlicePool(benchBases(cands)), epoch)
		fill := func(i int, c *Candidate) { *c = cands[i] }
		b.Run(fmt.Sprintf("indexed8/%d", n), func(b *testing.B) {
			want, _ := RouteFirst(cands, req, epoch, 8)
			o, _, ok := RouteIndexed(ix, fill, req, BreakerGate{}, epoch, 8)
			if !ok || labelsOf(o.First) != labelsOf(want.First) || o.SpillFrom != want.SpillFrom {
				b.Fatalf("indexed route: %v %s, want %s", ok, labelsOf(o.First), labelsOf(want.First))
			}
			for b.Loop() {
				RouteIndexed(ix, fill, req, BreakerGate{}, epoch, 8)
			}
		})
	}
	for _, n := range benchPoolSizes {
		cands := benchBlockedPool(n)
		req := benchRouteRequest(uuid.Nil)
		b.Run(fmt.Sprintf("all_quota_blocked/%d", n), func(b *testing.B) {
			if _, none := Route(cands, req, epoch); none == nil || none.QuotaBlock == nil || none.QuotaBlock.Accounts != int32(n) {
				b.Fatalf("route: %v", none)
			}
			for b.Loop() {
				Route(cands, req, epoch)
			}
		})
	}
}

// benchBases is what an index reads of a bench pool: its accounts
// without their live leases.
func benchBases(cands []Candidate) []*Candidate {
	out := make([]*Candidate, len(cands))
	for i, c := range cands {
		c.Live = 0
		out[i] = &c
	}
	return out
}

// BenchmarkRouteIndex is what keeping a pool's index costs: made anew
// (build: a whole read of the routing cache, an account added or
// removed); updated for a slice of accounts read again (the rolling
// refresh's, an 18th of the pool, every 100 ms: update_slice where a
// twentieth of them was leased since, which moves it in the order,
// update_slice_moved where every one moves); and moved past a deadline
// (advance: the soonest 5-hour reset of the mixed pool, which a tenth of
// its accounts share).
func BenchmarkRouteIndex(b *testing.B) {
	for _, n := range benchPoolSizes[2:] {
		cands, _ := benchPool(n)
		bases := benchBases(cands)
		pool := newSlicePool(bases)
		b.Run(fmt.Sprintf("build/%d", n), func(b *testing.B) {
			for b.Loop() {
				NewIndex(pool, epoch)
			}
		})
		ix := NewIndex(pool, epoch)
		again, moved := slices.Clone(bases), slices.Clone(bases)
		var changed []int
		for i := 0; i < n; i += 18 {
			c, m := *again[i], *again[i]
			if len(changed)%20 == 0 {
				used := epoch.Add(-time.Second)
				c.Account.LastUsedAt = &used
			}
			m.Account.Priority++
			again[i], moved[i], changed = &c, &m, append(changed, i)
		}
		for name, p := range map[string]*slicePool{"update_slice": newSlicePool(again), "update_slice_moved": newSlicePool(moved)} {
			b.Run(fmt.Sprintf("%s/%d", name, n), func(b *testing.B) {
				for b.Loop() {
					ix.Update(p, changed, epoch)
				}
			})
		}
		b.Run(fmt.Sprintf("advance/%d", n), func(b *testing.B) {
			if ix.until.IsZero() {
				b.Fatal("the pool's index has no deadline")
			}
			for b.Loop() {
				ix.Update(pool, nil, ix.until)
			}
		})
	}
}

// BenchmarkQuotaBlock: on a mixed pool it stops at the first account that
// is not quota-blocked; on a blocked pool it reads every account's
// evidence (PoolQuota, and route's no-account path).
func BenchmarkQuotaBlock(b *testing.B) {
	for _, n := range benchPoolSizes {
		cands, _ := benchPool(n)
		req := benchRouteRequest(uuid.Nil)
		b.Run(fmt.Sprintf("mixed/%d", n), func(b *testing.B) {
			if q := QuotaBlock(cands, req, epoch); q != nil {
				b.Fatalf("quotaBlock = %v on a pool that can serve", q)
			}
			for b.Loop() {
				QuotaBlock(cands, req, epoch)
			}
		})
	}
	for _, n := range benchPoolSizes {
		cands := benchBlockedPool(n)
		req := benchRouteRequest(uuid.Nil)
		b.Run(fmt.Sprintf("all_quota_blocked/%d", n), func(b *testing.B) {
			if q := QuotaBlock(cands, req, epoch); q == nil || q.Accounts != int32(n) {
				b.Fatalf("quotaBlock = %v", q)
			}
			for b.Loop() {
				QuotaBlock(cands, req, epoch)
			}
		})
	}
}

// benchLadderCase is one representative 429 with what the ladder must
// conclude.
type benchLadderCase struct {
	name    string
	headers map[string]string
	oauth   bool
	family  string
	now     time.Time
	rung    Rung
}

func benchLadderCases(b *testing.B) []benchLadderCase {
	weekly := captureNamed(b, "429-weekly-rejected")
	weeklyNow, err := http.ParseTime(weekly.date)
	if err != nil {
		b.Fatal(err)
	}
	burst := map[string]string{"retry-after": "2", "x-should-retry": "true", "request-id": "req_011CUqTb4s2GkV1nZpR8oYwA"}
	fiveHourRejected := hdr("status", "rejected", "representative-claim", "five_hour", "reset", at(2*time.Hour),
		"5h-status", "rejected", "5h-utilization", "1.0", "5h-reset", at(2*time.Hour),
		"7d-status", "allowed", "7d-utilization", "0.4", "7d-reset", at(96*time.Hour),
		"fallback-percentage", "0.5", "overage-status", "rejected", "overage-disabled-reason", "org_level_disabled",
		"retry-after", "7200", "x-should-retry", "true")
	fiveHourRejected["request-id"] = "req_011CUqT6mF3x9wZ7yKp2VdQe"
	return []benchLadderCase{
		{"unified_5h_rejected", fiveHourRejected, true, "opus", epoch, rungAccountQuota},
		{"weekly_capture_family_gate", maps.Clone(weekly.headers), true, "opus", weeklyNow, rungFamilyGate},
		{"burst", burst, true, "sonnet", epoch, rungBurst},
		{"residual_api_key", burst, false, "sonnet", epoch, rungResidual},
	}
}

func BenchmarkLadder(b *testing.B) {
	for _, tc := range benchLadderCases(b) {
		b.Run(tc.name, func(b *testing.B) {
			in := ladderInput{headers: tc.headers, oauth: tc.oauth, family: tc.family, now: tc.now}
			if got := ladder(in).rung; got != tc.rung {
				b.Fatalf("rung %s, want %s", got, tc.rung)
			}
			for b.Loop() {
				ladder(in)
			}
		})
	}
}

func durationMs(ms int) *durationpb.Duration {
	return durationpb.New(time.Duration(ms) * time.Millisecond)
}

func BenchmarkDecide(b *testing.B) {
	type decideCase struct {
		name string
		o    *weirv1.Outcome
		f    Facts
		now  time.Time
		rung Rung
	}
	var cases []decideCase
	for _, tc := range benchLadderCases(b) {
		cases = append(cases, decideCase{tc.name, &weirv1.Outcome{
			Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, ErrorType: "rate_limit_error",
			ErrorMessage: "This request would exceed your account's rate limit. Please try again later.",
			Headers:      tc.headers, Duration: durationMs(412), TimeToFirstByte: durationMs(398),
		}, Facts{OAuth: tc.oauth, Family: tc.family}, tc.now, tc.rung})
	}
	codexReset := epoch.Add(36800 * time.Second)
	cases = append(cases, decideCase{"codex_usage_limit_reached", &weirv1.Outcome{
		Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, ErrorType: "usage_limit_reached",
		ErrorMessage: "The usage limit has been reached",
		Headers: map[string]string{
			"x-codex-primary-used-percent":          "100",
			"x-codex-primary-window-minutes":        "300",
			"x-codex-primary-reset-at":              strconv.FormatInt(codexReset.Unix(), 10),
			"x-codex-primary-reset-after-seconds":   "36800",
			"x-codex-secondary-used-percent":        "64",
			"x-codex-secondary-window-minutes":      "10080",
			"x-codex-secondary-reset-at":            strconv.FormatInt(epoch.Add(400000*time.Second).Unix(), 10),
			"x-codex-secondary-reset-after-seconds": "400000",
			"x-codex-plan-type":                     "plus",
		},
		Quota: &weirv1.QuotaEvidence{Kind: weirv1.QuotaKind_QUOTA_KIND_CODEX_USAGE_LIMIT, ResetsAt: timestamppb.New(codexReset),
			WindowMinutes: 300, Message: "The usage limit has been reached"},
		Duration: durationMs(180), TimeToFirstByte: durationMs(175),
	}, Facts{OAuth: true}, epoch, rungProviderQuota})
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			if got := Decide(tc.o, tc.f, tc.now).Rung; got != tc.rung {
				b.Fatalf("rung %s, want %s", got, tc.rung)
			}
			for b.Loop() {
				Decide(tc.o, tc.f, tc.now)
			}
		})
	}
}
