package pricing

import (
	"math/rand/v2"
	"testing"
)

func TestLookupLongestMatch(t *testing.T) {
	t.Parallel()
	tab := NewTable([]Entry{{Pattern: "claude-sonnet-4-5*", Price: Price{Input: 9}}, {Pattern: "gpt-6.2-sol", Price: Price{Input: 2, Output: 8}}})
	for _, c := range []struct {
		model, pattern string
		ok             bool
	}{
		{"claude-sonnet-4-5-20250929", "claude-sonnet-4-5*", true},
		{"claude-sonnet-4-20250514", "claude-sonnet-4*", true},
		{"claude-opus-4-5-20251101", "claude-opus-4-5*", true},
		{"claude-opus-4-1-20250805", "claude-opus-4*", true},
		{"claude-sonnet-5-5", "claude-sonnet-5-5*", true},
		{"claude-sonnet-5", "claude-sonnet-5*", true},
		{"gpt-5.4-mini", "gpt-5.4-mini*", true},
		{"gpt-5.4", "gpt-5.4*", true},
		{"gpt-5-codex", "gpt-5*", true},
		{"gpt-6.2-sol", "gpt-6.2-sol", true},
		{"gpt-6.2-sol-mini", "", false},
		{"llama-3", "", false},
	} {
		_, pattern, ok := tab.Lookup(c.model)
		if pattern != c.pattern || ok != c.ok {
			t.Errorf("Lookup(%q) = %q, %v; want %q, %v", c.model, pattern, ok, c.pattern, c.ok)
		}
	}
}

func TestOverrideReplacesShippedPattern(t *testing.T) {
	t.Parallel()
	tab := NewTable([]Entry{{Pattern: "claude-sonnet-4*", Price: Price{Input: 1, Output: 2}}})
	p, _, _ := tab.Lookup("claude-sonnet-4-20250514")
	if p.Input != 1 || p.Output != 2 {
		t.Errorf("override not applied: %+v", p)
	}
	if n := len(tab.Entries()); n != len(Shipped) {
		t.Errorf("%d entries, want %d (the override replaces the shipped row)", n, len(Shipped))
	}
}

// The cost of a sum is the sum of the costs to within rounding: each
// request is priced on its own and rolled up, and a million requests must
// not drift from pricing their total.
func TestCostAddsUp(t *testing.T) {
	t.Parallel()
	tab := NewTable(nil)
	r := rand.New(rand.NewPCG(1, 2))
	var sum Usage
	var each int64
	n := 10000
	for range n {
		u := Usage{r.Int64N(5000), r.Int64N(2000), r.Int64N(200000), r.Int64N(20000)}
		c, ok := tab.Cost("claude-sonnet-4-5-20250929", u)
		if !ok {
			t.Fatal("sonnet unpriced")
		}
		each += c
		sum.InputTokens += u.InputTokens
		sum.OutputTokens += u.OutputTokens
		sum.CacheReadTokens += u.CacheReadTokens
		sum.CacheCreationTokens += u.CacheCreationTokens
	}
	whole, _ := tab.Cost("claude-sonnet-4-5-20250929", sum)
	if d := each - whole; d > int64(n) || d < -int64(n) {
		t.Errorf("summed costs %d n$, cost of the sum %d n$: more than a nano-dollar a request apart", each, whole)
	}
	// 1M input tokens of Sonnet is $3.
	if c, _ := tab.Cost("claude-sonnet-4-5", Usage{InputTokens: 1_000_000}); c != 3_000_000_000 {
		t.Errorf("1M sonnet input = %d n$, want 3e9", c)
	}
	// A cache read of the cheapest price is still a whole nano-dollar count.
	if c, _ := tab.Cost("claude-haiku-5-5", Usage{CacheReadTokens: 1000}); c != 10_000 {
		t.Errorf("1000 haiku 5.5 cache reads = %d n$, want 10000", c)
	}
}
