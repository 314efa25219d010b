package dataplane

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/modelpattern"
)

// A key's standing (LeaseService.KeyStanding) is what its holder may know
// of the pool it uses, never of one account: its usage and budgets, and
// per model whether the pool serves it now and the pool's five-hour and
// weekly windows. The worker serves it at GET /v1/weir/usage, and writes
// the rate-limit headers and events the clients read (docs/wire.md) from
// the pool's windows instead of relaying the serving account's.
//
// The headers must not cost a control-plane round trip per request: the
// worker keeps each key's standing per surface and model family, asked
// for when a request of it arrives (before its body is routed) and read
// when its answer's headers go out. A request never waits for it: one
// whose standing is not known yet gets no rate-limit headers (the
// account's are never relayed either).
//
// Staleness is acceptable because the windows come from the control
// plane's usage view, itself as old as its last reading (the usage poll
// reads every few minutes, released answers' usage headers merge in
// between): a standing standingFresh old lags it by what a few seconds of
// traffic add to windows the whole pool shares, a fraction of a point.
// The headers are advice a client shows; whether a request is served is
// Acquire's to decide on every request, and a pool found out of quota is
// written from the request's own answer (inbound.poolQuota), not from the
// cache.
const (
	// standingFresh: an entry older than this is asked for again when a
	// request of it arrives; standingStale: one older than this is not
	// written at all (the control plane did not answer for long).
	standingFresh = 5 * time.Second
	standingStale = time.Minute
	// standingAsk bounds one KeyStanding call.
	standingAsk = 3 * time.Second
	// maxStandings bounds the entries kept (a flood of keys and models
	// cannot grow it forever).
	maxStandings = 10000
	// maxUsageModels bounds GET /v1/weir/usage's model parameters, as the
	// control plane bounds an allowlist.
	maxUsageModels = 64
)

// standingKey names one cached standing.
type standingKey struct {
	keyHash string
	surface weirv1.Surface
	family  string
}

// standingEntry is one cached standing; at is when it was read (zero
// while none was), asking whether a read is under way.
type standingEntry struct {
	ms     *weirv1.ModelStanding
	at     time.Time
	asking bool
}

// standings caches the pool's standing per key, surface and model family
// for the headers, and the endpoint's answers per key and query.
type standings struct {
	// fetch asks the control plane for one model's standing.
	fetch func(ctx context.Context, keyHash string, sf weirv1.Surface, model string) (*weirv1.ModelStanding, error)
	now   func() time.Time
	// ctx ends the reads under way when the worker closes.
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu sync.Mutex
	m  map[standingKey]*standingEntry
	// answers are the endpoint's, by key hash and query.
	answers map[string]answerEntry
}

type answerEntry struct {
	resp *weirv1.KeyStandingResponse
	at   time.Time
}

func newStandings(fetch func(ctx context.Context, keyHash string, sf weirv1.Surface, model string) (*weirv1.ModelStanding, error), now func() time.Time) *standings {
	ctx, stop := context.WithCancel(context.Background())
	return &standings{fetch: fetch, now: now, ctx: ctx, stop: stop, m: map[standingKey]*standingEntry{},
		answers: map[string]answerEntry{}}
}

// fetchStanding is standings.fetch over LeaseService.KeyStanding.
func (s *Server) fetchStanding(ctx context.Context, keyHash string, sf weirv1.Surface, model string) (*weirv1.ModelStanding, error) {
	resp, err := s.leases.KeyStanding(ctx, connect.NewRequest(&weirv1.KeyStandingRequest{KeyHash: keyHash,
		Models: []string{model}, Surfaces: []weirv1.Surface{sf}, PoolOnly: true}))
	if err != nil {
		return nil, err
	}
	for _, ms := range resp.Msg.Models {
		if ms.Surface == sf {
			return ms, nil
		}
	}
	return nil, errors.New("no standing for the surface")
}

func keyOf(keyHash string, sf weirv1.Surface, model string) standingKey {
	return standingKey{keyHash: keyHash, surface: sf, family: modelpattern.Family(model)}
}

// want notes a request of the key on sf for model: its standing is read
// in the background when none is cached, or the cached one is older than
// standingFresh, unless a read is under way.
func (c *standings) want(keyHash string, sf weirv1.Surface, model string) {
	k := keyOf(keyHash, sf, model)
	now := c.now()
	c.mu.Lock()
	e := c.m[k]
	if e == nil {
		if len(c.m) >= maxStandings {
			clear(c.m)
		}
		e = &standingEntry{}
		c.m[k] = e
	}
	ask := !e.asking && (e.at.IsZero() || now.Sub(e.at) >= standingFresh) && c.ctx.Err() == nil
	if ask {
		e.asking = true
		c.wg.Add(1)
	}
	c.mu.Unlock()
	if !ask {
		return
	}
	go func() {
		defer c.wg.Done()
		ctx, cancel := context.WithTimeout(c.ctx, standingAsk)
		ms, err := c.fetch(ctx, keyHash, sf, model)
		cancel()
		c.mu.Lock()
		defer c.mu.Unlock()
		e.asking = false
		switch {
		case err == nil:
			e.ms, e.at = ms, c.now()
		case connect.CodeOf(err) == connect.CodePermissionDenied:
			// The key was revoked, or may no longer use the model: what
			// was known of it is not its to see.
			e.ms, e.at = nil, time.Time{}
		}
	}()
}

// get is the cached standing of the key on sf for model's family, nil
// when none was read or the last is older than standingStale.
func (c *standings) get(keyHash string, sf weirv1.Surface, model string) *weirv1.ModelStanding {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[keyOf(keyHash, sf, model)]
	if e == nil || e.ms == nil || now.Sub(e.at) >= standingStale {
		return nil
	}
	return e.ms
}

// answer is a cached endpoint answer for key and query, nil when none
// younger than standingFresh is.
func (c *standings) answer(id string) *weirv1.KeyStandingResponse {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.answers[id]
	if !ok || now.Sub(a.at) >= standingFresh {
		return nil
	}
	return a.resp
}

func (c *standings) keepAnswer(id string, resp *weirv1.KeyStandingResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.answers) >= maxStandings {
		clear(c.answers)
	}
	c.answers[id] = answerEntry{resp: resp, at: c.now()}
}

// forgetAll drops everything cached: a key changed (it may have been
// revoked, or its allowlist or pins narrowed).
func (c *standings) forgetAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.m)
	clear(c.answers)
}

// close ends the reads under way and waits for them.
func (c *standings) close() {
	c.stop()
	c.wg.Wait()
}

// pooledSurface says whether the worker writes the pool's rate-limit
// headers on sf's answers: Messages (Claude Code reads the unified
// headers) and Responses (Codex reads x-codex-* and codex.rate_limits).
func pooledSurface(sf surface) bool {
	return sf.name == surfaceMessages.name || sf.name == surfaceResp.name
}

// poolHeaders writes the pool's rate-limit headers on a routed request's
// answer, just before its status goes out: the account's were never
// copied (accountRateHeader). Like the providers' own, they go on
// successes, and on a 429 only when the pool is out of quota as this
// request found it: Claude Code words any 429 that carries them as a
// spent window ("You've hit your session limit · resets …"), which a
// budget's refusal or a burst is not.
func (s *Server) poolHeaders(in *inbound, status int, h http.Header) {
	switch {
	case !in.routed || !pooledSurface(in.sf):
		return
	case status == http.StatusTooManyRequests:
		if in.poolQuota == nil {
			return
		}
	case status < 200 || status > 299:
		return
	}
	ms := s.standings.get(in.keyHash, in.sf.api, in.model)
	now := s.cfg.Now()
	if in.sf.wire == wireAnthropic {
		writeUnifiedHeaders(h, ms, in.poolQuota, modelpattern.Family(in.model), status)
		return
	}
	writeCodexHeaders(h, ms, now)
}

// The unified headers weir writes (the rest of the family is one
// account's: overage, fallback, surpassed thresholds, upgrade paths).
const (
	unifiedPrefix = "Anthropic-Ratelimit-Unified-"
	claimFiveHour = "five_hour"
	claimSevenDay = "seven_day"
)

// writeUnifiedHeaders writes Anthropic's unified rate-limit headers from the
// pool's standing: each pooled window's utilization (a fraction, as the
// headers give it) and reset; on a 429, the pool out of quota as block
// says (nothing at all without one): the status "rejected", its first
// reset (else the standing's recovery) and the window it names (a model
// family's weekly window as seven_day_<family>, as Anthropic names it);
// otherwise "allowed" with the more used window as the representative
// claim. Without a standing it writes the rejection alone. Pure.
func writeUnifiedHeaders(h http.Header, ms *weirv1.ModelStanding, block *weirv1.QuotaBlock, family string, status int) {
	if status == http.StatusTooManyRequests && block == nil {
		return
	}
	five, week := ms.GetFiveHour(), ms.GetSevenDay()
	window := func(abbrev string, w *weirv1.PooledWindow) {
		if w.GetResetsAt() == nil {
			return
		}
		h.Set(unifiedPrefix+abbrev+"-Utilization", strconv.FormatFloat(math.Round(w.GetUsedPercent())/100, 'f', -1, 64))
		h.Set(unifiedPrefix+abbrev+"-Reset", strconv.FormatInt(w.GetResetsAt().GetSeconds(), 10))
	}
	window("5h", five)
	window("7d", week)
	claim, reset := claimSevenDay, week.GetResetsAt()
	if five.GetResetsAt() != nil && (week.GetResetsAt() == nil || five.GetUsedPercent() >= week.GetUsedPercent()) {
		claim, reset = claimFiveHour, five.GetResetsAt()
	}
	if status == http.StatusTooManyRequests {
		h.Set(unifiedPrefix+"Status", "rejected")
		switch {
		case block.GetKind() == weirv1.QuotaKind_QUOTA_KIND_FAMILY_WINDOW && (family == "opus" || family == "sonnet"):
			claim = claimSevenDay + "_" + family
		case block.GetWindowMinutes() > 0 && block.GetWindowMinutes() < 24*60:
			claim = claimFiveHour
		case block.GetWindowMinutes() >= 24*60:
			claim = claimSevenDay
		}
		h.Set(unifiedPrefix+"Representative-Claim", claim)
		at := block.GetResetsAt()
		if at == nil {
			at = ms.GetAvailableAt()
		}
		if at != nil {
			h.Set(unifiedPrefix+"Reset", strconv.FormatInt(at.GetSeconds(), 10))
		}
		return
	}
	if reset == nil {
		return
	}
	h.Set(unifiedPrefix+"Status", "allowed")
	h.Set(unifiedPrefix+"Representative-Claim", claim)
	h.Set(unifiedPrefix+"Reset", strconv.FormatInt(reset.GetSeconds(), 10))
}

// writeCodexHeaders writes Codex's rate-limit headers from the pool's
// standing: the five-hour window as the primary (300 minutes), the weekly
// as the secondary (10080), each with its used percent, reset and the
// seconds until it. A window already written (a final usage limit writes
// the spent one) is left as it is. Pure.
func writeCodexHeaders(h http.Header, ms *weirv1.ModelStanding, now time.Time) {
	set := func(prefix string, w *weirv1.PooledWindow, minutes int) {
		if w.GetResetsAt() == nil || h.Get(prefix+"Used-Percent") != "" {
			return
		}
		reset := w.GetResetsAt().AsTime()
		h.Set(prefix+"Used-Percent", strconv.FormatFloat(w.GetUsedPercent(), 'f', -1, 64))
		h.Set(prefix+"Window-Minutes", strconv.Itoa(minutes))
		h.Set(prefix+"Reset-At", strconv.FormatInt(reset.Unix(), 10))
		h.Set(prefix+"Reset-After-Seconds", strconv.FormatInt(int64(max(reset.Sub(now), 0)/time.Second), 10))
	}
	set("X-Codex-Primary-", ms.GetFiveHour(), 300)
	set("X-Codex-Secondary-", ms.GetSevenDay(), 10080)
}

// codexRateLimitsEvent is the pool's standing as Codex's in-stream
// rate-limit event (what Codex reads over its Responses WebSocket):
// {"type":"codex.rate_limits","rate_limits":{"primary":{"used_percent",
// "window_minutes","reset_at"},"secondary":{…}}}, SSE-framed; nil when the
// standing has no window. Pure.
func codexRateLimitsEvent(ms *weirv1.ModelStanding) []byte {
	type window struct {
		UsedPercent   float64 `json:"used_percent"`
		WindowMinutes int     `json:"window_minutes"`
		ResetAt       int64   `json:"reset_at"`
	}
	limits := map[string]window{}
	for name, w := range map[string]*weirv1.PooledWindow{"primary": ms.GetFiveHour(), "secondary": ms.GetSevenDay()} {
		if w.GetResetsAt() == nil {
			continue
		}
		minutes := 300
		if name == "secondary" {
			minutes = 10080
		}
		limits[name] = window{UsedPercent: w.GetUsedPercent(), WindowMinutes: minutes, ResetAt: w.GetResetsAt().GetSeconds()}
	}
	if len(limits) == 0 {
		return nil
	}
	b, _ := json.Marshal(map[string]any{"type": codexRateLimits, "rate_limits": limits})
	return []byte("event: " + codexRateLimits + "\ndata: " + string(b) + "\n\n")
}

// codexRateLimits names Codex's rate-limit event.
const codexRateLimits = "codex.rate_limits"

// poolRateLimitsEvent is the pool's rate-limit event for a Responses
// request, nil when its standing is not known (then no rate-limit event
// reaches the client: an account's is never relayed).
func (s *Server) poolRateLimitsEvent(in *inbound) []byte {
	return codexRateLimitsEvent(s.standings.get(in.keyHash, in.sf.api, in.model))
}

// accountRateHeader says whether an upstream response header states the
// serving account's own rate-limit standing, which the client never sees
// (the pool's is written instead, poolHeaders): Anthropic's unified
// family, and Codex's windows (x-codex-primary-*, -secondary-*, those of
// other limits, x-codex-<limit>-primary-*, and their names), credits,
// active limit and reached type. The per-minute limits of API keys
// (anthropic-ratelimit-requests-*, x-ratelimit-*) are still relayed:
// no client reads them as its standing, and no pooled reading of them
// exists.
func accountRateHeader(k string) bool {
	if strings.HasPrefix(k, unifiedPrefix) {
		return true
	}
	rest, ok := strings.CutPrefix(k, "X-Codex-")
	if !ok {
		return false
	}
	switch {
	case strings.HasPrefix(rest, "Primary-"), strings.HasPrefix(rest, "Secondary-"), strings.HasPrefix(rest, "Credits-"),
		strings.Contains(rest, "-Primary-"), strings.Contains(rest, "-Secondary-"), strings.HasSuffix(rest, "Limit-Name"):
		return true
	}
	return rest == "Active-Limit" || rest == "Rate-Limit-Reached-Type"
}

// serveUsage answers GET /v1/weir/usage: the key's standing as JSON,
// authenticated like inference (x-api-key or a bearer), errors in the
// Anthropic format. ?model= (repeatable) asks about those models only;
// ?surface= (messages, responses, chat_completions; repeatable) about
// those surfaces only. An answer is kept standingFresh per key and query,
// so a client that polls costs the control plane one call per interval.
func (s *Server) serveUsage(w http.ResponseWriter, r *http.Request) {
	requestID := newRequestID()
	w.Header().Set("Weir-Request-Id", requestID)
	s.cors(w.Header(), r)
	fail := func(e *apiError) { writeError(w, wireAnthropic, requestID, e) }
	secret := clientKey(r)
	if secret == "" {
		fail(errAuthentication("missing API key: send your weir key as x-api-key or Authorization: Bearer"))
		return
	}
	if apiErr := checkHeaders(r); apiErr != nil {
		fail(apiErr)
		return
	}
	ctx := r.Context()
	keyHash := hashKey(secret)
	key, err := s.keys.verify(ctx, keyHash)
	if err != nil {
		if errors.Is(err, errKeyRejected) {
			fail(errAuthentication("invalid API key"))
		} else {
			fail(errControlPlane())
		}
		return
	}
	q := r.URL.Query()
	models := q["model"]
	if len(models) > maxUsageModels {
		fail(errInvalidRequest("at most " + strconv.Itoa(maxUsageModels) + " model parameters"))
		return
	}
	for _, m := range models {
		if m == "" {
			fail(errInvalidRequest("model: empty"))
			return
		}
		if !modelpattern.Match(key.allowedModels, m) {
			fail(errModelNotAllowed(m))
			return
		}
	}
	var surfaces []weirv1.Surface
	for _, name := range q["surface"] {
		sf, ok := surfaceNamed(name)
		if !ok {
			fail(errInvalidRequest("surface: " + strconv.Quote(name) + " is not messages, responses or chat_completions"))
			return
		}
		surfaces = append(surfaces, sf)
	}
	id := keyHash + "?" + r.URL.RawQuery
	resp := s.standings.answer(id)
	if resp == nil {
		actx, cancel := context.WithTimeout(ctx, standingAsk)
		res, err := s.leases.KeyStanding(actx, connect.NewRequest(&weirv1.KeyStandingRequest{KeyHash: keyHash,
			Models: models, Surfaces: surfaces}))
		cancel()
		switch {
		case connect.CodeOf(err) == connect.CodePermissionDenied:
			if model, ok := modelNotAllowedIn(err); ok {
				fail(errModelNotAllowed(model))
				return
			}
			s.keys.forget(keyHash)
			fail(errAuthentication("invalid API key"))
			return
		case err != nil:
			if ctx.Err() == nil {
				s.cfg.Logger.WarnContext(ctx, "key standing failed", "request_id", requestID, "err", err)
			}
			fail(errControlPlane())
			return
		}
		resp = res.Msg
		s.standings.keepAnswer(id, resp)
	}
	body, _ := json.Marshal(standingJSONOf(resp))
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	w.Write(body) //nolint:errcheck // the client may be gone
}

// surfaceNamed is the surface a usage query names.
func surfaceNamed(name string) (weirv1.Surface, bool) {
	for _, sf := range []surface{surfaceMessages, surfaceResp, surfaceChat} {
		if sf.name == name {
			return sf.api, true
		}
	}
	return 0, false
}

// standingJSON is GET /v1/weir/usage's body (docs/wire.md).
type standingJSON struct {
	Object   string       `json:"object"`
	AsOf     time.Time    `json:"as_of"`
	TimeZone string       `json:"time_zone"`
	Usage    periodsJSON  `json:"usage"`
	Budgets  []budgetJSON `json:"budgets"`
	Models   []modelJSON  `json:"models"`
}

type periodsJSON struct {
	Today     *usagePeriodJSON `json:"today"`
	ThisWeek  *usagePeriodJSON `json:"this_week"`
	ThisMonth *usagePeriodJSON `json:"this_month"`
}

type usagePeriodJSON struct {
	Start          time.Time  `json:"start"`
	ResetsAt       time.Time  `json:"resets_at"`
	Requests       int64      `json:"requests"`
	Tokens         tokensJSON `json:"tokens"`
	CostUSD        float64    `json:"cost_usd"`
	UnpricedTokens int64      `json:"unpriced_tokens"`
}

type tokensJSON struct {
	Input         int64 `json:"input"`
	Output        int64 `json:"output"`
	CacheRead     int64 `json:"cache_read"`
	CacheCreation int64 `json:"cache_creation"`
	Reasoning     int64 `json:"reasoning"`
	Total         int64 `json:"total"`
}

type budgetJSON struct {
	Scope     string     `json:"scope"`
	Name      string     `json:"name"`
	Unit      string     `json:"unit"`
	Period    string     `json:"period"`
	Limit     float64    `json:"limit"`
	Spent     *float64   `json:"spent"`
	Remaining *float64   `json:"remaining"`
	ResetsAt  *time.Time `json:"resets_at"`
}

type modelJSON struct {
	Model           string      `json:"model"`
	Family          string      `json:"family,omitempty"`
	Surface         string      `json:"surface"`
	Path            string      `json:"path"`
	Providers       []string    `json:"providers"`
	CanServeNow     bool        `json:"can_serve_now"`
	Reason          string      `json:"reason,omitempty"`
	NextAvailableAt *time.Time  `json:"next_available_at"`
	OutOfQuota      bool        `json:"out_of_quota"`
	Windows         windowsJSON `json:"windows"`
}

type windowsJSON struct {
	FiveHour *windowJSON `json:"five_hour"`
	SevenDay *windowJSON `json:"seven_day"`
}

type windowJSON struct {
	UsedPercent float64    `json:"used_percent"`
	ResetsAt    *time.Time `json:"resets_at"`
	Accounts    int32      `json:"accounts"`
	Readings    int32      `json:"readings"`
}

// standingJSONOf lays a standing out as the endpoint's JSON.
func standingJSONOf(r *weirv1.KeyStandingResponse) standingJSON {
	out := standingJSON{Object: "weir.usage", AsOf: r.GetAsOf().AsTime().UTC(), TimeZone: r.GetTimeZone(),
		Budgets: []budgetJSON{}, Models: []modelJSON{}}
	for _, p := range r.GetUsage() {
		j := &usagePeriodJSON{Start: p.GetStart().AsTime().UTC(), ResetsAt: p.GetResetsAt().AsTime().UTC(),
			Requests: p.GetRequests(), CostUSD: p.GetCostUsd(), UnpricedTokens: p.GetUnpricedTokens(),
			Tokens: tokensJSON{Input: p.GetInputTokens(), Output: p.GetOutputTokens(), CacheRead: p.GetCacheReadTokens(),
				CacheCreation: p.GetCacheCreationTokens(), Reasoning: p.GetReasoningTokens()}}
		j.Tokens.Total = j.Tokens.Input + j.Tokens.Output + j.Tokens.CacheRead + j.Tokens.CacheCreation
		switch p.GetPeriod() {
		case "day":
			out.Usage.Today = j
		case "week":
			out.Usage.ThisWeek = j
		case "month":
			out.Usage.ThisMonth = j
		}
	}
	for _, b := range r.GetBudgets() {
		j := budgetJSON{Scope: b.GetScope(), Name: b.GetScopeName(), Limit: b.GetLimit().GetAmount(),
			Unit:   strings.TrimPrefix(strings.ToLower(b.GetLimit().GetUnit().String()), "budget_unit_"),
			Period: strings.TrimPrefix(strings.ToLower(b.GetLimit().GetPeriod().String()), "budget_period_")}
		if b.GetResetsAt() != nil {
			spent, remaining := b.GetSpent(), max(b.GetLimit().GetAmount()-b.GetSpent(), 0)
			at := b.GetResetsAt().AsTime().UTC()
			j.Spent, j.Remaining, j.ResetsAt = &spent, &remaining, &at
		}
		out.Budgets = append(out.Budgets, j)
	}
	for _, m := range r.GetModels() {
		j := modelJSON{Model: m.GetModel(), Family: m.GetFamily(), CanServeNow: m.GetAvailable(), OutOfQuota: m.GetOutOfQuota(),
			Providers: []string{}}
		for _, sf := range []surface{surfaceMessages, surfaceResp, surfaceChat} {
			if sf.api == m.GetSurface() {
				j.Surface, j.Path = sf.name, "/v1/"+strings.ReplaceAll(sf.name, "_", "/")
			}
		}
		for _, p := range m.GetProviders() {
			j.Providers = append(j.Providers, providerName(p))
		}
		if !m.GetAvailable() {
			j.Reason = strings.TrimPrefix(strings.ToLower(m.GetReason().String()), "no_account_reason_")
		}
		if t := m.GetAvailableAt(); t != nil && !m.GetAvailable() {
			at := t.AsTime().UTC()
			j.NextAvailableAt = &at
		}
		j.Windows.FiveHour, j.Windows.SevenDay = windowOf(m.GetFiveHour()), windowOf(m.GetSevenDay())
		out.Models = append(out.Models, j)
	}
	return out
}

func windowOf(w *weirv1.PooledWindow) *windowJSON {
	if w == nil {
		return nil
	}
	j := &windowJSON{UsedPercent: w.GetUsedPercent(), Accounts: w.GetAccounts(), Readings: w.GetReadings()}
	if t := w.GetResetsAt(); t != nil {
		at := t.AsTime().UTC()
		j.ResetsAt = &at
	}
	return j
}
