package controlplane

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/pricing"
)

// maxSessionKeyLen bounds a route event's session key: a worker hashes
// longer ones (dataplane/proxy.go sessionKey).
const maxSessionKeyLen = 256

// attemptUse is what one attempt used, on which account, as which model.
type attemptUse struct {
	account uuid.UUID
	model   string
	usage   *weirv1.TokenUsage
}

// usesOf is what a request's attempts used. An event from a worker that
// reports no attempt's usage (an older release) counts its totals on the
// account that served its last attempt.
func usesOf(e *weirv1.RouteEvent) []attemptUse {
	var uses []attemptUse
	for _, a := range e.GetAttemptRecords() {
		if a.GetUsage() == nil {
			continue
		}
		model := a.GetModel()
		if model == "" {
			model = e.GetModel()
		}
		id, _ := uuid.Parse(a.GetAccountId()) // the nil uuid when it is not one
		uses = append(uses, attemptUse{account: id, model: model, usage: a.GetUsage()})
	}
	if uses == nil && (e.GetInputTokens() > 0 || e.GetOutputTokens() > 0) {
		id, _ := uuid.Parse(e.GetAccountId())
		uses = []attemptUse{{account: id, model: e.GetModel(),
			usage: &weirv1.TokenUsage{InputTokens: e.GetInputTokens(), OutputTokens: e.GetOutputTokens()}}}
	}
	return uses
}

// checkUsage refuses what no upstream reports: negative counts, reasoning
// beyond the output it is part of.
func checkUsage(field string, u *weirv1.TokenUsage) error {
	if u == nil {
		return nil
	}
	if u.InputTokens < 0 || u.OutputTokens < 0 || u.CacheReadTokens < 0 || u.CacheCreationTokens < 0 || u.ReasoningTokens < 0 {
		return invalidf("%s: token counts must not be negative", field)
	}
	return nil
}

// servedModel is the model a request's last attempt was sent upstream
// as: its requests are counted under it.
func servedModel(e *weirv1.RouteEvent) string {
	recs := e.GetAttemptRecords()
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].GetAccountId() != "" {
			if m := recs[i].GetModel(); m != "" {
				return m
			}
			break
		}
	}
	return e.GetModel()
}

// usageKey is one row of the hourly rollup.
type usageKey struct {
	hour           time.Time
	key, account   uuid.UUID
	model, session string
}

// usageSum is a rollup row's counts.
type usageSum struct {
	requests, input, output, cacheRead, cacheCreation, reasoning, nano, unpriced int64
}

func (s *usageSum) add(u *weirv1.TokenUsage, nano int64, priced bool) {
	s.input += u.GetInputTokens()
	s.output += u.GetOutputTokens()
	s.cacheRead += u.GetCacheReadTokens()
	s.cacheCreation += u.GetCacheCreationTokens()
	s.reasoning += u.GetReasoningTokens()
	s.nano += nano
	if !priced {
		s.unpriced += u.GetInputTokens() + u.GetOutputTokens() + u.GetCacheReadTokens() + u.GetCacheCreationTokens()
	}
}

func priceUsage(u *weirv1.TokenUsage) pricing.Usage {
	return pricing.Usage{InputTokens: u.GetInputTokens(), OutputTokens: u.GetOutputTokens(),
		CacheReadTokens: u.GetCacheReadTokens(), CacheCreationTokens: u.GetCacheCreationTokens()}
}

// pricedEvent is a final event's usage priced: its totals, its cost, and
// its attempts' parts for the rollup.
type pricedEvent struct {
	total usageSum // the request's own (requests unused)
	uses  []attemptUse
	costs []int64
	known []bool
}

// price prices e's attempts with tab.
func price(tab *pricing.Table, e *weirv1.RouteEvent) pricedEvent {
	p := pricedEvent{uses: usesOf(e)}
	for _, u := range p.uses {
		nano, ok := tab.Cost(u.model, priceUsage(u.usage))
		p.costs = append(p.costs, nano)
		p.known = append(p.known, ok)
		p.total.add(u.usage, nano, ok)
	}
	return p
}

// usageRollup gathers a batch's rows of the hourly rollup.
type usageRollup struct {
	at   map[usageKey]int
	keys []usageKey
	sums []usageSum
}

func (r *usageRollup) row(k usageKey) *usageSum {
	if r.at == nil {
		r.at = map[usageKey]int{}
	}
	i, ok := r.at[k]
	if !ok {
		i = len(r.keys)
		r.at[k] = i
		r.keys = append(r.keys, k)
		r.sums = append(r.sums, usageSum{})
	}
	return &r.sums[i]
}

// add counts one final event: each attempt's usage on its account and
// model, and the request once on its last attempt's account.
func (r *usageRollup) add(row db.RouteEvent, e *weirv1.RouteEvent, p pricedEvent) {
	hour := row.StartedAt.UTC().Truncate(time.Hour)
	base := usageKey{hour: hour, key: row.KeyID.UUID, session: row.SessionKey}
	for i, u := range p.uses {
		k := base
		k.account, k.model = u.account, u.model
		r.row(k).add(u.usage, p.costs[i], p.known[i])
	}
	k := base
	k.account, k.model = row.AccountID.UUID, servedModel(e)
	r.row(k).requests++
}

// params lays the rollup out as AddUsageHourly's columns.
func (r *usageRollup) params() db.AddUsageHourlyParams {
	n := len(r.keys)
	p := db.AddUsageHourlyParams{
		Hours: make([]time.Time, n), KeyIds: make([]uuid.UUID, n), AccountIds: make([]uuid.UUID, n),
		Models: make([]string, n), SessionKeys: make([]string, n), Requests: make([]int64, n),
		InputTokens: make([]int64, n), OutputTokens: make([]int64, n), CacheReadTokens: make([]int64, n),
		CacheCreationTokens: make([]int64, n), ReasoningTokens: make([]int64, n), CostsNanoUsd: make([]int64, n),
		UnpricedTokens: make([]int64, n),
	}
	for i, k := range r.keys {
		s := r.sums[i]
		p.Hours[i], p.KeyIds[i], p.AccountIds[i], p.Models[i], p.SessionKeys[i] = k.hour, k.key, k.account, k.model, k.session
		p.Requests[i], p.InputTokens[i], p.OutputTokens[i] = s.requests, s.input, s.output
		p.CacheReadTokens[i], p.CacheCreationTokens[i], p.ReasoningTokens[i] = s.cacheRead, s.cacheCreation, s.reasoning
		p.CostsNanoUsd[i], p.UnpricedTokens[i] = s.nano, s.unpriced
	}
	return p
}

// priceTable is the shipped price table under the operator's prices.
func priceTable(ctx context.Context, q *db.Queries) (*pricing.Table, error) {
	rows, err := q.ListModelPrices(ctx)
	if err != nil {
		return nil, fmt.Errorf("read model prices: %w", err)
	}
	return pricing.NewTable(priceEntries(rows)), nil
}

// pricesFresh is how long a replica prices route events with the table it
// read: an operator's price applies on this replica at once (SetPrice
// drops it) and on the others within this, instead of a read per batch.
const pricesFresh = 5 * time.Second

// priceCache is this replica's price table, read again when it is older
// than pricesFresh or an operator changed a price here.
type priceCache struct {
	mu     sync.Mutex
	now    func() time.Time
	tab    *pricing.Table
	readAt time.Time
}

func (c *priceCache) get(ctx context.Context, q *db.Queries) (*pricing.Table, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := c.now(); c.tab == nil || now.Sub(c.readAt) >= pricesFresh || now.Before(c.readAt) {
		tab, err := priceTable(ctx, q)
		if err != nil {
			return nil, err
		}
		c.tab, c.readAt = tab, now
	}
	return c.tab, nil
}

// drop makes the next get read the table again.
func (c *priceCache) drop() {
	c.mu.Lock()
	c.tab = nil
	c.mu.Unlock()
}

func priceEntries(rows []db.ModelPrice) []pricing.Entry {
	out := make([]pricing.Entry, len(rows))
	for i, r := range rows {
		out[i] = pricing.Entry{Pattern: r.Pattern, Price: pricing.Price{Input: r.InputUsd, Output: r.OutputUsd,
			CacheRead: r.CacheReadUsd, CacheWrite: r.CacheWriteUsd}}
	}
	return out
}
