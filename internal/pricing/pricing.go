// Package pricing prices token usage at API-equivalent list prices: what
// a request would have cost on the provider's metered API, so that a team
// sees what its subscriptions are worth and what its metered keys cost.
//
// The table below is dated (AsOf) and follows the providers' published
// price pages (docs/pricing.md names them); an operator overrides any
// model, or adds one, with `weir prices set`. A model neither knows is
// priced at zero and its tokens are counted as unpriced.
package pricing

import (
	"math"
	"strings"
)

// AsOf is the day the shipped table was checked against the providers'
// price pages.
const AsOf = "2026-12-01"

// Price is a model's price in US dollars per million tokens.
type Price struct {
	Input      float64
	Output     float64
	CacheRead  float64
	CacheWrite float64
}

// Entry prices every model Pattern matches: an exact id, or a prefix
// ending in "*".
type Entry struct {
	Pattern string
	Price   Price
}

// Usage is what is priced, in weir.v1.TokenUsage's vocabulary
// (InputTokens excludes cache reads and writes; output includes
// reasoning).
type Usage struct {
	InputTokens, OutputTokens, CacheReadTokens, CacheCreationTokens int64
}

// anthropic builds an Anthropic row: a cache write (the five-minute
// lifetime) costs 1.25× input.
func anthropic(pattern string, input, cacheRead, output float64) Entry {
	return Entry{pattern, Price{Input: input, Output: output, CacheRead: cacheRead, CacheWrite: input * 1.25}}
}

// openai builds an OpenAI row: cached input is read at its own price, and
// OpenAI charges nothing to write its cache.
func openai(pattern string, input, cached, output float64) Entry {
	return Entry{pattern, Price{Input: input, Output: output, CacheRead: cached}}
}

// Shipped is the table weir ships, most specific first (Lookup takes the
// longest matching pattern, so the order is for reading).
var Shipped = []Entry{
	anthropic("claude-fable-5-2*", 8, 0.20, 40),
	anthropic("claude-mythos-5-2*", 8, 0.20, 40),
	anthropic("claude-fable-5-1*", 10, 0.25, 50),
	anthropic("claude-mythos-5-1*", 10, 0.25, 50),
	anthropic("claude-fable-5*", 10, 1, 50),
	anthropic("claude-mythos-5*", 10, 1, 50),
	anthropic("claude-opus-5-5*", 4, 0.20, 20),
	anthropic("claude-opus-5*", 5, 0.50, 25),
	anthropic("claude-opus-4-8*", 5, 0.50, 25),
	anthropic("claude-opus-4-7*", 5, 0.50, 25),
	anthropic("claude-opus-4-6*", 5, 0.50, 25),
	anthropic("claude-opus-4-5*", 5, 0.50, 25),
	anthropic("claude-opus-4*", 15, 1.50, 75),
	anthropic("claude-3-opus*", 15, 1.50, 75),
	anthropic("claude-sonnet-5-5*", 2, 0.10, 10),
	anthropic("claude-sonnet-5*", 2, 0.20, 10),
	anthropic("claude-sonnet-4*", 3, 0.30, 15),
	anthropic("claude-3-7-sonnet*", 3, 0.30, 15),
	anthropic("claude-haiku-5-5*", 0.10, 0.01, 0.50),
	anthropic("claude-haiku-4*", 1, 0.10, 5),
	anthropic("claude-3-5-haiku*", 0.80, 0.08, 4),
	openai("gpt-5.5*", 5, 0.50, 30),
	openai("gpt-5.4-mini*", 0.75, 0.075, 4.52),
	openai("gpt-5.4*", 2.50, 0.25, 15),
	openai("gpt-5.3-codex*", 1.75, 0.175, 14),
	openai("gpt-5.2*", 1.75, 0.175, 14),
	openai("gpt-5.1*", 1.25, 0.125, 10),
	openai("gpt-5-mini*", 0.25, 0.025, 2),
	openai("gpt-5-nano*", 0.05, 0.005, 0.40),
	openai("gpt-5*", 1.25, 0.125, 10),
}

// Table is the shipped table with an operator's entries over it.
type Table struct {
	entries []Entry
}

// NewTable is Shipped with overrides taking precedence over any shipped
// entry of the same pattern; between different patterns the longest
// match wins, so an override of "claude-sonnet-4-5*" beats the shipped
// "claude-sonnet-4*".
func NewTable(overrides []Entry) *Table {
	t := &Table{entries: make([]Entry, 0, len(Shipped)+len(overrides))}
	over := make(map[string]bool, len(overrides))
	for _, e := range overrides {
		over[e.Pattern] = true
		t.entries = append(t.entries, e)
	}
	for _, e := range Shipped {
		if !over[e.Pattern] {
			t.entries = append(t.entries, e)
		}
	}
	return t
}

// Lookup finds model's price: the entry whose pattern matches it exactly,
// else the longest prefix pattern that does. ok is false for a model no
// entry prices.
func (t *Table) Lookup(model string) (p Price, pattern string, ok bool) {
	best := -1
	for _, e := range t.entries {
		if e.Pattern == model {
			return e.Price, e.Pattern, true
		}
		if prefix, wild := strings.CutSuffix(e.Pattern, "*"); wild && strings.HasPrefix(model, prefix) && len(prefix) > best {
			best, p, pattern = len(prefix), e.Price, e.Pattern
		}
	}
	return p, pattern, best >= 0
}

// Entries is the table in effect, overrides first.
func (t *Table) Entries() []Entry { return t.entries }

// NanoUSD is u's cost at p in billionths of a dollar, rounded to the
// nearest: a price per million tokens is thousandths of a nano-dollar per
// token, so sums of whole nano-dollars stay exact.
func (p Price) NanoUSD(u Usage) int64 {
	c := float64(u.InputTokens)*p.Input + float64(u.OutputTokens)*p.Output +
		float64(u.CacheReadTokens)*p.CacheRead + float64(u.CacheCreationTokens)*p.CacheWrite
	return int64(math.Round(c * 1000)) // $/Mtok × tokens = µ$; ×1000 = n$
}

// Cost prices u as model: its cost in nano-dollars, and whether the model
// had a price (an unpriced model costs zero).
func (t *Table) Cost(model string, u Usage) (nano int64, priced bool) {
	p, _, ok := t.Lookup(model)
	if !ok {
		return 0, false
	}
	return p.NanoUSD(u), true
}

// USD turns nano-dollars into dollars for display.
func USD(nano int64) float64 { return float64(nano) / 1e9 }
