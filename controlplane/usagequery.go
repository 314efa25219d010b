package controlplane

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/pricing"
)

// usageService reads the usage rollup (usage_hourly) and keeps the price
// table.
type usageService struct {
	weirv1connect.UnimplementedUsageServiceHandler
	store
	now func() time.Time
	// sessionTTL is how long an idle session stays bound to its account
	// (Config.SessionTTL): a later request's move is its binding lapsing.
	sessionTTL time.Duration
	// prices is this replica's price table, dropped when a price changes.
	prices *priceCache
}

// usageGroupings are QueryUsageRequest.group_by's names.
var usageGroupings = []string{"key", "account", "model", "session", "day", "hour"}

// Bounds on a usage query: a range of more than ten years reads nothing
// a retention keeps, and a page of rows is enough for a terminal.
const (
	defaultUsageRows = 1000
	maxUsageRows     = 10000
	maxUsageRange    = 10 * 366 * 24 * time.Hour
)

func (u usageService) QueryUsage(ctx context.Context, req *connect.Request[weirv1.QueryUsageRequest]) (*connect.Response[weirv1.QueryUsageResponse], error) {
	m := req.Msg
	p := db.QueryUsageParams{Tz: "UTC", MaxRows: defaultUsageRows}
	for _, g := range m.GetGroupBy() {
		switch strings.ToLower(strings.TrimSpace(g)) {
		case "key":
			p.ByKey = true
		case "account":
			p.ByAccount = true
		case "model":
			p.ByModel = true
		case "session":
			p.BySession = true
		case "day":
			p.ByDay = true
		case "hour":
			p.ByHour = true
		default:
			return nil, invalidf("group_by: %q is not one of %s", g, strings.Join(usageGroupings, ", "))
		}
	}
	if p.ByDay && p.ByHour {
		return nil, invalidf("group_by: day or hour, not both")
	}
	switch l := m.GetLimit(); {
	case l < 0:
		return nil, invalidf("limit: must not be negative")
	case l > maxUsageRows:
		p.MaxRows = maxUsageRows
	case l > 0:
		p.MaxRows = l
	}
	if tz := m.GetTimeZone(); tz != "" {
		if _, err := time.LoadLocation(tz); err != nil {
			return nil, invalidf("time_zone: %q is not an IANA time zone", tz)
		}
		p.Tz = tz
	}
	var err error
	if p.Since, p.Until, err = timeRange(m.GetSince(), m.GetUntil(), u.now()); err != nil {
		return nil, err
	}
	switch {
	case p.Until.Sub(p.Since) > maxUsageRange:
		return nil, invalidf("since: at most ten years before until")
	}
	// The rollup is by the hour: a range starting mid-hour takes the hour
	// it starts in whole.
	p.Since = p.Since.Truncate(time.Hour)
	if ref := m.GetKey(); ref != "" {
		k, err := u.findKey(ctx, ref)
		if err != nil {
			return nil, err
		}
		p.KeyID = uuid.NullUUID{UUID: k.ID, Valid: true}
	}
	rows, err := u.q.QueryUsage(ctx, p)
	if err != nil {
		return nil, err
	}
	names, err := u.names(ctx)
	if err != nil {
		return nil, err
	}
	out := &weirv1.QueryUsageResponse{PricesAsOf: pricing.AsOf, Rows: make([]*weirv1.UsageRow, 0, len(rows))}
	for _, r := range rows {
		row := &weirv1.UsageRow{
			Model: r.Model, SessionKey: r.SessionKey, Requests: r.Requests,
			InputTokens: r.InputTokens, OutputTokens: r.OutputTokens, CacheReadTokens: r.CacheReadTokens,
			CacheCreationTokens: r.CacheCreationTokens, ReasoningTokens: r.ReasoningTokens,
			CostUsd: pricing.USD(r.CostNanoUsd), UnpricedTokens: r.UnpricedTokens,
			CacheHitRatio: hitRatio(r.InputTokens, r.CacheReadTokens, r.CacheCreationTokens),
		}
		if p.ByKey && r.KeyID != uuid.Nil {
			row.KeyId, row.KeyName = r.KeyID.String(), names.keys[r.KeyID]
		}
		if p.ByAccount && r.AccountID != uuid.Nil {
			row.AccountId, row.AccountLabel = r.AccountID.String(), names.accounts[r.AccountID]
		}
		if p.ByDay || p.ByHour {
			row.PeriodStart = timestamppb.New(r.PeriodStart)
		}
		out.HasUnpriced = out.HasUnpriced || r.UnpricedTokens > 0
		out.Rows = append(out.Rows, row)
	}
	return connect.NewResponse(out), nil
}

// hitRatio is the share of all input read from the prompt cache.
func hitRatio(input, cacheRead, cacheCreation int64) float64 {
	all := input + cacheRead + cacheCreation
	if all <= 0 {
		return 0
	}
	return math.Round(float64(cacheRead)/float64(all)*10000) / 10000
}

// usageNames names the keys and accounts a usage answer mentions; a
// deleted one keeps its id alone.
type usageNames struct {
	keys     map[uuid.UUID]string
	accounts map[uuid.UUID]string
}

func (u usageService) names(ctx context.Context) (usageNames, error) {
	n := usageNames{keys: map[uuid.UUID]string{}, accounts: map[uuid.UUID]string{}}
	keys, err := u.q.ListKeys(ctx, true)
	if err != nil {
		return n, err
	}
	for _, k := range keys {
		n.keys[k.ID] = k.Name
	}
	accts, err := u.q.ListAccounts(ctx)
	if err != nil {
		return n, err
	}
	for _, a := range accts {
		n.accounts[a.ID] = a.Label
	}
	return n, nil
}

// Bounds on an operator's price: a pattern is a model id or a prefix, and
// no model costs more than $10,000 per million tokens.
const (
	maxPricePatternLen = 128
	maxPriceUSD        = 10000
)

func (u usageService) ListPrices(ctx context.Context, _ *connect.Request[weirv1.ListPricesRequest]) (*connect.Response[weirv1.ListPricesResponse], error) {
	rows, err := u.q.ListModelPrices(ctx)
	if err != nil {
		return nil, err
	}
	out := &weirv1.ListPricesResponse{AsOf: pricing.AsOf}
	over := map[string]bool{}
	for _, r := range rows {
		over[r.Pattern] = true
		out.Prices = append(out.Prices, modelPriceProto(r))
	}
	for _, e := range pricing.Shipped {
		if !over[e.Pattern] {
			out.Prices = append(out.Prices, &weirv1.ModelPrice{Pattern: e.Pattern, InputUsd: e.Price.Input,
				OutputUsd: e.Price.Output, CacheReadUsd: e.Price.CacheRead, CacheWriteUsd: e.Price.CacheWrite, Shipped: true})
		}
	}
	return connect.NewResponse(out), nil
}

func modelPriceProto(r db.ModelPrice) *weirv1.ModelPrice {
	return &weirv1.ModelPrice{Pattern: r.Pattern, InputUsd: r.InputUsd, OutputUsd: r.OutputUsd,
		CacheReadUsd: r.CacheReadUsd, CacheWriteUsd: r.CacheWriteUsd, UpdatedAt: timestamppb.New(r.UpdatedAt)}
}

func (u usageService) SetPrice(ctx context.Context, req *connect.Request[weirv1.SetPriceRequest]) (*connect.Response[weirv1.SetPriceResponse], error) {
	pr := req.Msg.GetPrice()
	if pr == nil {
		return nil, invalidf("price: required")
	}
	pattern := strings.TrimSpace(pr.GetPattern())
	if pattern == "" || len(pattern) > maxPricePatternLen || strings.ContainsAny(pattern, " \t\n") ||
		strings.Count(pattern, "*") > 1 || (strings.Contains(pattern, "*") && !strings.HasSuffix(pattern, "*")) {
		return nil, invalidf("price.pattern: a model id or a prefix ending in *, at most %d characters", maxPricePatternLen)
	}
	for name, v := range map[string]float64{"input_usd": pr.GetInputUsd(), "output_usd": pr.GetOutputUsd(),
		"cache_read_usd": pr.GetCacheReadUsd(), "cache_write_usd": pr.GetCacheWriteUsd()} {
		if v < 0 || v > maxPriceUSD || math.IsNaN(v) {
			return nil, invalidf("price.%s: dollars per million tokens, 0 to %d", name, maxPriceUSD)
		}
	}
	row, err := u.q.PutModelPrice(ctx, db.PutModelPriceParams{Pattern: pattern, InputUsd: pr.GetInputUsd(),
		OutputUsd: pr.GetOutputUsd(), CacheReadUsd: pr.GetCacheReadUsd(), CacheWriteUsd: pr.GetCacheWriteUsd(), Now: u.now()})
	if err != nil {
		return nil, fmt.Errorf("set price %q: %w", pattern, err)
	}
	u.prices.drop()
	return connect.NewResponse(&weirv1.SetPriceResponse{Price: modelPriceProto(row)}), nil
}

func (u usageService) DeletePrice(ctx context.Context, req *connect.Request[weirv1.DeletePriceRequest]) (*connect.Response[weirv1.DeletePriceResponse], error) {
	n, err := u.q.DeleteModelPrice(ctx, req.Msg.GetPattern())
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no price of the operator's for %q", req.Msg.GetPattern()))
	}
	u.prices.drop()
	return connect.NewResponse(&weirv1.DeletePriceResponse{}), nil
}

// timeRange reads a request's [since, until): until defaults to now,
// since to a day before until, and since must come first.
func timeRange(since, until *timestamppb.Timestamp, now time.Time) (time.Time, time.Time, error) {
	to := now
	if until != nil {
		if until.CheckValid() != nil {
			return time.Time{}, time.Time{}, invalidf("until: not a valid time")
		}
		to = until.AsTime()
	}
	from := to.Add(-24 * time.Hour)
	if since != nil {
		if since.CheckValid() != nil {
			return time.Time{}, time.Time{}, invalidf("since: not a valid time")
		}
		from = since.AsTime()
	}
	if !from.Before(to) {
		return time.Time{}, time.Time{}, invalidf("since: must be before until")
	}
	return from, to, nil
}
