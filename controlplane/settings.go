package controlplane

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/people"
	"github.com/weirhq/weir/controlplane/seal"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/bytesize"
	"github.com/weirhq/weir/internal/egress"
	"github.com/weirhq/weir/internal/quotamode"
)

// Names of the rows in the settings table. Durations are stored as Go
// duration strings ("20m0s"), the modes by their short names
// ("retryable", "usage_limit"; "normal", "last_resort", "never"; "shared",
// "owners_only").
const (
	settingCapacityHold      = "capacity_hold"
	settingUnreachableHold   = "unreachable_hold"
	settingRequestDeadline   = "request_deadline"
	settingQuotaResponseMode = "quota_response_mode"
	settingMeteredAccounts   = "metered_accounts"
	settingOwnedAccounts     = "owned_accounts"
	settingBodyBuffer        = "body_buffer_bytes"
	settingBodyBufferPerKey  = "body_buffer_per_key_bytes"
	settingRouteRetention    = "route_events_retention"
	settingUsageRetention    = "usage_retention"
	settingBudgetTimeZone    = "budget_time_zone"
	settingPoolLow           = "pool_low_accounts"
	settingBreakerNotify     = "breaker_notify_after"
	// settingEgressProxy's value is the default proxy as operators see it
	// (scheme://host:port, "" for none); the whole URL is sealed beside it.
	settingEgressProxy = "egress_proxy"
)

// settingNames are the fields UpdateSettings takes, as errors list them.
const settingNames = "capacity_hold, unreachable_hold, request_deadline, quota_response_mode, metered_accounts, " +
	"body_buffer_bytes, body_buffer_per_key_bytes, route_events_retention, usage_retention, budget_time_zone, " +
	"pool_low_accounts, breaker_notify_after, egress_proxy or owned_accounts"

// settingsActor names who changes settings in their history: the person
// signed in, else "admin" (the admin token's callers declare themselves,
// which the audit log keeps).
func settingsActor(ctx context.Context) string {
	if p, ok := principalOf(ctx); ok && p.credential == people.CredentialOIDC {
		return p.name
	}
	return "admin"
}

// Bounds an operator may set. A deadline under a minute would fail ordinary
// long generations; beyond six hours a request is abandoned, not held.
// capacity_hold may exceed request_deadline: the deadline ends a request's
// holds anyway, so the hold in effect is the smaller of the two, and
// rejecting the pair would only force operators to change them in order.
// unreachable_hold may exceed capacity_hold for the same reason: the
// smaller applies (dataplane/hold.go).
const (
	maxCapacityHold    = 6 * time.Hour
	minRequestDeadline = time.Minute
	maxRequestDeadline = 6 * time.Hour
)

// The body buffer bounds (body_buffer_bytes, body_buffer_per_key_bytes),
// stored as sizes ("1GiB"). Under 1 MiB no agent's request would fit; a
// TiB is more memory than a worker has. A bound below a body's size
// refuses that body for good (a 413), so the defaults sit well above the
// 32 MiB body limit (internal/defaults). The per-key bound may exceed the
// total: the smaller applies.
const (
	minBodyBuffer = 1 << 20
	maxBodyBuffer = 1 << 40
)

// Route events (and refusal counts) are kept route_events_retention, 30
// days unless an operator says otherwise: long enough to explain last
// month's requests, short enough that the table stays a bounded size
// (jobs/retention.go deletes what is older). Under an hour would delete
// what an operator is still looking into; ten years is forever.
const (
	defaultRouteRetention = 30 * 24 * time.Hour
	minRouteRetention     = time.Hour
	maxRouteRetention     = 10 * 365 * 24 * time.Hour
)

// The usage rollup is kept usage_retention, 400 days unless an operator
// says otherwise: a year's comparison with the month before. Under a day
// would delete what today's budgets count.
const (
	defaultUsageRetention = 400 * 24 * time.Hour
	minUsageRetention     = 24 * time.Hour
)

// The notification thresholds (docs/notifications.md). A pool is low when
// 1 to pool_low_accounts of more than that many accounts can serve: 1 by
// default, so that losing the second-to-last account of a pool is news
// before losing the last is; more than 100 would call every ordinary pool
// low. A breaker open breaker_notify_after (5 minutes by default: a storm
// that outlasts the holds' patience, while the short ones the breaker
// rides out on its own stay quiet) is notified; 0 notifies the first
// check that sees it open, a day is the longest wait that still tells.
const (
	defaultPoolLow      = 1
	maxPoolLow          = 100
	defaultBreakerAfter = 5 * time.Minute
	maxBreakerAfter     = 24 * time.Hour
)

type settingsService struct {
	weirv1connect.UnimplementedSettingsServiceHandler
	store
	settings settingsSource
	seal     *seal.Sealer
	now      func() time.Time
	log      *slog.Logger
}

// settingsSource reads the runtime settings: the stored rows over this
// replica's defaults (Config's).
type settingsSource struct {
	q                                              *db.Queries
	capacityHold, unreachableHold, requestDeadline time.Duration
	bodyBuffer, bodyBufferPerKey                   int64
}

func newSettingsSource(q *db.Queries, cfg Config) settingsSource {
	return settingsSource{q: q, capacityHold: cfg.CapacityHold, unreachableHold: cfg.UnreachableHold,
		requestDeadline: cfg.RequestDeadline, bodyBuffer: cfg.BodyBuffer, bodyBufferPerKey: cfg.BodyBufferPerKey}
}

func (h settingsService) GetSettings(ctx context.Context, _ *connect.Request[weirv1.GetSettingsRequest]) (*connect.Response[weirv1.GetSettingsResponse], error) {
	st, err := h.settings.effective(ctx)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&weirv1.GetSettingsResponse{Settings: st}), nil
}

func (h settingsService) UpdateSettings(ctx context.Context, req *connect.Request[weirv1.UpdateSettingsRequest]) (*connect.Response[weirv1.UpdateSettingsResponse], error) { //nolint:gocognit // the update mask applied setting by setting, each a small case of its own
	m := req.Msg
	paths := m.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		return nil, invalidf("update_mask: name at least one field (%s)", settingNames)
	}
	now := h.now()
	// Every field is checked before anything is written: a request with one
	// bad value changes nothing.
	puts := make([]db.PutSealedSettingParams, 0, len(paths))
	named := map[string]bool{}
	for _, path := range paths {
		if named[path] {
			return nil, invalidf("update_mask: %q is named more than once", path)
		}
		named[path] = true
		var value string
		var sealed []byte
		switch path {
		case settingCapacityHold:
			d, err := durationSetting("settings.capacity_hold", m.GetSettings().GetCapacityHold(), 0, maxCapacityHold)
			if err != nil {
				return nil, err
			}
			value = d.String()
		case settingUnreachableHold:
			d, err := durationSetting("settings.unreachable_hold", m.GetSettings().GetUnreachableHold(), 0, maxCapacityHold)
			if err != nil {
				return nil, err
			}
			value = d.String()
		case settingRequestDeadline:
			d, err := durationSetting("settings.request_deadline", m.GetSettings().GetRequestDeadline(), minRequestDeadline, maxRequestDeadline)
			if err != nil {
				return nil, err
			}
			value = d.String()
		case settingRouteRetention:
			d, err := durationSetting("settings.route_events_retention", m.GetSettings().GetRouteEventsRetention(), minRouteRetention, maxRouteRetention)
			if err != nil {
				return nil, err
			}
			value = d.String()
		case settingUsageRetention:
			d, err := durationSetting("settings.usage_retention", m.GetSettings().GetUsageRetention(), minUsageRetention, maxRouteRetention)
			if err != nil {
				return nil, err
			}
			value = d.String()
		case settingBreakerNotify:
			d, err := durationSetting("settings.breaker_notify_after", m.GetSettings().GetBreakerNotifyAfter(), 0, maxBreakerAfter)
			if err != nil {
				return nil, err
			}
			value = d.String()
		case settingBudgetTimeZone:
			tz := m.GetSettings().GetBudgetTimeZone()
			if _, err := time.LoadLocation(tz); err != nil || tz == "" || tz == "Local" {
				return nil, invalidf("settings.budget_time_zone: %q is not an IANA time zone (for example UTC or Europe/Berlin)", tz)
			}
			value = tz
		case settingPoolLow:
			n := m.GetSettings().GetPoolLowAccounts()
			if n < 0 || n > maxPoolLow {
				return nil, invalidf("settings.pool_low_accounts: %d is out of range; must be between 0 and %d", n, maxPoolLow)
			}
			value = strconv.Itoa(int(n))
		case settingQuotaResponseMode:
			mode, err := enumSetting("settings.quota_response_mode", m.GetSettings().GetQuotaResponseMode(),
				weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_RETRYABLE, weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
			if err != nil {
				return nil, err
			}
			value = mode
		case settingMeteredAccounts:
			mode, err := enumSetting("settings.metered_accounts", m.GetSettings().GetMeteredAccounts(), meteredModes...)
			if err != nil {
				return nil, err
			}
			value = mode
		case settingOwnedAccounts:
			mode, err := enumSetting("settings.owned_accounts", m.GetSettings().GetOwnedAccounts(),
				weirv1.OwnedAccounts_OWNED_ACCOUNTS_SHARED, weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY)
			if err != nil {
				return nil, err
			}
			value = mode
		case settingBodyBuffer, settingBodyBufferPerKey:
			n := m.GetSettings().GetBodyBufferBytes()
			if path == settingBodyBufferPerKey {
				n = m.GetSettings().GetBodyBufferPerKeyBytes()
			}
			if n < minBodyBuffer || n > maxBodyBuffer {
				return nil, invalidf("settings.%s: %d is out of range; must be between %s and %s", path, n,
					bytesize.Format(minBodyBuffer), bytesize.Format(maxBodyBuffer))
			}
			value = bytesize.Format(n)
		case settingEgressProxy:
			raw := m.GetSettings().GetEgressProxy()
			if raw == egress.Direct {
				raw = "" // the default's direct is no default
			}
			in, err := parseEgress("settings.egress_proxy", raw, false)
			if err != nil {
				return nil, err
			}
			value, sealed = in.shown, in.sealed(h.seal, uuid.Nil)
		default:
			return nil, invalidf("update_mask: unknown field %q (want %s)", path, settingNames)
		}
		puts = append(puts, db.PutSealedSettingParams{Name: path, Value: value, Sealed: sealed, Now: now})
	}
	var st *weirv1.Settings
	err := h.tx(ctx, func(q *db.Queries) error {
		before, err := q.ListSettings(ctx)
		if err != nil {
			return fmt.Errorf("list settings: %w", err)
		}
		old := make(map[string]string, len(before))
		for _, r := range before {
			old[r.Name] = r.Value
		}
		for _, p := range puts {
			if err := q.PutSealedSetting(ctx, p); err != nil {
				return fmt.Errorf("put setting %s: %w", p.Name, err)
			}
			if p.Name == settingEgressProxy {
				// The old route's failures say nothing of the new one.
				if _, err := q.ClearDefaultEgressTransportCooldowns(ctx); err != nil {
					return fmt.Errorf("clear transport cooldowns: %w", err)
				}
			}
			if old[p.Name] == p.Value && p.Sealed == nil {
				// Not a change. (A sealed value is recorded whenever it is
				// set: its host may stay while its credentials change.)
				continue
			}
			if err := q.RecordSettingChange(ctx, db.RecordSettingChangeParams{
				Name: p.Name, OldValue: old[p.Name], NewValue: p.Value, Actor: settingsActor(ctx), Now: now,
			}); err != nil {
				return fmt.Errorf("audit setting %s: %w", p.Name, err)
			}
		}
		rows, err := q.ListSettings(ctx)
		if err != nil {
			return fmt.Errorf("list settings: %w", err)
		}
		st, err = h.settings.from(rows)
		return err
	})
	if err != nil {
		return nil, err
	}
	h.log.InfoContext(ctx, "settings updated", "fields", paths,
		"capacity_hold", st.CapacityHold.AsDuration(), "unreachable_hold", st.UnreachableHold.AsDuration(),
		"request_deadline", st.RequestDeadline.AsDuration(),
		"quota_response_mode", enumName(st.QuotaResponseMode), "metered_accounts", enumName(st.MeteredAccounts),
		"body_buffer_bytes", st.BodyBufferBytes, "body_buffer_per_key_bytes", st.BodyBufferPerKeyBytes,
		"route_events_retention", st.RouteEventsRetention.AsDuration(), "usage_retention", st.UsageRetention.AsDuration(),
		"budget_time_zone", st.BudgetTimeZone,
		"pool_low_accounts", st.PoolLowAccounts, "breaker_notify_after", st.BreakerNotifyAfter.AsDuration(),
		"egress_proxy", st.EgressProxy, "owned_accounts", enumName(st.OwnedAccounts))
	return connect.NewResponse(&weirv1.UpdateSettingsResponse{Settings: st}), nil
}

// WorkerSettings is what data planes poll; one small query, no locks.
func (l leaseService) WorkerSettings(ctx context.Context, _ *connect.Request[weirv1.WorkerSettingsRequest]) (*connect.Response[weirv1.WorkerSettingsResponse], error) {
	st, err := l.settings.effective(ctx)
	if err != nil {
		return nil, err
	}
	prices, err := l.q.ListModelPrices(ctx)
	if err != nil {
		return nil, err
	}
	resp := &weirv1.WorkerSettingsResponse{Settings: st}
	for _, p := range prices {
		resp.Prices = append(resp.Prices, modelPriceProto(p))
	}
	return connect.NewResponse(resp), nil
}

// effective is what operators set, else this replica's defaults.
func (ss settingsSource) effective(ctx context.Context) (*weirv1.Settings, error) {
	rows, err := ss.q.ListSettings(ctx)
	if err != nil {
		return nil, fmt.Errorf("list settings: %w", err)
	}
	return ss.from(rows)
}

// from overlays stored rows on the Config defaults. Names it does
// not know are skipped: a newer replica may have written them during a
// rolling upgrade. A value it cannot read is an error rather than a silent
// fall back to a default the operator did not choose.
func (ss settingsSource) from(rows []db.Setting) (*weirv1.Settings, error) {
	hold, unreachable, deadline, retention := ss.capacityHold, ss.unreachableHold, ss.requestDeadline, defaultRouteRetention
	poolLow, breakerAfter := int32(defaultPoolLow), defaultBreakerAfter
	mode := weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_RETRYABLE
	metered := weirv1.MeteredAccounts_METERED_ACCOUNTS_NORMAL
	owned := weirv1.OwnedAccounts_OWNED_ACCOUNTS_SHARED
	bodyBuffer, bodyBufferPerKey := ss.bodyBuffer, ss.bodyBufferPerKey
	usageRetention, tz := defaultUsageRetention, "UTC"
	var egressProxy string
	for _, r := range rows {
		var dst *time.Duration
		var lo, hi time.Duration
		switch r.Name {
		case settingCapacityHold:
			dst, lo, hi = &hold, 0, maxCapacityHold
		case settingUnreachableHold:
			dst, lo, hi = &unreachable, 0, maxCapacityHold
		case settingRequestDeadline:
			dst, lo, hi = &deadline, minRequestDeadline, maxRequestDeadline
		case settingRouteRetention:
			dst, lo, hi = &retention, minRouteRetention, maxRouteRetention
		case settingUsageRetention:
			dst, lo, hi = &usageRetention, minUsageRetention, maxRouteRetention
		case settingBudgetTimeZone:
			if _, err := time.LoadLocation(r.Value); err != nil {
				return nil, fmt.Errorf("setting %s: %w", r.Name, err)
			}
			tz = r.Value
			continue
		case settingBreakerNotify:
			dst, lo, hi = &breakerAfter, 0, maxBreakerAfter
		case settingPoolLow:
			n, err := strconv.Atoi(r.Value)
			if err == nil && (n < 0 || n > maxPoolLow) {
				err = fmt.Errorf("%d is out of range", n)
			}
			if err != nil {
				return nil, fmt.Errorf("setting %s: %w", r.Name, err)
			}
			poolLow = int32(n)
			continue
		case settingQuotaResponseMode:
			m, ok := quotamode.Parse(r.Value)
			if !ok {
				return nil, fmt.Errorf("setting %s: unknown value %q", r.Name, r.Value)
			}
			mode = m
			continue
		case settingMeteredAccounts:
			if metered = enumValue[weirv1.MeteredAccounts](r.Value); metered == weirv1.MeteredAccounts_METERED_ACCOUNTS_UNSPECIFIED {
				return nil, fmt.Errorf("setting %s: unknown value %q", r.Name, r.Value)
			}
			continue
		case settingOwnedAccounts:
			if owned = enumValue[weirv1.OwnedAccounts](r.Value); owned == weirv1.OwnedAccounts_OWNED_ACCOUNTS_UNSPECIFIED {
				return nil, fmt.Errorf("setting %s: unknown value %q", r.Name, r.Value)
			}
			continue
		case settingBodyBuffer, settingBodyBufferPerKey:
			n, err := bytesize.Parse(r.Value)
			if err == nil && (n < minBodyBuffer || n > maxBodyBuffer) {
				err = fmt.Errorf("%s is out of range", r.Value)
			}
			if err != nil {
				return nil, fmt.Errorf("setting %s: %w", r.Name, err)
			}
			if r.Name == settingBodyBuffer {
				bodyBuffer = n
			} else {
				bodyBufferPerKey = n
			}
			continue
		case settingEgressProxy:
			egressProxy = r.Value // its shown form: the URL is sealed
			continue
		default:
			continue
		}
		d, err := time.ParseDuration(r.Value)
		if err != nil {
			return nil, fmt.Errorf("setting %s: %w", r.Name, err)
		}
		// UpdateSettings writes only values in range; one out of it was
		// written by hand, and is no more the operator's choice than an
		// unreadable one.
		if d < lo || d > hi {
			return nil, fmt.Errorf("setting %s: %v is out of range [%v, %v]", r.Name, d, lo, hi)
		}
		*dst = d
	}
	return &weirv1.Settings{CapacityHold: durationpb.New(hold), UnreachableHold: durationpb.New(unreachable),
		RequestDeadline: durationpb.New(deadline), QuotaResponseMode: mode, MeteredAccounts: metered,
		BodyBufferBytes: bodyBuffer, BodyBufferPerKeyBytes: bodyBufferPerKey, RouteEventsRetention: durationpb.New(retention),
		UsageRetention: durationpb.New(usageRetention), BudgetTimeZone: tz,
		PoolLowAccounts: poolLow, BreakerNotifyAfter: durationpb.New(breakerAfter),
		EgressProxy: egressProxy, OwnedAccounts: owned}, nil
}

// RouteRetention is the route_events_retention setting in effect (the
// retention job's, jobs.Deps.RouteRetention).
func (s *Server) RouteRetention(ctx context.Context) (time.Duration, error) {
	st, err := s.settings.effective(ctx)
	if err != nil {
		return 0, err
	}
	return st.GetRouteEventsRetention().AsDuration(), nil
}

// UsageRetention is the usage_retention setting in effect (the retention
// job's, jobs.Deps.UsageRetention).
func (s *Server) UsageRetention(ctx context.Context) (time.Duration, error) {
	st, err := s.settings.effective(ctx)
	if err != nil {
		return 0, err
	}
	return st.GetUsageRetention().AsDuration(), nil
}

// meteredModes are the values metered_accounts takes, globally and per key.
var meteredModes = []weirv1.MeteredAccounts{weirv1.MeteredAccounts_METERED_ACCOUNTS_NORMAL,
	weirv1.MeteredAccounts_METERED_ACCOUNTS_LAST_RESORT, weirv1.MeteredAccounts_METERED_ACCOUNTS_NEVER}

// enumSetting checks a mode named by an update mask against the values
// allowed and returns its stored name.
func enumSetting[E protoEnum](field string, m E, allowed ...E) (string, error) {
	names := make([]string, len(allowed))
	for i, a := range allowed {
		names[i] = enumName(a)
	}
	want := strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
	switch {
	case slices.Contains(allowed, m):
		return enumName(m), nil
	case m.Number() == 0:
		return "", invalidf("%s: required (it is in update_mask); want %s", field, want)
	}
	return "", invalidf("%s: unknown value %d; want %s", field, int32(m.Number()), want)
}

// ListSettingChanges is the audit of setting changes, newest first.
func (h settingsService) ListSettingChanges(ctx context.Context, req *connect.Request[weirv1.ListSettingChangesRequest]) (*connect.Response[weirv1.ListSettingChangesResponse], error) {
	limit := req.Msg.GetLimit()
	switch {
	case limit < 0 || limit > 500:
		return nil, invalidf("limit: %d is out of range; must be between 0 and 500", limit)
	case limit == 0:
		limit = 50
	}
	rows, err := h.q.ListSettingChanges(ctx, limit)
	if err != nil {
		return nil, err
	}
	out := &weirv1.ListSettingChangesResponse{}
	for _, r := range rows {
		out.Changes = append(out.Changes, &weirv1.SettingChange{Name: r.Name, OldValue: r.OldValue,
			NewValue: r.NewValue, Actor: r.Actor, ChangedAt: timestamppb.New(r.ChangedAt)})
	}
	return connect.NewResponse(out), nil
}

// durationSetting checks a duration field named by the update mask.
func durationSetting(field string, v *durationpb.Duration, lo, hi time.Duration) (time.Duration, error) {
	if v == nil {
		return 0, invalidf("%s: required (it is in update_mask)", field)
	}
	if err := v.CheckValid(); err != nil {
		return 0, invalidf("%s: not a valid duration", field)
	}
	d := v.AsDuration()
	if d < lo || d > hi {
		return 0, invalidf("%s: %v is out of range; must be between %v and %v", field, d, lo, hi)
	}
	return d, nil
}
