package controlplane

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// candidate is one account as routing sees it at one instant.
type candidate struct {
	account  db.Account
	live     int32        // unexpired leases
	cooldown *db.Cooldown // live cooldown, if any
	// gate is the live gate for the request's model family, if any: the
	// account is cooling for that family only. Unlike a cooldown, the
	// claim does not re-check it under the row lock: a gate written between
	// the view and the claim costs at most one more 429 of that family.
	gate *db.FamilyGate
	// fiveHour and sevenDay are the account's current account-wide
	// readings from the usage view; nil is no evidence (no reading, no
	// utilization, or a reset already passed), never 0.
	fiveHour, sevenDay *windowReading
}

// windowReading is one account-wide usage window as routing reads it.
type windowReading struct {
	utilization float64
	resetsAt    time.Time
}

// Usage thresholds. The unified headers saturate at 0.99, so a window at
// spentAt or above is spent; at nearLimitAt or above the account is near
// its limit and demoted.
const (
	spentAt     = 0.99
	nearLimitAt = 0.9
)

// live says whether the reading is still evidence at now.
func (w *windowReading) live(now time.Time) bool { return w != nil && w.resetsAt.After(now) }

// spentUntil is the latest reset among the account's spent account-wide
// windows (both must pass before it can serve), or zero when none is spent.
func (c candidate) spentUntil(now time.Time) time.Time { return c.latestResetAtOrAbove(spentAt, now) }

// nearUntil is when the account stops being near its limit: the latest
// reset among its windows at nearLimitAt or above; zero when it is not near.
func (c candidate) nearUntil(now time.Time) time.Time {
	return c.latestResetAtOrAbove(nearLimitAt, now)
}

// latestResetAtOrAbove is the latest reset among the live 5-hour and weekly
// readings at or above utilization u; zero when none is.
func (c candidate) latestResetAtOrAbove(u float64, now time.Time) time.Time {
	var until time.Time
	for _, w := range []*windowReading{c.fiveHour, c.sevenDay} {
		if w.live(now) && w.utilization >= u && w.resetsAt.After(until) {
			until = w.resetsAt
		}
	}
	return until
}

// The pool-liveness reserve: an account whose weekly headroom is below
// reserveHeadroom is demoted (with the near-limit accounts, in the same
// one partition) while its weekly reset is more than reserveRelease away,
// so that the pool keeps headroom back while others can absorb the load.
// Near the reset, use-it-or-lose-it wins and the reserve is released. Like
// every soft demotion it only orders: an account in reserve still serves
// when nothing else can. Above the near-limit margin (0.1) so that it
// means something of its own.
const (
	reserveHeadroom = 0.2
	reserveRelease  = 12 * time.Hour
)

// reserveUntil is when the account's reserve is released (its weekly reset
// less reserveRelease); zero when it is not held in reserve.
func (c candidate) reserveUntil(now time.Time) time.Time {
	w := c.sevenDay
	if !w.live(now) || w.utilization <= 1-reserveHeadroom {
		return time.Time{}
	}
	release := w.resetsAt.Add(-reserveRelease)
	if !release.After(now) {
		return time.Time{}
	}
	return release
}

// demotedUntil is when the account stops being softly demoted (near its
// limit or held in reserve): the later of the two; zero when it is not.
func (c candidate) demotedUntil(now time.Time) time.Time {
	near, reserve := c.nearUntil(now), c.reserveUntil(now)
	if reserve.After(near) {
		return reserve
	}
	return near
}

// capacity is the account's concurrency cap as the claim enforces it: one
// lease while a recovery probe is out.
func (c candidate) capacity() int32 {
	if c.account.RecoveryProbe {
		return 1
	}
	return c.account.MaxConcurrency
}

// routeRequest is what one Acquire asks for.
type routeRequest struct {
	model   string
	surface weirv1.Surface
	// breakerOpen are the providers whose overload breaker keeps this
	// request away (another provider of the surface may still serve).
	breakerOpen map[string]bool
	exclude     map[uuid.UUID]bool
	// unreadable are the accounts whose credential this Acquire could not
	// open: out of the pool, like a broken account.
	unreadable     map[uuid.UUID]bool
	sessionAccount uuid.UUID // uuid.Nil when the session is unbound
	// preferAccount goes first when eligible: a retry after an overload
	// returns to the account that has the conversation's prompt cache.
	preferAccount uuid.UUID
	// metered is how metered accounts may be spent: the key's setting
	// (meteredByKey), else the global one; UNSPECIFIED is normal.
	metered      weirv1.MeteredAccounts
	meteredByKey bool
}

// isMetered says whether an account is pay-per-token (an API key: Anthropic
// and OpenAI keys) rather than a subscription (an OAuth login).
func isMetered(a db.Account) bool { return a.AuthKind == enumName(weirv1.AuthKind_AUTH_KIND_API_KEY) }

// subscriptionSurfaces are the surfaces a subscription can serve: those
// with a provider that takes OAuth logins (Messages: Claude subscriptions;
// Responses: ChatGPT logins). Chat Completions has none.
var subscriptionSurfaces = func() map[weirv1.Surface]bool {
	out := map[weirv1.Surface]bool{}
	for sf, ps := range surfaceProviders {
		for _, p := range ps {
			if validProviderAuth(p, weirv1.AuthKind_AUTH_KIND_OAUTH) == nil {
				out[sf] = true
			}
		}
	}
	out[weirv1.Surface_SURFACE_UNSPECIFIED] = out[weirv1.Surface_SURFACE_MESSAGES]
	return out
}()

// withheld says whether metered_accounts=never keeps account a out of
// this request: a metered account, on a surface a subscription can serve.
func (req routeRequest) withheld(a db.Account) bool {
	return req.metered == weirv1.MeteredAccounts_METERED_ACCOUNTS_NEVER && isMetered(a) && subscriptionSurfaces[req.surface]
}

// lastResort says whether metered_accounts=last_resort ranks account a
// below every subscription for this request.
func (req routeRequest) lastResort(a db.Account) bool {
	return req.metered == weirv1.MeteredAccounts_METERED_ACCOUNTS_LAST_RESORT && isMetered(a) && subscriptionSurfaces[req.surface]
}

// meteredNever names the setting in a refusal it caused.
const meteredNever = "metered_accounts=never"

// spillFrom is where, in an order route() returned for req, leasing a
// metered account is a spill: past the last subscription account in the
// order, since every subscription before it (if any) could then not be
// claimed, and only when the surface is one a subscription serves and
// the pool as the key sees it (cands) has a subscription account for it
// at all, in whatever state. len(order) when nothing there is a spill.
func spillFrom(cands, order []candidate, req routeRequest) int {
	if !subscriptionSurfaces[req.surface] || !slices.ContainsFunc(cands, func(c candidate) bool {
		return serves(c.account.Provider, req.surface) && !isMetered(c.account)
	}) {
		return len(order)
	}
	from := 0
	for i, c := range order {
		if !isMetered(c.account) {
			from = i + 1
		}
	}
	return from
}

// surfaceProviders are the providers that serve each client protocol.
var surfaceProviders = map[weirv1.Surface][]weirv1.Provider{
	weirv1.Surface_SURFACE_MESSAGES:         {weirv1.Provider_PROVIDER_ANTHROPIC},
	weirv1.Surface_SURFACE_RESPONSES:        {weirv1.Provider_PROVIDER_CODEX, weirv1.Provider_PROVIDER_OPENAI},
	weirv1.Surface_SURFACE_CHAT_COMPLETIONS: {weirv1.Provider_PROVIDER_OPENAI},
}

// providersFor is the providers serving a surface; an unspecified surface
// is Anthropic's messages (workers older than the field).
func providersFor(sf weirv1.Surface) []weirv1.Provider {
	if sf == weirv1.Surface_SURFACE_UNSPECIFIED {
		sf = weirv1.Surface_SURFACE_MESSAGES
	}
	return surfaceProviders[sf]
}

// surfaceProviderNames is surfaceProviders by the providers' stored names,
// built once: serves runs for every account of every Acquire.
var surfaceProviderNames = func() map[weirv1.Surface]map[string]bool {
	out := map[weirv1.Surface]map[string]bool{}
	for sf, ps := range surfaceProviders {
		out[sf] = map[string]bool{}
		for _, p := range ps {
			out[sf][enumName(p)] = true
		}
	}
	out[weirv1.Surface_SURFACE_UNSPECIFIED] = out[weirv1.Surface_SURFACE_MESSAGES]
	return out
}()

// serves says whether an account's provider serves a request on surface.
func serves(provider string, sf weirv1.Surface) bool {
	return surfaceProviderNames[sf][provider]
}

// route orders the accounts that may serve req, best first, or says why
// there are none and when that may change. It is pure: the claim that
// follows re-checks eligibility under a row lock, so a stale view costs a
// retry, never a broken cap.
func route(cands []candidate, req routeRequest, now time.Time) ([]candidate, *weirv1.NoAccount) {
	eligible := make([]candidate, 0, len(cands))
	var (
		serving, disabled, tried, full, cooling int
		gated                                   int // cooling for the request's family only
		recoverable                             int // could serve again without an operator
		rejected                                int // holding a rejected credential
		unreadable                              int // holding a credential this replica cannot open
		withheld                                int // metered, kept out by metered_accounts=never
		soonest                                 time.Time
		// unreachable stays true while every recoverable account cools on
		// a transport failure (or was tried and does not cool: the worker
		// judges those by its own attempts); run is the one written last.
		unreachable = true
		run         *candidate
	)
	for _, c := range cands {
		a := c.account
		if !serves(a.Provider, req.surface) {
			continue
		}
		if req.breakerOpen[a.Provider] {
			// Its accounts answer, overloaded: the pool is not unreachable.
			unreachable = false
			continue
		}
		if req.withheld(a) {
			withheld++
			continue
		}
		serving++
		if a.Paused || a.BrokenAt != nil {
			disabled++
			continue
		}
		if req.unreadable[a.ID] {
			unreadable++
			continue
		}
		back, coolingNow, transient := c.blockedUntil(now)
		if !coolingNow || transient {
			recoverable++
			switch {
			case c.transportCooling(now):
				if run == nil || c.cooldown.WrittenAt.After(run.cooldown.WrittenAt) {
					run = &c
				}
			case req.exclude[a.ID] && !coolingNow:
			default:
				unreachable = false
			}
		} else {
			rejected++
		}
		if coolingNow && transient && (soonest.IsZero() || back.Before(soonest)) {
			// Tried accounts count too: the request will come back to them.
			soonest = back
		}
		switch {
		case req.exclude[a.ID]:
			tried++
		case coolingNow:
			cooling++
			if (c.cooldown == nil || !c.cooldown.Until.After(now)) && c.spentUntil(now).IsZero() {
				gated++
			}
		case c.live >= c.capacity():
			full++
		default:
			eligible = append(eligible, c)
		}
	}
	if len(eligible) > 0 {
		return rank(eligible, req, now), nil
	}
	none := &weirv1.NoAccount{Permanent: recoverable == 0, QuotaBlock: quotaBlock(cands, req, now)}
	if unreachable && run != nil {
		none.Unreachable = unreachableOf(*run.cooldown, run.account.Provider, run.account.BaseUrl)
	}
	if !soonest.IsZero() {
		none.RetryAt = timestamppb.New(soonest)
	}
	switch {
	case serving == 0 && withheld > 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED
		none.Message = "no subscription account in the pool serves this model"
	case serving == 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED
		none.Message = "no account in the pool serves this model"
	case full > 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY
		none.Message = fmt.Sprintf("all %d eligible accounts are at their concurrency cap", full)
		none.RetryAt = timestamppb.New(now.Add(time.Second))
	case tried > 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_TRIED
		none.Message = fmt.Sprintf("all %d eligible accounts were tried for this request", tried)
	case cooling > 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING
		none.Message = fmt.Sprintf("all %d accounts are cooling down", cooling)
		if gated > 0 {
			none.Message += fmt.Sprintf(" (%d gated for %s models only)", gated, modelFamily(req.model))
		}
		if none.Permanent {
			none.Message += " with rejected credentials"
		}
	case unreadable > 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED
		none.Message = fmt.Sprintf("no account can serve: %d with a credential this control plane cannot decrypt", unreadable)
		if disabled > 0 {
			none.Message += fmt.Sprintf(", %d paused or broken", disabled)
		}
	default:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED
		none.Message = fmt.Sprintf("all %d accounts are paused or broken", disabled)
	}
	if none.Permanent && rejected > 0 {
		none.Message = fmt.Sprintf("no account can serve until an operator acts: %d paused or broken, %d with a credential the upstream rejected", disabled, rejected)
		if unreadable > 0 {
			none.Message += fmt.Sprintf(", %d with a credential this control plane cannot decrypt", unreadable)
		}
	}
	if none.Permanent && unreadable > 0 {
		none.Message += unreadableFix
	}
	if withheld > 0 {
		whose := "the pool's setting"
		if req.meteredByKey {
			whose = "this key's setting"
		}
		none.Message += fmt.Sprintf("; %d metered accounts are not used where a subscription can serve (%s, %s)", withheld, meteredNever, whose)
	}
	if none.RetryAt != nil && none.Reason != weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY {
		none.Message += "; the first recovers at " + none.RetryAt.AsTime().UTC().Format(time.RFC3339)
	}
	return nil, none
}

// unreadableFix ends a permanent answer when credentials do not open: the
// cause and what an operator does about it.
const unreadableFix = " (WEIR_SECRET_KEY is not the key they were sealed with: set that key as WEIR_SECRET_KEY," +
	" or add it to WEIR_SECRET_KEY_PREVIOUS and run 'weir secrets rotate'; or re-enter the credentials)"

// blockedUntil says whether the account is cooling for this request (a
// live cooldown, a live gate for the request's family, or a usage view
// that shows its 5-hour or weekly window spent), whether that passes on
// its own, and when it is expected to: the latest of the deadlines, since
// all must pass.
func (c candidate) blockedUntil(now time.Time) (until time.Time, blocked, transient bool) {
	transient = true
	if c.cooldown != nil && c.cooldown.Until.After(now) {
		until, blocked, transient = c.cooldown.Until, true, c.cooldown.Transient
	}
	if spent := c.spentUntil(now); !spent.IsZero() {
		// Routing stops sending into a wall of 429s: a spent window is a
		// cooldown until its reset, recovering on its own.
		blocked = true
		if spent.After(until) {
			until = spent
		}
	}
	if c.gate != nil && c.gate.Until.After(now) {
		blocked = true
		if c.gate.Until.After(until) {
			until = c.gate.Until
		}
	}
	return until, blocked, transient
}

// quotaEvidence is the quota evidence that blocks an account: either its
// reset covers the account's blocking deadline, so the account reopens
// exactly when the quota does, or it names no reset at all.
type quotaEvidence struct {
	// resetsAt is zero when the evidence names no reset (insufficient_quota,
	// out of credits, a rejection without a usable reset): the account
	// stays out until an operator acts or a new billing period begins, as
	// far as anyone can tell.
	resetsAt      time.Time
	windowMinutes int32
	kind          weirv1.QuotaKind
	message       string
	// spent, for a spent window of the usage view, is its utilization: the
	// message is written only for the account a block names.
	spent float64
}

// text is the evidence as one line.
func (e quotaEvidence) text() string {
	if e.message == "" && e.spent > 0 {
		return fmt.Sprintf("usage view: %d-minute window at %.0f%%", e.windowMinutes, e.spent*100)
	}
	return e.message
}

// quotaUntil says whether the account is blocked by quota evidence, and
// which: a live cooldown whose quota evidence names no reset (then no
// other evidence of the account tells when it is back), or evidence whose
// reset covers its blocking deadline (the latest of its cooldown, spent
// windows and family gate, as blockedUntil reads them). A cooldown that
// outlasts its quota (a backoff, a burst's Retry-After) is not covered:
// waiting for the quota would not be enough.
func (c candidate) quotaUntil(now time.Time) (quotaEvidence, bool) {
	until, blocked, transient := c.blockedUntil(now)
	if !blocked || !transient {
		return quotaEvidence{}, false
	}
	cd := c.cooldown
	if cd != nil && (!cd.Until.After(now) || cd.QuotaKind == nil) {
		cd = nil
	}
	if cd != nil && cd.QuotaResetsAt == nil {
		return quotaEvidence{windowMinutes: cd.QuotaWindowMinutes, kind: enumValue[weirv1.QuotaKind](*cd.QuotaKind),
			message: cd.QuotaMessage}, true
	}
	var best quotaEvidence
	consider := func(e quotaEvidence) {
		if e.resetsAt.After(best.resetsAt) || (e.resetsAt.Equal(best.resetsAt) && e.windowMinutes > best.windowMinutes) {
			best = e
		}
	}
	if cd != nil {
		consider(quotaEvidence{resetsAt: *cd.QuotaResetsAt, windowMinutes: cd.QuotaWindowMinutes,
			kind: enumValue[weirv1.QuotaKind](*cd.QuotaKind), message: cd.QuotaMessage})
	}
	for _, w := range []struct {
		r       *windowReading
		minutes int32
	}{{c.fiveHour, 300}, {c.sevenDay, 10080}} {
		if w.r.live(now) && w.r.utilization >= spentAt {
			consider(quotaEvidence{resetsAt: w.r.resetsAt, windowMinutes: w.minutes, spent: w.r.utilization,
				kind: usageViewKind(c.account.Provider)})
		}
	}
	if g := c.gate; g != nil && g.Until.After(now) && gateOnReset(g) {
		consider(quotaEvidence{resetsAt: g.Until, windowMinutes: 10080, kind: weirv1.QuotaKind_QUOTA_KIND_FAMILY_WINDOW,
			message: "model family weekly window spent (" + g.Family + ")"})
	}
	// Deadlines are stored to the microsecond, resets to the second.
	if best.resetsAt.IsZero() || best.resetsAt.Before(until.Add(-time.Second)) {
		return quotaEvidence{}, false
	}
	best.resetsAt = until
	return best, true
}

// usageViewKind is the quota kind of a spent window the usage view shows
// for an account of provider.
func usageViewKind(provider string) weirv1.QuotaKind {
	if provider == providerCodex {
		return weirv1.QuotaKind_QUOTA_KIND_CODEX_USAGE_LIMIT
	}
	return weirv1.QuotaKind_QUOTA_KIND_ANTHROPIC_WINDOW
}

// gateOnReset says whether a family gate ends on the reset of the scoped
// claim that set it; a gate that ends on a Retry-After or the default has
// no quota reset behind it.
func gateOnReset(g *db.FamilyGate) bool {
	var e storedEvidence
	if json.Unmarshal(g.Evidence, &e) != nil {
		return false
	}
	for _, c := range e.Claims {
		if c.Reset == g.Until.Unix() {
			return true
		}
	}
	return false
}

// quotaBlock says whether every eligible account for the request (the
// whole pool under the same filters as selection: provider, breaker,
// metered_accounts=never; not
// the accounts paused, broken or holding a rejected credential, which are
// not eligible at all) is blocked by quota evidence, and if so describes
// the one that reopens first: the earliest known reset, or when none is
// known, the first account. Any account that could serve, is busy, or is
// out for another reason means no.
func quotaBlock(cands []candidate, req routeRequest, now time.Time) *weirv1.QuotaBlock {
	var (
		first        quotaEvidence
		firstOf      candidate
		n, noReset   int32
		firstUnknown = true
	)
	for _, c := range cands {
		a := c.account
		if !serves(a.Provider, req.surface) || req.breakerOpen[a.Provider] || req.withheld(a) || a.Paused || a.BrokenAt != nil || req.unreadable[a.ID] {
			continue
		}
		if _, blocked, transient := c.blockedUntil(now); blocked && !transient {
			continue // a rejected credential: only an operator brings it back
		}
		e, ok := c.quotaUntil(now)
		if !ok {
			return nil
		}
		n++
		unknown := e.resetsAt.IsZero()
		if unknown {
			noReset++
		}
		if n == 1 || (firstUnknown && !unknown) || (!unknown && e.resetsAt.Before(first.resetsAt)) {
			first, firstOf, firstUnknown = e, c, unknown
		}
	}
	if n == 0 {
		return nil
	}
	qb := &weirv1.QuotaBlock{
		WindowMinutes:        first.windowMinutes,
		Provider:             enumValue[weirv1.Provider](firstOf.account.Provider),
		LastUpstreamError:    first.text(),
		Accounts:             n,
		Kind:                 first.kind,
		AccountsWithoutReset: noReset,
	}
	if !firstUnknown {
		qb.ResetsAt = timestamppb.New(first.resetsAt)
	}
	return qb
}

// reopensFirst says whether block a reopens before b: a known reset before
// a later one, any known reset before none.
func reopensFirst(a, b *weirv1.QuotaBlock) bool {
	switch {
	case a.ResetsAt == nil:
		return false
	case b.ResetsAt == nil:
		return true
	}
	return a.ResetsAt.AsTime().Before(b.ResetsAt.AsTime())
}

// rankKey is one candidate's place in the ranking, computed once: the
// comparison then reads small values instead of recomputing the usage
// view's deadlines, and the sort moves indices instead of whole accounts.
type rankKey struct {
	idx int
	// lastResort: a metered account under metered_accounts=last_resort,
	// ranked after every subscription.
	lastResort bool
	first      int // 0: the preferred account, 1: the session's, 2: any other
	priority   int32
	tier       int
	// weeklyReset and weeklyUtil order tierWeekly; demoted orders
	// tierDemoted.
	weeklyReset time.Time
	weeklyUtil  float64
	demoted     time.Time
	live, cap   int32
	lastUsed    *time.Time
}

// rank orders the eligible candidates by compareRankKeys, stably.
func rank(cands []candidate, req routeRequest, now time.Time) []candidate {
	keys := make([]rankKey, len(cands))
	for i, c := range cands {
		k := rankKey{idx: i, lastResort: req.lastResort(c.account), first: 2, priority: c.account.Priority,
			tier: harvestTier(c, now), live: c.live, cap: c.account.MaxConcurrency, lastUsed: c.account.LastUsedAt}
		switch {
		case req.preferAccount != uuid.Nil && c.account.ID == req.preferAccount:
			k.first = 0
		case req.sessionAccount != uuid.Nil && c.account.ID == req.sessionAccount:
			k.first = 1
		}
		switch k.tier {
		case tierWeekly:
			k.weeklyReset, k.weeklyUtil = c.sevenDay.resetsAt, c.sevenDay.utilization
		case tierDemoted:
			k.demoted = c.demotedUntil(now)
		}
		keys[i] = k
	}
	slices.SortStableFunc(keys, compareRankKeys)
	out := make([]candidate, len(cands))
	for i, k := range keys {
		out[i] = cands[k.idx]
	}
	return out
}

// compareRankKeys ranks: under metered_accounts=last_resort, every
// subscription before every metered account (even a session's own, which
// a subscription takes back as soon as one can serve); the request's
// preferred account, then the session's own (its prompt cache lives
// there); then operator priority, an
// override applied before HARVEST (an operator who ranks accounts means it,
// whatever their windows); then one stable partition over the soft
// demotions at once (near limit: a 5-hour or weekly window at 0.9 or
// above; the pool-liveness reserve: weekly headroom under reserveHeadroom
// with the weekly reset more than reserveRelease away; both go after every
// other account); then HARVEST: accounts with a
// weekly reading, the weekly window that resets soonest first (its
// headroom is lost at the reset otherwise), ties by more weekly headroom,
// never a 5-hour term; then accounts without evidence; demoted accounts
// by when they stop being demoted. Then the most free share of the
// concurrency cap, then the least recently used.
func compareRankKeys(x, y rankKey) int {
	if x.lastResort != y.lastResort {
		if x.lastResort {
			return 1
		}
		return -1
	}
	if c := cmp.Compare(x.first, y.first); c != 0 {
		return c
	}
	if c := cmp.Compare(y.priority, x.priority); c != 0 {
		return c
	}
	if c := cmp.Compare(x.tier, y.tier); c != 0 {
		return c
	}
	switch x.tier {
	case tierWeekly:
		if c := x.weeklyReset.Compare(y.weeklyReset); c != 0 {
			return c
		}
		if c := cmp.Compare(x.weeklyUtil, y.weeklyUtil); c != 0 {
			return c
		}
	case tierDemoted:
		if c := x.demoted.Compare(y.demoted); c != 0 {
			return c
		}
	}
	if c := cmp.Compare(int64(x.live)*int64(y.cap), int64(y.live)*int64(x.cap)); c != 0 {
		return c
	}
	return compareTimes(x.lastUsed, y.lastUsed)
}

// Harvest tiers, best first.
const (
	tierWeekly  = iota // a weekly reading, not near the limit
	tierUnknown        // no weekly evidence, not near the limit
	tierDemoted        // near the limit or held in reserve (the soft demotions)
)

func harvestTier(c candidate, now time.Time) int {
	switch {
	case !c.demotedUntil(now).IsZero():
		return tierDemoted
	case c.sevenDay.live(now):
		return tierWeekly
	}
	return tierUnknown
}

// compareTimes orders never-used first, then oldest.
func compareTimes(x, y *time.Time) int {
	switch {
	case x == nil && y == nil:
		return 0
	case x == nil:
		return -1
	case y == nil:
		return 1
	}
	return x.Compare(*y)
}
