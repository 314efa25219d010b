package controlplane

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/modelpattern"
	"github.com/weirhq/weir/internal/pricing"
)

// maxStandingModels bounds KeyStandingRequest.models: an allowlist holds
// at most maxKeyModels patterns, and a worker asks for one model.
const maxStandingModels = maxKeyModels

// standingSurfaces are the surfaces a key's standing covers, in the order
// it lists them.
var standingSurfaces = []weirv1.Surface{weirv1.Surface_SURFACE_MESSAGES, weirv1.Surface_SURFACE_RESPONSES,
	weirv1.Surface_SURFACE_CHAT_COMPLETIONS}

// claudeFamilies are the families a key allowed any model is told of on
// the Messages surface: each has gates of its own.
var claudeFamilies = []string{"opus", "sonnet", "haiku"}

// KeyStanding answers a key's own standing: its usage and budgets, and the
// pool's verdict and windows for each model it may use, from routing's own
// reading of the pool (routingView, policy.Route, policy.QuotaBlock,
// policy.PoolWindows) under the key's pins and metered setting. It names
// no account.
func (l leaseService) KeyStanding(ctx context.Context, req *connect.Request[weirv1.KeyStandingRequest]) (*connect.Response[weirv1.KeyStandingResponse], error) {
	m := req.Msg
	if len(m.Models) > maxStandingModels {
		return nil, invalidf("models: at most %d", maxStandingModels)
	}
	for i, sf := range m.Surfaces {
		if !slices.Contains(standingSurfaces, sf) {
			return nil, invalidf("surfaces[%d]: not a surface", i)
		}
	}
	key, err := l.q.ActiveKeyByHash(ctx, m.KeyHash)
	if err != nil {
		if errors.Is(storeErr(err), ErrNotFound) {
			return nil, connect.NewError(connect.CodePermissionDenied, errKeyRejected)
		}
		return nil, err
	}
	for _, model := range m.Models {
		if !modelpattern.Match(key.AllowedModels, model) {
			return nil, modelNotAllowed(model)
		}
	}
	st, err := l.settings.effective(ctx)
	if err != nil {
		return nil, err
	}
	now := l.now()
	out := &weirv1.KeyStandingResponse{AsOf: timestamppb.New(now), TimeZone: st.BudgetTimeZone}
	if !m.PoolOnly {
		if out.Usage, err = l.keyUsage(ctx, key.ID, now, st.BudgetTimeZone); err != nil {
			return nil, err
		}
		if out.Budgets, err = l.keyBudgets(ctx, key.ID, now); err != nil {
			return nil, err
		}
	}
	if out.Models, err = l.modelStandings(ctx, m, key.AllowedModels, enumName(st.MeteredAccounts), enumName(st.OwnedAccounts), now); err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// usagePeriod is one period a key's usage is summed over.
type usagePeriod struct {
	name       string
	start, end time.Time
}

// usagePeriods are the day, the week (from Monday, as budgets' weeks) and
// the month now is in, in zone tz (UTC when it does not load). Pure.
func usagePeriods(now time.Time, tz string) []usagePeriod {
	loc, err := time.LoadLocation(tz)
	if err != nil {
		loc = time.UTC
	}
	l := now.In(loc)
	day := time.Date(l.Year(), l.Month(), l.Day(), 0, 0, 0, 0, loc)
	week := day.AddDate(0, 0, -((int(day.Weekday()) + 6) % 7))
	month := time.Date(l.Year(), l.Month(), 1, 0, 0, 0, 0, loc)
	out := []usagePeriod{{name: "day", start: day}, {name: "week", start: week}, {name: "month", start: month}}
	for i := range out {
		out[i].end = periodEnd(out[i].start, out[i].name, tz)
	}
	return out
}

// keyUsage sums the key's hourly rollup over its day, week and month: one
// query. A period that begins mid-hour (a zone half an hour off UTC)
// takes that hour whole.
func (l leaseService) keyUsage(ctx context.Context, keyID uuid.UUID, now time.Time, tz string) ([]*weirv1.KeyUsagePeriod, error) {
	periods := usagePeriods(now, tz)
	starts := make([]time.Time, len(periods))
	for i, p := range periods {
		starts[i] = p.start.Truncate(time.Hour)
	}
	rows, err := l.q.KeyUsageSince(ctx, db.KeyUsageSinceParams{Starts: starts, KeyID: keyID, Until: now})
	if err != nil {
		return nil, err
	}
	out := make([]*weirv1.KeyUsagePeriod, len(periods))
	for i, p := range periods {
		out[i] = &weirv1.KeyUsagePeriod{Period: p.name, Start: timestamppb.New(p.start), ResetsAt: timestamppb.New(p.end)}
	}
	for _, r := range rows {
		i := int(r.N) - 1
		if i < 0 || i >= len(out) {
			continue
		}
		u := out[i]
		u.Requests, u.InputTokens, u.OutputTokens = r.Requests, r.InputTokens, r.OutputTokens
		u.CacheReadTokens, u.CacheCreationTokens, u.ReasoningTokens = r.CacheReadTokens, r.CacheCreationTokens, r.ReasoningTokens
		u.CostUsd, u.UnpricedTokens = pricing.USD(r.CostNanoUsd), r.UnpricedTokens
	}
	return out, nil
}

// keyBudgets are the key's budgets and its team's with their current
// periods' spend (a session cap: its limit alone, every session having
// its own spend).
func (l leaseService) keyBudgets(ctx context.Context, keyID uuid.UUID, now time.Time) ([]*weirv1.Budget, error) {
	rows, err := l.q.KeyBudgets(ctx, db.KeyBudgetsParams{KeyID: keyID, Now: now})
	if err != nil {
		return nil, err
	}
	out := make([]*weirv1.Budget, 0, len(rows))
	for _, r := range rows {
		scope, name := "key", r.KeyName
		if r.TeamID.Valid {
			scope, name = "team", r.TeamName
		}
		out = append(out, budgetProto(scope, name, r.Unit, r.Period, r.Amount, r.SpentTokens, r.SpentNanoUsd, r.PeriodStart, r.TimeZone))
	}
	return out, nil
}

// standingEntry is one model (or pattern, or family) a key's standing
// answers for.
type standingEntry struct {
	model, family string
	// targets are what routing would serve it as: an alias's targets the
	// key may use, else the model itself; translate, whether the alias
	// serves targets of the other wire (as that wire's surface).
	targets   []string
	translate bool
	// surfaces, when set, are the only surfaces it is answered on.
	surfaces []weirv1.Surface
}

// standingEntries are the models a standing answers for: those asked
// (an alias resolved as Acquire resolves it), else the key's allowlist
// patterns, else, for a key allowed any model, each Claude family on
// Messages (each is gated on its own) and any model on the other
// surfaces.
func (l leaseService) standingEntries(ctx context.Context, m *weirv1.KeyStandingRequest, allowed []string) ([]standingEntry, error) {
	var out []standingEntry
	switch {
	case len(m.Models) > 0:
		for _, model := range m.Models {
			row, err := l.q.ActiveKeyAndAlias(ctx, db.ActiveKeyAndAliasParams{KeyHash: m.KeyHash, Model: model})
			if err != nil {
				if errors.Is(storeErr(err), ErrNotFound) {
					return nil, connect.NewError(connect.CodePermissionDenied, errKeyRejected)
				}
				return nil, err
			}
			e := standingEntry{model: model, family: policy.ModelFamily(model), targets: []string{model}}
			if model != "" && row.AliasTargets != nil {
				e.targets, e.translate = nil, row.AliasTranslate
				for _, t := range row.AliasTargets {
					if modelpattern.Match(allowed, t) {
						e.targets = append(e.targets, t)
					}
				}
			}
			out = append(out, e)
		}
	case len(allowed) > 0:
		for _, p := range allowed {
			f := patternFamily(p)
			out = append(out, standingEntry{model: p, family: f, targets: []string{p}})
		}
	default:
		for _, f := range claudeFamilies {
			out = append(out, standingEntry{model: "*", family: f, targets: []string{f},
				surfaces: []weirv1.Surface{weirv1.Surface_SURFACE_MESSAGES}})
		}
		out = append(out, standingEntry{model: "*", targets: []string{""},
			surfaces: []weirv1.Surface{weirv1.Surface_SURFACE_RESPONSES, weirv1.Surface_SURFACE_CHAT_COMPLETIONS}})
	}
	return out, nil
}

// patternFamily is the family of an allowlist pattern: a Claude family
// when it names one, an exact model's own, else none (a prefix stands for
// many models, and no gate is kept for a prefix).
func patternFamily(p string) string {
	f := policy.ModelFamily(p)
	if strings.HasSuffix(p, "*") && !slices.Contains(claudeFamilies, f) {
		return ""
	}
	return f
}

// modelStandings gives each entry's standing on each surface the request
// names, or on every surface an account of the key's pool serves (a
// surface asked for is answered even when none does). One routing view is
// read per family.
func (l leaseService) modelStandings(ctx context.Context, m *weirv1.KeyStandingRequest, allowed []string, meteredSetting, ownedSetting string, now time.Time) ([]*weirv1.ModelStanding, error) {
	entries, err := l.standingEntries(ctx, m, allowed)
	if err != nil {
		return nil, err
	}
	row, err := l.q.ActiveKeyAndAlias(ctx, db.ActiveKeyAndAliasParams{KeyHash: m.KeyHash})
	if err != nil {
		if errors.Is(storeErr(err), ErrNotFound) {
			return nil, connect.NewError(connect.CodePermissionDenied, errKeyRejected)
		}
		return nil, err
	}
	kg := keyGrant{id: row.KeyID, models: row.AllowedModels, pinned: row.Pinned, pins: row.Pins}.
		withMetered(orZero(row.MeteredAccounts), meteredSetting).withOwned(row.TeamID.UUID, ownedSetting)
	surfaces, asked := m.Surfaces, len(m.Surfaces) > 0
	if !asked {
		surfaces = standingSurfaces
	}
	views := map[string][]policy.Candidate{}
	candsFor := func(family string) ([]policy.Candidate, error) {
		if c, ok := views[family]; ok {
			return c, nil
		}
		v, err := l.routingView(ctx, "", "", "", family, waiter{}, now)
		if err != nil {
			return nil, err
		}
		views[family] = v.pool(kg)
		return views[family], nil
	}
	var out []*weirv1.ModelStanding
	for _, e := range entries {
		cands, err := candsFor(e.family)
		if err != nil {
			return nil, err
		}
		// Each target is routed over its own family's view, as Acquire
		// routes an alias's targets.
		targets := make([][]policy.Candidate, len(e.targets))
		for i, t := range e.targets {
			if targets[i], err = candsFor(policy.ModelFamily(t)); err != nil {
				return nil, err
			}
		}
		for _, sf := range surfaces {
			if e.surfaces != nil && !slices.Contains(e.surfaces, sf) {
				continue
			}
			ms := modelStanding(e, cands, targets, kg, sf, now)
			if !asked && len(ms.Providers) == 0 {
				continue // no account of the key's pool serves the surface
			}
			out = append(out, ms)
		}
	}
	return out, nil
}

// modelStanding is routing's verdict for e on sf without leasing
// anything: available when policy.Route orders any account for one of
// e's targets (each over its own family's view, targets), else the answer
// Acquire would give (for an alias, aliasNoAccount's); with the
// providers and the pooled windows of cands, the key's pool read for e's
// family (for an alias that translates, those of the other wire's pool
// that serves it). An open overload breaker is not weighed: it closes within
// seconds, and Acquire's probe decides whether it does. Pure.
func modelStanding(e standingEntry, cands []policy.Candidate, targets [][]policy.Candidate, kg keyGrant, sf weirv1.Surface, now time.Time) *weirv1.ModelStanding {
	ms := &weirv1.ModelStanding{Model: e.model, Family: e.family, Surface: sf}
	// The pool a client draws on is that of the target that would serve
	// it (else of the first it could be routed to): for an alias that
	// translates onto the other wire, that wire's accounts.
	pool, poolCands, pooled := sf, cands, false
	var nones []*weirv1.NoAccount
	for i, t := range e.targets {
		tsf, ok := policy.TargetSurface(sf, t, e.translate)
		if !ok {
			continue // never routed on this surface
		}
		// A target across the wires is read over its own family's view;
		// otherwise the entry's, as ever.
		tc := cands
		if tsf != sf {
			tc = targets[i]
		}
		if !pooled {
			pool, poolCands, pooled = tsf, tc, true
		}
		rr := kg.route(policy.RouteRequest{Surface: tsf})
		rr.Model = t
		if _, none := policy.Route(targets[i], rr, now); none != nil {
			nones = append(nones, none)
			continue
		}
		pool, poolCands, ms.Available = tsf, tc, true
		break
	}
	base := kg.route(policy.RouteRequest{Surface: pool})
	ms.Providers = policy.ProvidersServing(poolCands, base)
	five, week := policy.PoolWindows(poolCands, base, now)
	ms.FiveHour, ms.SevenDay = pooledProto(five), pooledProto(week)
	switch {
	case ms.Available:
	case len(nones) == 0:
		// An alias none of whose targets the key may use, or none this
		// surface serves.
		ms.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED
	default:
		none := aliasNoAccount(nones)
		ms.Reason, ms.AvailableAt, ms.OutOfQuota = none.Reason, none.RetryAt, none.QuotaBlock != nil
		if none.QuotaBlock != nil && none.QuotaBlock.ResetsAt != nil && ms.AvailableAt == nil {
			ms.AvailableAt = none.QuotaBlock.ResetsAt
		}
	}
	return ms
}

// pooledProto is a pooled window as the API states it: a percentage.
func pooledProto(w *policy.PooledWindow) *weirv1.PooledWindow {
	if w == nil {
		return nil
	}
	out := &weirv1.PooledWindow{UsedPercent: math.Round(w.Utilization*10000) / 100, Accounts: int32(w.Accounts), Readings: int32(w.Readings)}
	if !w.ResetsAt.IsZero() {
		out.ResetsAt = timestamppb.New(w.ResetsAt)
	}
	return out
}
