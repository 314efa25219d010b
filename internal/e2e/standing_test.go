package e2e

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/sim"
)

// A key's own standing end to end: GET /v1/weir/usage on a real worker,
// the control plane's rollup, budgets and routing view over Postgres, and
// the pool's rate-limit headers on proxied answers.

// standing is GET /v1/weir/usage's body.
type standing struct {
	Object   string    `json:"object"`
	AsOf     time.Time `json:"as_of"`
	TimeZone string    `json:"time_zone"`
	Usage    struct {
		Today, ThisWeek, ThisMonth *standingPeriod
	} `json:"usage"`
	Budgets []struct {
		Scope     string     `json:"scope"`
		Name      string     `json:"name"`
		Unit      string     `json:"unit"`
		Period    string     `json:"period"`
		Limit     float64    `json:"limit"`
		Spent     *float64   `json:"spent"`
		Remaining *float64   `json:"remaining"`
		ResetsAt  *time.Time `json:"resets_at"`
	} `json:"budgets"`
	Models []standingModel `json:"models"`
}

type standingPeriod struct {
	Start    time.Time `json:"start"`
	ResetsAt time.Time `json:"resets_at"`
	Requests int64     `json:"requests"`
	Tokens   struct {
		Input, Output, CacheRead, CacheCreation, Reasoning, Total int64
	} `json:"tokens"`
	CostUSD float64 `json:"cost_usd"`
}

type standingModel struct {
	Model           string     `json:"model"`
	Family          string     `json:"family"`
	Surface         string     `json:"surface"`
	Path            string     `json:"path"`
	Providers       []string   `json:"providers"`
	CanServeNow     bool       `json:"can_serve_now"`
	Reason          string     `json:"reason"`
	NextAvailableAt *time.Time `json:"next_available_at"`
	OutOfQuota      bool       `json:"out_of_quota"`
	Windows         struct {
		FiveHour *standingWindow `json:"five_hour"`
		SevenDay *standingWindow `json:"seven_day"`
	} `json:"windows"`
}

type standingWindow struct {
	UsedPercent float64    `json:"used_percent"`
	ResetsAt    *time.Time `json:"resets_at"`
	Accounts    int        `json:"accounts"`
	Readings    int        `json:"readings"`
}

// UnmarshalJSON reads the periods under their JSON names.
func (s *standing) UnmarshalJSON(b []byte) error {
	type plain standing
	var aux struct {
		plain
		Usage struct {
			Today     *standingPeriod `json:"today"`
			ThisWeek  *standingPeriod `json:"this_week"`
			ThisMonth *standingPeriod `json:"this_month"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	*s = standing(aux.plain)
	s.Usage.Today, s.Usage.ThisWeek, s.Usage.ThisMonth = aux.Usage.Today, aux.Usage.ThisWeek, aux.Usage.ThisMonth
	return nil
}

// getStanding asks the default worker for key's standing (query: the URL's
// query, "" for none) and checks that the body names no account.
func (e *env) getStanding(key, query string) (standing, response) {
	e.t.Helper()
	path := "/v1/weir/usage"
	if query != "" {
		path += "?" + query
	}
	r := e.do(http.MethodGet, path, "", func(req *http.Request) {
		req.Header.Del("X-Api-Key")
		req.Header.Set("Authorization", "Bearer "+key)
	})
	e.namesNoAccount(r)
	var s standing
	if r.status == http.StatusOK {
		if err := json.Unmarshal(r.body, &s); err != nil {
			e.t.Fatalf("standing: %v: %s", err, r.body)
		}
	}
	return s, r
}

// namesNoAccount fails when an answer's body or headers carry an account's
// label, id, credential or upstream id.
func (e *env) namesNoAccount(r response) {
	e.t.Helper()
	var secrets []string
	for label, id := range e.ids {
		secrets = append(secrets, label, id, e.creds[label])
		if upstream, ok := e.sim.ChatGPTAccountID(label); ok {
			secrets = append(secrets, upstream)
		}
	}
	headers := &bytes.Buffer{}
	r.header.Write(headers) //nolint:errcheck // a buffer
	for _, s := range secrets {
		if s == "" {
			continue
		}
		if bytes.Contains(r.body, []byte(s)) || strings.Contains(headers.String(), s) {
			e.t.Errorf("the answer names an account (%d bytes matched)", len(s))
		}
	}
}

// modelOn finds the standing of family on surface.
func (s standing) modelOn(t *testing.T, family, surface string) standingModel {
	t.Helper()
	for _, m := range s.Models {
		if m.Family == family && m.Surface == surface {
			return m
		}
	}
	t.Fatalf("no standing of %q on %s in %+v", family, surface, s.Models)
	return standingModel{}
}

// TestStandingUsageAndBudgets: a key of a team, both budgeted, spends
// three requests; its standing shows those requests and their tokens and
// cost in its day, week and month (in the budget time zone), and its
// budgets and its team's with what it spent and when they reset.
func TestStandingUsageAndBudgets(t *testing.T) {
	t.Parallel()
	v := virtualClock() // Tuesday 2030-01-01 12:00 UTC
	e := setup(t, options{virtual: v, accounts: []account{{label: "metered-" + randid.Hex(4), maxConc: 4}}})
	ctx := t.Context()
	if _, err := e.keys.CreateTeam(ctx, connect.NewRequest(&weirv1.CreateTeamRequest{Name: "platform",
		Budgets: []*weirv1.BudgetLimit{{Unit: weirv1.BudgetUnit_BUDGET_UNIT_USD, Period: weirv1.BudgetPeriod_BUDGET_PERIOD_MONTH, Amount: 50}}})); err != nil {
		t.Fatal(err)
	}
	key := e.restrictedKey(&weirv1.CreateKeyRequest{Team: "platform", Budgets: []*weirv1.BudgetLimit{
		{Unit: weirv1.BudgetUnit_BUDGET_UNIT_TOKENS, Period: weirv1.BudgetPeriod_BUDGET_PERIOD_DAY, Amount: 100000},
		{Unit: weirv1.BudgetUnit_BUDGET_UNIT_TOKENS, Period: weirv1.BudgetPeriod_BUDGET_PERIOD_SESSION, Amount: 5000},
	}})

	// Before it spent anything: zeros, not missing periods.
	s, r := e.getStanding(key, "")
	if r.status != http.StatusOK || s.Object != "weir.usage" || s.TimeZone != "UTC" || s.Usage.Today == nil || s.Usage.Today.Requests != 0 {
		t.Fatalf("fresh key: %d %s", r.status, r.body)
	}

	var tokens int64
	var cost float64
	for range 3 {
		r := e.postAs(key, false)
		if r.status != http.StatusOK {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
		tokens += e.tokensOf(ev.RequestId)
		cost += ev.CostUsd
	}
	if tokens == 0 || cost == 0 {
		t.Fatalf("the requests cost %d tokens, $%g: nothing to compare", tokens, cost)
	}
	// An answer is kept a few seconds per key and query; a new query asks.
	s, r = e.getStanding(key, "surface=messages")
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	day := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, p := range []struct {
		name        string
		got         *standingPeriod
		start, ends time.Time
	}{
		{"today", s.Usage.Today, day, day.AddDate(0, 0, 1)},
		{"this week", s.Usage.ThisWeek, day.AddDate(0, 0, -1), day.AddDate(0, 0, 6)}, // from Monday
		{"this month", s.Usage.ThisMonth, day, day.AddDate(0, 1, 0)},
	} {
		g := p.got
		if g == nil {
			t.Fatalf("%s missing: %s", p.name, r.body)
		}
		if g.Requests != 3 || g.Tokens.Total != tokens || math.Abs(g.CostUSD-cost) > 1e-9 ||
			g.Tokens.Input+g.Tokens.Output+g.Tokens.CacheRead+g.Tokens.CacheCreation != tokens {
			t.Errorf("%s: %d requests, %+v tokens, $%g; want 3, %d, $%g", p.name, g.Requests, g.Tokens, g.CostUSD, tokens, cost)
		}
		if !g.Start.Equal(p.start) || !g.ResetsAt.Equal(p.ends) {
			t.Errorf("%s: %v to %v, want %v to %v", p.name, g.Start, g.ResetsAt, p.start, p.ends)
		}
	}

	if len(s.Budgets) != 3 {
		t.Fatalf("budgets %+v, want the key's two and the team's", s.Budgets)
	}
	for _, b := range s.Budgets {
		switch {
		case b.Scope == "key" && b.Period == "day":
			if b.Unit != "tokens" || b.Limit != 100000 || b.Spent == nil || *b.Spent != float64(tokens) ||
				*b.Remaining != float64(100000-tokens) || !b.ResetsAt.Equal(day.AddDate(0, 0, 1)) {
				t.Errorf("key's daily budget %+v, want %d of 100000 spent, reset at %v", b, tokens, day.AddDate(0, 0, 1))
			}
		case b.Scope == "key" && b.Period == "session":
			if b.Limit != 5000 || b.Spent != nil || b.ResetsAt != nil {
				t.Errorf("session cap %+v, want its limit alone", b)
			}
		case b.Scope == "team":
			if b.Name != "platform" || b.Unit != "usd" || b.Period != "month" || b.Limit != 50 || b.Spent == nil ||
				math.Abs(*b.Spent-cost) > 1e-9 || !b.ResetsAt.Equal(day.AddDate(0, 1, 0)) {
				t.Errorf("team budget %+v, want $%g of $50 spent, reset at %v", b, cost, day.AddDate(0, 1, 0))
			}
		default:
			t.Errorf("unexpected budget %+v", b)
		}
	}

	// Another key sees its own usage, not this one's.
	other, _ := e.getStanding(e.key, "")
	if other.Usage.Today.Requests != 0 || len(other.Budgets) != 0 {
		t.Errorf("the default key's standing %+v shows another key's spend", other.Usage.Today)
	}
}

// TestStandingPoolServes: one subscription's five-hour window is spent
// (100%, resetting in 3h), the other serves; the key's standing says the
// pool serves now, with the windows pooled across both and the soonest
// resets, and names neither account.
func TestStandingPoolServes(t *testing.T) {
	t.Parallel()
	spent, serving := "sub-"+randid.Hex(4), "sub-"+randid.Hex(4)
	e := setup(t, options{accounts: []account{
		{label: spent, oauth: true, windows: &sim.Windows{
			FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(3 * time.Hour)},
			SevenDay: &sim.Window{Limit: 100000, Used: 10000, ResetIn: sim.Duration(100 * time.Hour)}}},
		{label: serving, oauth: true, windows: &sim.Windows{
			FiveHour: &sim.Window{Limit: 1000, Used: 200, ResetIn: sim.Duration(4 * time.Hour)},
			SevenDay: &sim.Window{Limit: 100000, Used: 30000, ResetIn: sim.Duration(50 * time.Hour)}}},
	}})
	e.refreshUsage(spent, serving)
	s, r := e.getStanding(e.key, "")
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	// A key allowed any model: each Claude family on Messages; nothing on
	// the surfaces no account of the pool serves.
	if len(s.Models) != 3 {
		t.Errorf("%d standings, want opus, sonnet and haiku on messages: %+v", len(s.Models), s.Models)
	}
	for _, m := range s.Models {
		if m.Surface != "messages" {
			t.Errorf("standing on %s, where no account of the pool serves: %+v", m.Surface, m)
		}
	}
	m := s.modelOn(t, "sonnet", "messages")
	if !m.CanServeNow || m.OutOfQuota || m.Reason != "" || m.NextAvailableAt != nil || m.Path != "/v1/messages" ||
		len(m.Providers) != 1 || m.Providers[0] != "anthropic" {
		t.Errorf("sonnet: %+v, want served now by anthropic", m)
	}
	five, week := m.Windows.FiveHour, m.Windows.SevenDay
	if five == nil || week == nil {
		t.Fatalf("windows %+v", m.Windows)
	}
	if five.UsedPercent != 60 || five.Accounts != 2 || five.Readings != 2 || !near(*five.ResetsAt, e.simReset(spent, false)) {
		t.Errorf("five-hour %+v, want 60%% over 2 accounts, resetting in 3h", *five)
	}
	if week.UsedPercent != 20 || !near(*week.ResetsAt, e.simReset(serving, true)) {
		t.Errorf("weekly %+v, want 20%%, resetting in 50h", *week)
	}

	// A key pinned to the serving account pools that account alone.
	s, r = e.getStanding(e.pinnedKey(serving), "surface=messages")
	if m := s.modelOn(t, "sonnet", "messages"); r.status != http.StatusOK || m.Windows.FiveHour == nil ||
		m.Windows.FiveHour.UsedPercent != 20 || m.Windows.FiveHour.Accounts != 1 {
		t.Errorf("the pinned key's standing %+v, want its one account's 20%%", m)
	}

	// A model asked by name: that model only, its family's standing.
	s, r = e.getStanding(e.key, "model="+model)
	if r.status != http.StatusOK || len(s.Models) != 1 || s.Models[0].Model != model || !s.Models[0].CanServeNow ||
		s.Models[0].Windows.FiveHour == nil || s.Models[0].Windows.FiveHour.UsedPercent != 60 {
		t.Errorf("standing of %s: %d %s", model, r.status, r.body)
	}
}

// TestStandingPoolSpent: every subscription's five-hour window spent; the
// standing says the pool cannot serve, out of quota, until the soonest
// reset.
func TestStandingPoolSpent(t *testing.T) {
	t.Parallel()
	a, b := "sub-"+randid.Hex(4), "sub-"+randid.Hex(4)
	e := setup(t, options{accounts: []account{
		{label: a, oauth: true, windows: &sim.Windows{FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(2 * time.Hour)}}},
		{label: b, oauth: true, windows: &sim.Windows{FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(4 * time.Hour)}}},
	}})
	e.refreshUsage(a, b)
	s, r := e.getStanding(e.key, "surface=messages")
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	m := s.modelOn(t, "opus", "messages")
	if m.CanServeNow || !m.OutOfQuota || m.Reason != "all_cooling" || m.NextAvailableAt == nil ||
		!near(*m.NextAvailableAt, e.simReset(a, false)) {
		t.Errorf("opus: %+v, want out of quota until the first reset, 2h away", m)
	}
	if w := m.Windows.FiveHour; w == nil || w.UsedPercent != 100 || !near(*w.ResetsAt, e.simReset(a, false)) {
		t.Errorf("five-hour %+v, want 100%% resetting in 2h", w)
	}
	// A request is refused as the pool's spent window, in the headers
	// Claude Code words its limit from.
	r = e.post(false)
	e.namesNoAccount(r)
	h := r.header
	if r.status != http.StatusTooManyRequests || h.Get("Anthropic-Ratelimit-Unified-Status") != "rejected" ||
		h.Get("Anthropic-Ratelimit-Unified-Representative-Claim") != "five_hour" ||
		!nearEpoch(h.Get("Anthropic-Ratelimit-Unified-Reset"), e.simReset(a, false).Unix()) {
		t.Errorf("%d with status %q claim %q reset %q, want a 429 rejected on five_hour until the first reset: %s", r.status,
			h.Get("Anthropic-Ratelimit-Unified-Status"), h.Get("Anthropic-Ratelimit-Unified-Representative-Claim"),
			h.Get("Anthropic-Ratelimit-Unified-Reset"), r.body)
	}
}

// TestStandingRefusesBadKeys: a wrong key and a missing one get a 401 in
// the Anthropic format; a model outside the key's allowlist a 403.
func TestStandingRefusesBadKeys(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "a-" + randid.Hex(4)}}})
	for name, edit := range map[string]func(*http.Request){
		"wrong key":   func(r *http.Request) { r.Header.Set("X-Api-Key", "wk-not-a-key") },
		"missing key": func(r *http.Request) { r.Header.Del("X-Api-Key") },
		"unknown bearer": func(r *http.Request) {
			r.Header.Del("X-Api-Key")
			r.Header.Set("Authorization", "Bearer "+e.key+"x")
		},
	} {
		r := e.do(http.MethodGet, "/v1/weir/usage", "", edit)
		if r.status != http.StatusUnauthorized {
			t.Errorf("%s: %d %s, want a 401", name, r.status, r.body)
			continue
		}
		if body := decodeError(t, r.body); body.Type != "error" || body.Error.Type != "authentication_error" ||
			body.Error.Message == "" || body.RequestID != r.header.Get("Weir-Request-Id") {
			t.Errorf("%s: %s, want an authentication_error naming the request", name, r.body)
		}
	}
	key := e.restrictedKey(&weirv1.CreateKeyRequest{AllowedModels: []string{"claude-haiku-*"}})
	_, r := e.getStanding(key, "model="+model)
	var body apiError
	if r.status != http.StatusForbidden || json.Unmarshal(r.body, &body) != nil || body.Error.Type != "permission_error" {
		t.Errorf("a model outside the allowlist: %d %s, want a 403 permission_error", r.status, r.body)
	}
	// The allowlist's patterns are the standing's models.
	s, r := e.getStanding(key, "")
	if r.status != http.StatusOK || len(s.Models) != 1 || s.Models[0].Model != "claude-haiku-*" || s.Models[0].Family != "haiku" {
		t.Errorf("standing of a haiku-only key: %d %s", r.status, r.body)
	}
	if r := e.do(http.MethodPost, "/v1/weir/usage", "{}", nil); r.status != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", r.status)
	}
}

// TestPoolRateLimitHeaders: two subscriptions at 10% and 70% of their
// five-hour windows, the fuller one serving (by priority). The unified
// headers Claude Code reads say the pool's 40%, with the soonest reset,
// not the serving account's 70%; its own overage and fallback headers
// never reach the client.
func TestPoolRateLimitHeaders(t *testing.T) {
	t.Parallel()
	low, high := "sub-"+randid.Hex(4), "sub-"+randid.Hex(4)
	e := setup(t, options{accounts: []account{
		{label: low, oauth: true, windows: &sim.Windows{
			FiveHour: &sim.Window{Limit: 10_000_000, Used: 1_000_000, ResetIn: sim.Duration(2 * time.Hour)},
			SevenDay: &sim.Window{Limit: 10_000_000, Used: 3_000_000, ResetIn: sim.Duration(90 * time.Hour)}}},
		{label: high, oauth: true, priority: 10, windows: &sim.Windows{
			FiveHour: &sim.Window{Limit: 10_000_000, Used: 7_000_000, ResetIn: sim.Duration(4 * time.Hour)},
			SevenDay: &sim.Window{Limit: 10_000_000, Used: 5_000_000, ResetIn: sim.Duration(60 * time.Hour)},
			Overage:  &sim.Overage{Status: "rejected", DisabledReason: "org_level_disabled"}}},
	}})
	e.refreshUsage(low, high)
	var r response
	eventually(t, "the worker to know the pool's standing", func() bool {
		r = e.post(false)
		if r.status != http.StatusOK {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		return r.header.Get("Anthropic-Ratelimit-Unified-5h-Utilization") != ""
	})
	e.namesNoAccount(r)
	if ev := e.routeEvent(r.header.Get("Weir-Request-Id")); ev.AccountId != e.ids[high] {
		t.Fatalf("served by %s, want the 70%% account", e.labels[ev.AccountId])
	}
	h := r.header
	if got := h.Get("Anthropic-Ratelimit-Unified-5h-Utilization"); got != "0.4" {
		t.Errorf("5h utilization %q, want the pool's 0.4 (the serving account is at 0.7)", got)
	}
	if got := h.Get("Anthropic-Ratelimit-Unified-7d-Utilization"); got != "0.4" {
		t.Errorf("7d utilization %q, want the pool's 0.4", got)
	}
	fiveReset := e.simReset(low, false).Unix()
	if got := h.Get("Anthropic-Ratelimit-Unified-5h-Reset"); !nearEpoch(got, fiveReset) {
		t.Errorf("5h reset %q, want the soonest, %d", got, fiveReset)
	}
	if h.Get("Anthropic-Ratelimit-Unified-Status") != "allowed" || h.Get("Anthropic-Ratelimit-Unified-Representative-Claim") != "five_hour" ||
		!nearEpoch(h.Get("Anthropic-Ratelimit-Unified-Reset"), fiveReset) {
		t.Errorf("status %q claim %q reset %q, want allowed, five_hour, %d", h.Get("Anthropic-Ratelimit-Unified-Status"),
			h.Get("Anthropic-Ratelimit-Unified-Representative-Claim"), h.Get("Anthropic-Ratelimit-Unified-Reset"), fiveReset)
	}
	for k := range h {
		if strings.Contains(k, "Overage") || strings.Contains(k, "Fallback") {
			t.Errorf("the serving account's %s reached the client", k)
		}
	}
	// The upstream did send its own, the serving account's.
	var own string
	for _, x := range e.upstream.exchanges() {
		if x.path == "/v1/messages" {
			own = x.header.Get("Anthropic-Ratelimit-Unified-5h-Utilization")
		}
	}
	if !strings.HasPrefix(own, "0.7") {
		t.Errorf("the serving account's own 5h utilization was %q, want 0.7…: the test proves nothing", own)
	}
}

// near says whether a reset is at want, to the second the headers and the
// usage endpoint keep.
func near(got, want time.Time) bool {
	d := got.Sub(want)
	return d > -2*time.Second && d < 2*time.Second
}

// nearEpoch is near for an epoch-seconds header.
func nearEpoch(got string, want int64) bool {
	var n int64
	if err := json.Unmarshal([]byte(got), &n); err != nil {
		return false
	}
	return near(time.Unix(n, 0), time.Unix(want, 0))
}

// simReset is when an account's five-hour (or weekly) window resets in
// the simulator.
func (e *env) simReset(label string, weekly bool) time.Time {
	e.t.Helper()
	st, err := e.sim.Windows(label)
	w := st.FiveHour
	if weekly {
		w = st.SevenDay
	}
	if err != nil || w == nil {
		e.t.Fatalf("%s has no such window in the simulator: %v", label, err)
	}
	return w.ResetsAt
}

// refreshUsage reads each account's usage endpoint into the usage view.
func (e *env) refreshUsage(labels ...string) {
	e.t.Helper()
	for _, l := range labels {
		res, err := e.accounts.RefreshUsage(e.t.Context(), connect.NewRequest(&weirv1.RefreshUsageRequest{Id: e.ids[l]}))
		if err != nil || !res.Msg.Read || res.Msg.Error != "" {
			e.t.Fatalf("refresh usage: %v %v", res, err)
		}
	}
}

// TestPoolRateLimitsCodex: two ChatGPT logins at 10% and 70% of their
// five-hour windows, the fuller one serving. On /v1/responses the x-codex-*
// headers are the pool's 40%, and the stream opens with the pool's
// codex.rate_limits event; over the Responses WebSocket, which carries no
// headers, that event is the first message of each response.
func TestPoolRateLimitsCodex(t *testing.T) {
	t.Parallel()
	low, high := "sub-"+randid.Hex(4), "sub-"+randid.Hex(4)
	e := setup(t, options{accounts: []account{
		{label: low, provider: "codex", windows: &sim.Windows{
			FiveHour: &sim.Window{Limit: 10_000_000, Used: 1_000_000, ResetIn: sim.Duration(2 * time.Hour)},
			SevenDay: &sim.Window{Limit: 10_000_000, Used: 3_000_000, ResetIn: sim.Duration(90 * time.Hour)}}},
		{label: high, provider: "codex", priority: 10, windows: &sim.Windows{
			FiveHour: &sim.Window{Limit: 10_000_000, Used: 7_000_000, ResetIn: sim.Duration(4 * time.Hour)},
			SevenDay: &sim.Window{Limit: 10_000_000, Used: 5_000_000, ResetIn: sim.Duration(60 * time.Hour)}}},
	}})
	e.refreshUsage(low, high)
	soon := e.simReset(low, false).Unix()
	var r response
	eventually(t, "the worker to know the pool's standing", func() bool {
		r = e.responses(true)
		if r.status != http.StatusOK {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		return r.header.Get("X-Codex-Primary-Used-Percent") != ""
	})
	e.namesNoAccount(r)
	h := r.header
	if h.Get("X-Codex-Primary-Used-Percent") != "40" || h.Get("X-Codex-Primary-Window-Minutes") != "300" ||
		!nearEpoch(h.Get("X-Codex-Primary-Reset-At"), soon) {
		t.Errorf("primary %q %q %q, want the pool's 40, 300, %d (the serving account is at 70)", h.Get("X-Codex-Primary-Used-Percent"),
			h.Get("X-Codex-Primary-Window-Minutes"), h.Get("X-Codex-Primary-Reset-At"), soon)
	}
	if h.Get("X-Codex-Secondary-Used-Percent") != "40" || h.Get("X-Codex-Secondary-Window-Minutes") != "10080" {
		t.Errorf("secondary %q %q, want the pool's 40 and 10080", h.Get("X-Codex-Secondary-Used-Percent"), h.Get("X-Codex-Secondary-Window-Minutes"))
	}
	// The stream's first event is the pool's standing.
	first, _, _ := strings.Cut(string(r.body), "\n\n")
	_, data, _ := strings.Cut(first, "data: ")
	checkRateLimitsEvent(t, data, soon)
	if got := strings.Count(string(r.body), "codex.rate_limits"); got != 2 { // its event: line and its type
		t.Errorf("the stream carries %d mentions of codex.rate_limits, want one event", got)
	}

	c, _, err := e.dialResponses(e.key)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow() //nolint:errcheck // test teardown
	for range 2 {
		sendCreate(t, c, "")
		evs := readResponse(t, c)
		if len(evs) < 2 || evs[len(evs)-1]["type"] != "response.completed" {
			t.Fatalf("response events %v", evs)
		}
		b, _ := json.Marshal(evs[0])
		checkRateLimitsEvent(t, string(b), soon)
	}
}

// checkRateLimitsEvent checks a codex.rate_limits event's JSON: the pool's
// 40% of each window, the five-hour one resetting at soon.
func checkRateLimitsEvent(t *testing.T, data string, soon int64) {
	t.Helper()
	var ev struct {
		Type       string `json:"type"`
		RateLimits struct {
			Primary, Secondary *struct {
				UsedPercent   float64 `json:"used_percent"`
				WindowMinutes int     `json:"window_minutes"`
				ResetAt       int64   `json:"reset_at"`
			}
		} `json:"rate_limits"`
	}
	if err := json.Unmarshal([]byte(data), &ev); err != nil || ev.Type != "codex.rate_limits" {
		t.Fatalf("first event %s, want codex.rate_limits", data)
	}
	p, s := ev.RateLimits.Primary, ev.RateLimits.Secondary
	if p == nil || s == nil || p.UsedPercent != 40 || p.WindowMinutes != 300 || !near(time.Unix(p.ResetAt, 0), time.Unix(soon, 0)) ||
		s.UsedPercent != 40 || s.WindowMinutes != 10080 {
		t.Errorf("rate limits event %s, want the pool's 40%% and 40%%", data)
	}
}
