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
	if b.OpenUntil == nil || !b.OpenUntil.Equal(now.Add(BreakerProbeEvery)) || b.OpenCount != 1 || b.ProbeUntil != nil ||
		!slices.Equal(b.JudgedAccounts, accts[:2]) || len(b.SeenAccounts) != 0 {
		t.Fatalf("two of three accounts judged: %+v, want open until now+%v with open_count 1", b, BreakerProbeEvery)
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
	// Stragglers from before the opening: counted, but nothing moves.
	b := open
	for _, d := range []time.Duration{0, time.Millisecond, BreakerProbeEvery - time.Nanosecond} {
		b = AfterOverload(b, accts[2], 3, brkAt.Add(d))
		if !b.OpenUntil.Equal(until) || b.OpenCount != 1 || b.ProbeUntil == nil || !b.ProbeUntil.Equal(probe) || len(b.ProbedAccounts) != 0 {
			t.Fatalf("overload at +%v while open: %+v, want open_until and open_count unchanged", d, b)
		}
	}
	if b.Overloads != 7 {
		t.Errorf("overloads %d, want 7", b.Overloads)
	}
	// At open_until the wait is over: an overload now is the probe
	// failing. The next probe waits BreakerProbeEvery, however many failed.
	now := until
	for i, id := range []uuid.UUID{accts[1], accts[2], accts[0], accts[1]} {
		b = AfterOverload(b, id, 3, now)
		if !b.OpenUntil.Equal(now.Add(BreakerProbeEvery)) || b.OpenCount != int32(i+2) || b.ProbeUntil != nil {
			t.Fatalf("probe %d failed: %+v, want reopened until now+%v, open_count %d, probe slot free", i+1, b, BreakerProbeEvery, i+2)
		}
		now = *b.OpenUntil
	}
	// The probed accounts go round the pool: after all three, start over.
	if !slices.Equal(b.ProbedAccounts, accts[1:2]) {
		t.Errorf("probed %v after a round of three and one more, want [%v]", b.ProbedAccounts, accts[1])
	}
	// A failed probe reopens even when the window has long rolled over.
	later := Breaker{Overloads: 1, WindowStart: brkAt, OpenUntil: tp(brkAt.Add(time.Second)), OpenCount: 1}
	now = brkAt.Add(time.Hour)
	b = AfterOverload(later, accts[0], 3, now)
	if b.Overloads != 1 || !b.OpenUntil.Equal(now.Add(BreakerProbeEvery)) || b.OpenCount != 2 {
		t.Fatalf("probe failed an hour later: %+v", b)
	}
}

// TestBreakerStormLoad: the upstream load the breaker lets through during
// an hour-long storm on every account, when probes are taken the moment
// they are allowed: one attempt per BreakerProbeEvery, 30 a minute.
func TestBreakerStormLoad(t *testing.T) {
	t.Parallel()
	var b Breaker
	now := brkAt
	attempts := 0
	for i := 0; b.OpenUntil == nil; i++ {
		// Before it opens: two answers from each of two accounts.
		b = AfterOverload(b, accts[i/2], 3, now)
		attempts++
	}
	end := now.Add(time.Hour)
	for now = *b.OpenUntil; now.Before(end); now = *b.OpenUntil {
		b = AfterOverload(b, accts[attempts%3], 3, now)
		attempts++
	}
	if perMinute := float64(attempts) / 60; perMinute > 31 || perMinute < 29 {
		t.Errorf("%d attempts in an hour (%.1f a minute), want 30 a minute", attempts, perMinute)
	}
}
