package policy

import (
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestModelFamily(t *testing.T) {
	t.Parallel()
	for model, want := range map[string]string{
		"claude-opus-4-1-20250805":   "opus",
		"claude-opus-4-20250514":     "opus",
		"claude-3-opus-20240229":     "opus",
		"claude-opus-4-1":            "opus",
		"opus":                       "opus",
		"Claude-Opus-4-1":            "opus",
		"CLAUDE-3-OPUS-LATEST":       "opus",
		"claude-sonnet-4-5-20250929": "sonnet",
		"claude-sonnet-4-5":          "sonnet",
		"claude-3-7-sonnet-20250219": "sonnet",
		"claude-3-7-sonnet-latest":   "sonnet",
		"sonnet":                     "sonnet",
		"Claude-Sonnet-4-5[1m]":      "sonnet",
		"claude-3-5-haiku-20241022":  "haiku",
		"claude-haiku-4-5-20251001":  "haiku",
		"claude-3-5-haiku-latest":    "haiku",
		"HAIKU":                      "haiku",
		// Unknown models are their own family, lower-cased so that case
		// variants share one breaker.
		"gpt-5-codex":      "gpt-5-codex",
		"Mystery-Model-X":  "mystery-model-x",
		"claude-2.1":       "claude-2.1",
		"":                 "",
		"CLAUDE-INSTANT-1": "claude-instant-1",
	} {
		if got := ModelFamily(model); got != want {
			t.Errorf("ModelFamily(%q) = %q, want %q", model, got, want)
		}
	}
}

// brkAt is the breaker's clock in these pure tests.
var brkAt = epoch

func tp(t time.Time) *time.Time { return &t }

func TestBreakerThreshold(t *testing.T) {
	t.Parallel()
	for serving, want := range map[int32]int{-1: 1, 0: 1, 1: 1, 2: 2, 3: 2, 4: 2, 5: 3, 6: 3, 10: 5, 11: 6} {
		if got := breakerThreshold(serving); got != want {
			t.Errorf("breakerThreshold(%d) = %d, want %d", serving, got, want)
		}
	}
}

var accts = []uuid.UUID{uuid.MustParse("00000000-0000-0000-0000-00000000000a"),
	uuid.MustParse("00000000-0000-0000-0000-00000000000b"), uuid.MustParse("00000000-0000-0000-0000-00000000000c")}

// TestAfterOverloadJudgesPerAccount: however often one account of three
// answers overloaded, the breaker stays closed (that account's requests
// fail over); a second account judged overloaded (two answers in the
// window) opens it. A pool whose one serving account is judged opens it
// too: it is every account that can serve.
func TestAfterOverloadJudgesPerAccount(t *testing.T) {
	t.Parallel()
	var b Breaker
	for i := range 20 {
		b = AfterOverload(b, accts[0], 3, brkAt.Add(time.Duration(i)*100*time.Millisecond))
		if b.OpenUntil != nil {
			t.Fatalf("one account's overload %d opened the breaker: %+v", i+1, b)
		}
	}
	if b.Overloads != 20 || !b.WindowStart.Equal(brkAt) || len(b.JudgedAccounts) != 1 || len(b.SeenAccounts) != 0 {
		t.Fatalf("after 20 overloads of one account: %+v", b)
	}
	now := brkAt.Add(3 * time.Second)
	b = AfterOverload(b, accts[1], 3, now)
	if b.OpenUntil != nil || !slices.Equal(b.SeenAccounts, accts[1:2]) {
		t.Fatalf("a second account's first overload: %+v, want seen, still closed", b)
	}
	// The last one lands exactly breakerWindow after the first: still inside.
	now = brkAt.Add(breakerWindow)
	b = AfterOverload(b, accts[1], 3, now)
	if b.OpenUntil == nil || !b.OpenUntil.Equal(now.Add(ProbeEvery(3))) || b.OpenCount != 1 || b.ProbeUntil != nil ||
		!slices.Equal(b.JudgedAccounts, accts[:2]) || len(b.SeenAccounts) != 0 {
		t.Fatalf("two of three accounts judged: %+v, want open until now+%v with open_count 1", b, ProbeEvery(3))
	}

	// One serving account: its second overload opens.
	one := AfterOverload(Breaker{}, accts[0], 1, brkAt)
	if one.OpenUntil != nil {
		t.Fatalf("a lone account's first overload opened: %+v", one)
	}
	if one = AfterOverload(one, accts[0], 1, brkAt.Add(time.Second)); one.OpenUntil == nil {
		t.Fatalf("a lone account judged overloaded: %+v, want open", one)
	}
	// Three accounts seen once each judge none: closed.
	var seen Breaker
	for _, id := range accts {
		seen = AfterOverload(seen, id, 3, brkAt)
	}
	if seen.OpenUntil != nil || len(seen.SeenAccounts) != 3 {
		t.Fatalf("three accounts overloaded once: %+v, want closed", seen)
	}
}

func TestAfterOverloadWindowResets(t *testing.T) {
	t.Parallel()
	b := Breaker{Overloads: 3, WindowStart: brkAt, JudgedAccounts: accts[:1], SeenAccounts: accts[1:2]}
	now := brkAt.Add(breakerWindow + time.Millisecond)
	b = AfterOverload(b, accts[1], 3, now)
	if b.Overloads != 1 || !b.WindowStart.Equal(now) || b.OpenUntil != nil || b.OpenCount != 0 ||
		len(b.JudgedAccounts) != 0 || !slices.Equal(b.SeenAccounts, accts[1:2]) {
		t.Fatalf("after the window: %+v, want a fresh window holding this one overload, closed", b)
	}
	// A zero window start (a new row) starts a window too.
	b = AfterOverload(Breaker{Overloads: 7}, accts[0], 3, now)
	if b.Overloads != 1 || !b.WindowStart.Equal(now) || b.OpenUntil != nil {
		t.Fatalf("new breaker: %+v", b)
	}
}

func TestAfterOverloadWhileOpen(t *testing.T) {
	t.Parallel()
	until := brkAt.Add(BreakerProbeEvery)
	probe := brkAt.Add(ProbeTTL)
	open := Breaker{Overloads: 4, WindowStart: brkAt, OpenUntil: tp(until), OpenCount: 1, ProbeUntil: tp(probe),
		JudgedAccounts: accts[:2]}
	// Overloads while open (stragglers from before the opening, probes
	// failing, before or after the next probe is due) mark their account
	// probed for the round; probes are paced as they are claimed, so no
	// time moves and the breaker does not open again.
	b := open
	for i, d := range []time.Duration{0, time.Millisecond, BreakerProbeEvery, time.Hour} {
		b = AfterOverload(b, accts[i%3], 3, brkAt.Add(d))
		if !b.OpenUntil.Equal(until) || b.OpenCount != 1 || b.ProbeUntil == nil || !b.ProbeUntil.Equal(probe) {
			t.Fatalf("overload at +%v while open: %+v, want open_until, open_count and the probe unchanged", d, b)
		}
	}
	if b.Overloads != 1 {
		// The window rolled over at +1h.
		t.Errorf("overloads %d, want 1", b.Overloads)
	}
	// The probed accounts go round the pool: after all three, start over.
	if !slices.Equal(b.ProbedAccounts, accts[:1]) {
		t.Errorf("probed %v after a round of three and one more, want [%v]", b.ProbedAccounts, accts[0])
	}
}

// TestProbeEvery: each account that can serve is probed once every
// BreakerProbeEvery, within the family's budget of BreakerProbeBudget a
// second.
func TestProbeEvery(t *testing.T) {
	t.Parallel()
	for serving, want := range map[int32]time.Duration{
		0: 2 * time.Second, 1: 2 * time.Second, 2: time.Second, 4: 500 * time.Millisecond, 8: 250 * time.Millisecond,
		16: 125 * time.Millisecond, 17: 125 * time.Millisecond, 50: 125 * time.Millisecond,
	} {
		if got := ProbeEvery(serving); got != want {
			t.Errorf("ProbeEvery(%d) = %v, want %v", serving, got, want)
		}
	}
}

// stormProbes runs an hour-long storm on every one of n accounts with the
// breaker open, probes claimed the moment they are allowed (the claim
// moves the next probe on by the pace, as ClaimProbe does), each to the
// account probed least recently, each failing at once. It returns the
// probes sent and the longest time an account went unprobed.
func stormProbes(n int) (probes int, longestGap time.Duration) {
	ids := make([]uuid.UUID, n)
	for i := range ids {
		ids[i] = uuid.New()
	}
	serving := int32(n)
	var b Breaker
	now := brkAt
	for i := 0; b.OpenUntil == nil; i++ {
		b = AfterOverload(b, ids[(i/2)%n], serving, now)
	}
	last := map[uuid.UUID]time.Time{}
	for _, id := range ids {
		last[id] = now
	}
	end := now.Add(time.Hour)
	for now = *b.OpenUntil; now.Before(end); now = *b.OpenUntil {
		next := now.Add(b.ProbeEvery)
		b.OpenUntil = &next
		var target uuid.UUID
		for _, id := range ids {
			if !slices.Contains(b.ProbedAccounts, id) {
				target = id
				break
			}
		}
		if target == uuid.Nil {
			b.ProbedAccounts, target = nil, ids[0]
		}
		longestGap = max(longestGap, now.Sub(last[target]))
		last[target] = now
		b = AfterOverload(b, target, serving, now)
		probes++
	}
	return probes, longestGap
}

// TestBreakerStormLoad: the upstream load the breaker lets through during
// an hour-long storm on every account, and how soon each account is asked
// again: every account every BreakerProbeEvery up to the budget, then the
// budget, BreakerProbeBudget a second, and each account every
// n/BreakerProbeBudget.
func TestBreakerStormLoad(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n         int
		perSecond float64
		gap       time.Duration
	}{
		{1, 0.5, 2 * time.Second},
		{3, 1.5, 2 * time.Second},
		{8, 4, 2 * time.Second},
		{16, 8, 2 * time.Second},
		{50, 8, 50 * time.Second / BreakerProbeBudget},
	} {
		probes, gap := stormProbes(tc.n)
		if rate := float64(probes) / 3600; rate > tc.perSecond*1.01 || rate < tc.perSecond*0.99 {
			t.Errorf("%d accounts: %d probes in an hour (%.2f a second), want %.2f", tc.n, probes, rate, tc.perSecond)
		}
		if gap > tc.gap+time.Millisecond {
			t.Errorf("%d accounts: an account went %v unprobed, want at most %v", tc.n, gap, tc.gap)
		}
	}
}
