package policy

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Candidate is one account as routing sees it at one instant.
type Candidate struct {
	Account Account
	Live    int32 // unexpired leases
	// WaitingAhead counts the requests waiting for a place on the account
	// since before this one (held requests are served in turn): places
	// promised to them. Waiting counts every other live waiter.
	WaitingAhead, Waiting int32
	Cooldown              *Cooldown // live cooldown, if any
	// Gate is the live gate for the request's model family, if any: the
	// account is cooling for that family only. Unlike a cooldown, the
	// claim does not re-check it under the row lock: a gate written between
	// the view and the claim costs at most one more 429 of that family.
	Gate *Gate
	// FiveHour and SevenDay are the account's current account-wide
	// readings from the usage view; nil is no evidence (no reading, no
	// utilization, or a reset already passed), never 0.
	FiveHour, SevenDay *Window
}

// Account is what routing reads of an account.
type Account struct {
	ID uuid.UUID
	// Label is the operator's name for the account; routing never reads
	// it.
	Label    string
	Provider weirv1.Provider
	AuthKind weirv1.AuthKind
	// BaseURL is where the account's requests go: its override, else its
	// provider's default.
	BaseURL string
	// Paused: by an operator; Broken: marked broken (a credential the
	// upstream rejected, or one no replica could open).
	Paused, Broken bool
	// RecoveryProbe: the account is on its one recovery probe.
	RecoveryProbe  bool
	MaxConcurrency int32
	Priority       int32
	LastUsedAt     *time.Time
	// OverloadedAt is when the account last answered overloaded, nil once
	// it succeeded since.
	OverloadedAt *time.Time
	// OwnerKey and OwnerTeam own the account when it is a seat (an OAuth
	// subscription kept for a client key, or for every key of a team); at
	// most one is set, uuid.Nil when none.
	OwnerKey, OwnerTeam uuid.UUID
}

// overloadedRecently says whether the account answered overloaded within
// AnsweringWindow and not since succeeded: routing tries it after the
// accounts that answer.
func (a Account) overloadedRecently(now time.Time) bool {
	return a.OverloadedAt != nil && now.Sub(*a.OverloadedAt) < AnsweringWindow
}

// Cooldown is an account's live cooldown.
type Cooldown struct {
	Reason weirv1.CooldownReason
	// Transient: it passes on its own (every reason but a rejected
	// credential).
	Transient bool
	Until     time.Time
	WrittenAt time.Time
	// Evidence is the stored evidence, JSON (Evidence).
	Evidence []byte
	// Quota is the quota evidence behind the deadline; nil when none.
	Quota *QuotaRecord
}

// Gate is an account's live gate for one model family.
type Gate struct {
	Family    string
	Until     time.Time
	WrittenAt time.Time
	Evidence  []byte
}

// Window is one account-wide usage window as routing reads it.
type Window struct {
	Utilization float64
	ResetsAt    time.Time
}

// Usage thresholds. The unified headers saturate at 0.99, so a window at
// SpentAt or above is spent; at nearLimitAt or above the account is near
// its limit and demoted.
const (
	SpentAt     = 0.99
	nearLimitAt = 0.9
)

// live says whether the reading is still evidence at now.
func (w *Window) live(now time.Time) bool { return w != nil && w.ResetsAt.After(now) }

// spentUntil is the latest reset among the account's spent account-wide
// windows (both must pass before it can serve), or zero when none is spent.
func (c *Candidate) spentUntil(now time.Time) time.Time { return c.usageAt(now).spent }

// usage is what an account's live 5-hour and weekly readings say at one
// instant, each read once: routing asks it of every account of the pool on
// every Acquire, for its block (spent) and then its rank (near).
type usage struct {
	// spent is spentUntil; near is when the account stops being near its
	// limit: the latest reset among its windows at nearLimitAt or above.
	// Zero when none is.
	spent, near time.Time
}

// usageAt reads the account's windows at now.
func (c *Candidate) usageAt(now time.Time) usage {
	var u usage
	// The two windows by hand, not a loop over a slice of them.
	u.read(c.FiveHour, now)
	u.read(c.SevenDay, now)
	return u
}

// read takes one window into u (spent implies near: SpentAt is above
// nearLimitAt).
func (u *usage) read(w *Window, now time.Time) {
	if !w.live(now) || w.Utilization < nearLimitAt {
		return
	}
	if w.ResetsAt.After(u.near) {
		u.near = w.ResetsAt
	}
	if w.Utilization >= SpentAt && w.ResetsAt.After(u.spent) {
		u.spent = w.ResetsAt
	}
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
func (c *Candidate) reserveUntil(now time.Time) time.Time {
	w := c.SevenDay
	if !w.live(now) || w.Utilization <= 1-reserveHeadroom {
		return time.Time{}
	}
	release := w.ResetsAt.Add(-reserveRelease)
	if !release.After(now) {
		return time.Time{}
	}
	return release
}

// demotedUntil is when the account stops being softly demoted (near its
// limit or held in reserve): the later of the two; zero when it is not. u
// is its usage at now.
func (c *Candidate) demotedUntil(now time.Time, u usage) time.Time {
	near, reserve := u.near, c.reserveUntil(now)
	if reserve.After(near) {
		return reserve
	}
	return near
}

// capacity is the account's concurrency cap as the claim enforces it: one
// lease while a recovery probe is out.
func (c *Candidate) capacity() int32 {
	if c.Account.RecoveryProbe {
		return 1
	}
	return c.Account.MaxConcurrency
}

// RouteRequest is what one Acquire asks for.
type RouteRequest struct {
	Model   string
	Surface weirv1.Surface
	// BreakerOpen are the providers whose overload breaker keeps this
	// request away (another provider of the surface may still serve).
	BreakerOpen map[weirv1.Provider]bool
	Exclude     map[uuid.UUID]bool
	// Unreadable are the accounts whose credential this Acquire could not
	// open: out of the pool, like a broken account.
	Unreadable     map[uuid.UUID]bool
	SessionAccount uuid.UUID // uuid.Nil when the session is unbound
	// PreferAccount goes first when eligible: a retry after an overload
	// returns to the account that has the conversation's prompt cache.
	PreferAccount uuid.UUID
	// Metered is how metered accounts may be spent: the key's setting
	// (MeteredByKey), else the global one; UNSPECIFIED is normal.
	Metered      weirv1.MeteredAccounts
	MeteredByKey bool
	// Key and Team are the requesting client key and its team (uuid.Nil
	// when it has none): a key owns the seats owned by it or by its team.
	// Owned is the owned_accounts setting; UNSPECIFIED is shared.
	Key, Team uuid.UUID
	Owned     weirv1.OwnedAccounts
}

// Where an account ranks for a request by whose seat it is (seatOf), best
// first.
const (
	seatOwn    = iota // the requesting key's own seat
	seatTeam          // a seat of the key's team
	seatNone          // an account without an owner
	seatOthers        // another key's or team's seat
)

// seatOf is whose account a is, as req sees it.
func (req *RouteRequest) seatOf(a *Account) int {
	switch {
	case a.OwnerKey == uuid.Nil && a.OwnerTeam == uuid.Nil:
		return seatNone
	case a.OwnerKey != uuid.Nil && a.OwnerKey == req.Key:
		return seatOwn
	case a.OwnerTeam != uuid.Nil && a.OwnerTeam == req.Team:
		return seatTeam
	}
	return seatOthers
}

// keptAway says whether owned_accounts=owners_only keeps account a out of
// this request: another key's or team's seat. Such an account is not in
// the pool as this request sees it at all: it is neither eligible nor
// counted in any answer (the reason, the soonest recovery, the quota
// block, the accounts a held request waits for).
func (req *RouteRequest) keptAway(a *Account) bool {
	return req.Owned == weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY && req.seatOf(a) == seatOthers
}

// OwnersOnly names the setting in an answer it shaped.
const OwnersOnly = "owned_accounts=owners_only"

// IsMetered says whether an account is pay-per-token (an API key: Anthropic
// and OpenAI keys) rather than a subscription (an OAuth login).
func IsMetered(a Account) bool { return a.AuthKind == weirv1.AuthKind_AUTH_KIND_API_KEY }

// subscriptionSurfaces are the surfaces a subscription can serve: those
// with a provider that takes OAuth logins (Messages: Claude subscriptions;
// Responses: ChatGPT logins). Chat Completions has none.
var subscriptionSurfaces = func() map[weirv1.Surface]bool {
	out := map[weirv1.Surface]bool{}
	for sf, ps := range surfaceProviders {
		for _, p := range ps {
			if slices.Contains(AuthKinds(p), weirv1.AuthKind_AUTH_KIND_OAUTH) {
				out[sf] = true
			}
		}
	}
	out[weirv1.Surface_SURFACE_UNSPECIFIED] = out[weirv1.Surface_SURFACE_MESSAGES]
	return out
}()

// withheld says whether metered_accounts=never keeps account a out of
// this request: a metered account, on a surface a subscription can serve.
func (req *RouteRequest) withheld(a *Account) bool {
	return req.Metered == weirv1.MeteredAccounts_METERED_ACCOUNTS_NEVER && IsMetered(*a) && subscriptionSurfaces[req.Surface]
}

// lastResort says whether metered_accounts=last_resort ranks the metered
// accounts below every subscription for this request: on a surface a
// subscription can serve.
func (req *RouteRequest) lastResort() bool {
	return req.Metered == weirv1.MeteredAccounts_METERED_ACCOUNTS_LAST_RESORT && subscriptionSurfaces[req.Surface]
}

// MeteredNever names the setting in a refusal it caused.
const MeteredNever = "metered_accounts=never"

// SpillFrom is where, in an order Route returned for req, leasing a
// metered account is a spill: past the last subscription account in the
// order, since every subscription before it (if any) could then not be
// claimed, and only when the surface is one a subscription serves and
// the pool as the key sees it (cands) has a subscription account for it
// at all, in whatever state. len(order) when nothing there is a spill.
func SpillFrom(cands, order []Candidate, req RouteRequest) int {
	if !subscriptionSurfaces[req.Surface] || !slices.ContainsFunc(cands, func(c Candidate) bool {
		return Serves(c.Account.Provider, req.Surface) && !IsMetered(c.Account) && !req.keptAway(&c.Account)
	}) {
		return len(order)
	}
	from := 0
	for i, c := range order {
		if !IsMetered(c.Account) {
			from = i + 1
		}
	}
	return from
}

// AuthKinds are the kinds of account weir can serve for provider:
// Anthropic API keys and OAuth logins, OpenAI API keys (and
// OpenAI-compatible endpoints), and ChatGPT logins on the Codex backend.
// None for a provider it does not know.
func AuthKinds(p weirv1.Provider) []weirv1.AuthKind {
	switch p {
	case weirv1.Provider_PROVIDER_ANTHROPIC:
		return []weirv1.AuthKind{weirv1.AuthKind_AUTH_KIND_API_KEY, weirv1.AuthKind_AUTH_KIND_OAUTH}
	case weirv1.Provider_PROVIDER_OPENAI:
		return []weirv1.AuthKind{weirv1.AuthKind_AUTH_KIND_API_KEY}
	case weirv1.Provider_PROVIDER_CODEX:
		return []weirv1.AuthKind{weirv1.AuthKind_AUTH_KIND_OAUTH}
	}
	return nil
}

// surfaceProviders are the providers that serve each client protocol.
var surfaceProviders = map[weirv1.Surface][]weirv1.Provider{
	weirv1.Surface_SURFACE_MESSAGES:         {weirv1.Provider_PROVIDER_ANTHROPIC},
	weirv1.Surface_SURFACE_RESPONSES:        {weirv1.Provider_PROVIDER_CODEX, weirv1.Provider_PROVIDER_OPENAI},
	weirv1.Surface_SURFACE_CHAT_COMPLETIONS: {weirv1.Provider_PROVIDER_OPENAI},
}

// ProvidersFor is the providers serving a surface; an unspecified surface
// is Anthropic's messages (workers older than the field).
func ProvidersFor(sf weirv1.Surface) []weirv1.Provider {
	if sf == weirv1.Surface_SURFACE_UNSPECIFIED {
		sf = weirv1.Surface_SURFACE_MESSAGES
	}
	return surfaceProviders[sf]
}

// servedBy is surfaceProviders as sets, built once: Serves runs for every
// account of every Acquire.
var servedBy = func() map[weirv1.Surface]providerSet {
	out := map[weirv1.Surface]providerSet{}
	for sf, ps := range surfaceProviders {
		for _, p := range ps {
			out[sf] |= 1 << p
		}
	}
	out[weirv1.Surface_SURFACE_UNSPECIFIED] = out[weirv1.Surface_SURFACE_MESSAGES]
	return out
}()

// providerSet is a set of providers, one bit each: the providers are
// numbered from 0, far fewer than 64.
type providerSet uint64

func (s providerSet) has(p weirv1.Provider) bool { return p >= 0 && p < 64 && s&(1<<p) != 0 }

// Serves says whether an account of provider serves a request on surface.
func Serves(provider weirv1.Provider, sf weirv1.Surface) bool {
	return servedBy[sf].has(provider)
}

// WaitPoll is how soon a request refused at capacity asks again: a place
// that frees goes to the request that waited longest within about that.
const WaitPoll = time.Second

// WaitingFor are the accounts req waits for when Route answered that
// every eligible account is at its cap: those Route counted full. Pure.
func WaitingFor(cands []Candidate, req RouteRequest, now time.Time) []uuid.UUID {
	var out []uuid.UUID
	route(cands, req, now, 1, func(c *Candidate) { out = append(out, c.Account.ID) })
	return out
}

// Route orders the accounts that may serve req, best first, or says why
// there are none and when that may change. It is pure: the claim that
// follows re-checks eligibility under a row lock, so a stale view costs a
// retry, never a broken cap.
func Route(cands []Candidate, req RouteRequest, now time.Time) ([]Candidate, *weirv1.NoAccount) {
	o, none := route(cands, req, now, 0, nil)
	return o.First, none
}

// Order is what Route answers when some account may serve.
type Order struct {
	// First are the best eligible accounts, best first: every eligible
	// account when all were asked for, else at most k of them.
	First []Candidate
	// SpillFrom is where, in First, leasing a metered account is a spill
	// (SpillFrom's meaning over the whole order): len(First) when none
	// in First is, which is so whenever an eligible subscription account
	// ranks after First.
	SpillFrom int
}

// RouteFirst is Route ranking only the best k eligible accounts (k <= 0:
// all of them). Pure.
//
// The claim that follows takes the first account it can, almost always
// the first: ranking a pool of 10,000 to claim one is waste. The best k
// are chosen in one pass over the eligible accounts (a bounded heap) and
// only they are sorted, ties broken by the pool's order as Route's stable
// sort breaks them, so First is exactly Route's order cut at k.
func RouteFirst(cands []Candidate, req RouteRequest, now time.Time, k int) (Order, *weirv1.NoAccount) {
	return route(cands, req, now, k, nil)
}

// route is RouteFirst; onFull, when set, is told each account it counts
// full.
func route(cands []Candidate, req RouteRequest, now time.Time, k int, onFull func(*Candidate)) (Order, *weirv1.NoAccount) {
	r := ranking{req: req, now: now, lastResort: req.lastResort(), k: k, cands: cands}
	t := tallyOf(cands, req, now, onFull, &r)
	if r.eligible > 0 {
		o := Order{First: r.order()}
		o.SpillFrom = t.spillFrom(o.First, req)
		return o, nil
	}
	none := t.explain(req, now)
	none.QuotaBlock = QuotaBlock(cands, req, now)
	return Order{}, none
}

// tally is why the accounts of a request's pool are out, counted: what
// routing knows of a pool with no eligible account before it says so.
type tally struct {
	serving, disabled, tried, full, cooling int
	gated                                   int // cooling for the request's family only
	recoverable                             int // could serve again without an operator
	rejected                                int // holding a rejected credential
	unreadable                              int // holding a credential this replica cannot open
	withheld                                int // metered, kept out by metered_accounts=never
	kept                                    int // others' seats, kept out by owned_accounts=owners_only
	// soonest is when the first account that cools and recovers on its own
	// recovers (tried accounts count too: the request will come back to
	// them); zero when none does.
	soonest time.Time
	// unreachable stays true while every recoverable account cools on a
	// transport failure (or was tried and does not cool: the worker
	// judges those by its own attempts); run is the one written last.
	unreachable bool
	run         *Candidate
	// againNow: an account this request tried answered, and nothing keeps
	// it out: it may serve the next round, so no cooling account's
	// deadline is the pool's soonest recovery.
	againNow bool
	// ahead counts the places at full accounts promised to requests held
	// longer.
	ahead int32
	// subscription: the pool as the request sees it has a subscription
	// account of a provider serving the surface, in whatever state;
	// subscriptionsEligible counts those that are eligible (SpillFrom).
	subscription          bool
	subscriptionsEligible int
}

// spillFrom is SpillFrom over the whole order Route gives, told from its
// first accounts alone: the tally counted the eligible subscription
// accounts, so whether one ranks after first is known without ranking it.
func (t *tally) spillFrom(first []Candidate, req RouteRequest) int {
	if !t.subscription || !subscriptionSurfaces[req.Surface] {
		return len(first)
	}
	from, subscriptions := subscriptionsIn(first)
	if subscriptions < t.subscriptionsEligible {
		return len(first) // a subscription ranks after first: none in it is a spill
	}
	return from
}

// subscriptionsIn counts the subscription accounts in first and says
// where the last of them ends (0: none): past it, first is all metered.
func subscriptionsIn(first []Candidate) (from, subscriptions int) {
	for i := range first {
		if !IsMetered(first[i].Account) {
			from = i + 1
			subscriptions++
		}
	}
	return from, subscriptions
}

// tallyOf sorts the pool's accounts into the eligible ones, which it hands
// to r as it finds them (while the account is in the cache: the pool is
// larger than it), and the counts of why the others are out; onFull, when
// set, is told each account it counts full. Pure.
func tallyOf(cands []Candidate, req RouteRequest, now time.Time, onFull func(*Candidate), r *ranking) tally {
	t := tally{unreachable: true}
	// What is the same for every account, read once: each map lookup here
	// would otherwise run for every account of the pool on every Acquire.
	served := servedBy[req.Surface]
	withhold := req.Metered == weirv1.MeteredAccounts_METERED_ACCOUNTS_NEVER && subscriptionSurfaces[req.Surface] // req.withheld, less the account's part
	breakerOpen, unreadable, exclude := len(req.BreakerOpen) > 0, len(req.Unreadable) > 0, len(req.Exclude) > 0
	for i := range cands {
		// By pointer: a Candidate is large, and this runs over every
		// account of the pool on every Acquire.
		c := &cands[i]
		a := &c.Account
		if !served.has(a.Provider) {
			continue
		}
		if req.keptAway(a) {
			// Before anything is counted: another owner's seat is no part
			// of this request's pool, whatever its state.
			t.kept++
			continue
		}
		metered := IsMetered(*a)
		t.subscription = t.subscription || !metered
		if breakerOpen && req.BreakerOpen[a.Provider] {
			// Its accounts answer, overloaded: the pool is not unreachable.
			t.unreachable = false
			continue
		}
		if withhold && metered {
			t.withheld++
			continue
		}
		t.serving++
		if a.Paused || a.Broken {
			t.disabled++
			continue
		}
		if unreadable && req.Unreadable[a.ID] {
			t.unreadable++
			continue
		}
		excluded := exclude && req.Exclude[a.ID]
		u := c.usageAt(now)
		back, coolingNow, transient := c.blockedBy(now, u)
		if !coolingNow || transient {
			t.recoverable++
			switch {
			case c.transportCooling(now):
				if t.run == nil || c.Cooldown.WrittenAt.After(t.run.Cooldown.WrittenAt) {
					t.run = c
				}
			case excluded && !coolingNow:
			default:
				t.unreachable = false
			}
		} else {
			t.rejected++
		}
		if coolingNow && transient && (t.soonest.IsZero() || back.Before(t.soonest)) {
			t.soonest = back
		}
		switch {
		case excluded:
			t.tried++
			t.againNow = t.againNow || !coolingNow
		case coolingNow:
			t.cooling++
			if (c.Cooldown == nil || !c.Cooldown.Until.After(now)) && u.spent.IsZero() {
				t.gated++
			}
		case c.Live+c.WaitingAhead >= c.capacity():
			// At its cap, counting the places of the requests held longer:
			// a place that frees goes to the one that waited longest.
			t.full++
			t.ahead += c.WaitingAhead
			if onFull != nil {
				onFull(c)
			}
		default:
			r.add(c, int32(i), u)
			if !metered {
				t.subscriptionsEligible++
			}
		}
	}
	return t
}

// explain is the answer a tally with no eligible account gives: why
// nothing can serve, in words, whether only an operator can help, whether
// the pool is unreachable, and when the first account may serve again.
// The pool's quota block is the caller's (QuotaBlock). Pure.
func (t tally) explain(req RouteRequest, now time.Time) *weirv1.NoAccount {
	none := &weirv1.NoAccount{Permanent: t.recoverable == 0}
	if t.unreachable && t.run != nil {
		none.Unreachable = Unreachable(*t.run.Cooldown, t.run.Account.BaseURL)
	}
	if !t.soonest.IsZero() && !t.againNow {
		// The pool's verdict, never one account's: the soonest any account
		// that could serve recovers. A tried account that does not cool
		// recovers after the worker's backoff, whatever the others wait for.
		none.RetryAt = timestamppb.New(t.soonest)
	}
	switch {
	case t.serving == 0 && t.withheld == 0 && t.kept > 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED
		none.Message = fmt.Sprintf("no account this key may use serves this model: %d are seats kept for their owners (%s)", t.kept, OwnersOnly)
	case t.serving == 0 && t.withheld > 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED
		none.Message = "no subscription account in the pool serves this model"
		if t.kept > 0 {
			none.Message = fmt.Sprintf("no subscription account this key may use serves this model: %d are seats kept for their owners (%s)", t.kept, OwnersOnly)
		}
	case t.serving == 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED
		none.Message = "no account in the pool serves this model"
	case t.full > 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY
		none.Message = fmt.Sprintf("all %d eligible accounts are at their concurrency cap", t.full)
		if t.ahead > 0 {
			none.Message += fmt.Sprintf("; %d requests held longer wait for their places first", t.ahead)
		}
		none.RetryAt = timestamppb.New(now.Add(WaitPoll))
	case t.tried > 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_TRIED
		none.Message = fmt.Sprintf("all %d eligible accounts were tried for this request", t.tried)
	case t.cooling > 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING
		none.Message = fmt.Sprintf("all %d accounts are cooling down", t.cooling)
		if t.gated > 0 {
			none.Message += fmt.Sprintf(" (%d gated for %s models only)", t.gated, ModelFamily(req.Model))
		}
		if none.Permanent {
			none.Message += " with rejected credentials"
		}
	case t.unreadable > 0:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED
		none.Message = fmt.Sprintf("no account can serve: %d with a credential this control plane cannot decrypt", t.unreadable)
		if t.disabled > 0 {
			none.Message += fmt.Sprintf(", %d paused or broken", t.disabled)
		}
	default:
		none.Reason = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED
		none.Message = fmt.Sprintf("all %d accounts are paused or broken", t.disabled)
	}
	if none.Permanent && t.rejected > 0 {
		none.Message = fmt.Sprintf("no account can serve until an operator acts: %d paused or broken, %d with a credential the upstream rejected", t.disabled, t.rejected)
		if t.unreadable > 0 {
			none.Message += fmt.Sprintf(", %d with a credential this control plane cannot decrypt", t.unreadable)
		}
	}
	if none.Permanent && t.unreadable > 0 {
		none.Message += unreadableFix
	}
	if t.withheld > 0 {
		whose := "the pool's setting"
		if req.MeteredByKey {
			whose = "this key's setting"
		}
		none.Message += fmt.Sprintf("; %d metered accounts are not used where a subscription can serve (%s, %s)", t.withheld, MeteredNever, whose)
	}
	if none.RetryAt != nil && none.Reason != weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY {
		none.Message += "; the first recovers at " + none.RetryAt.AsTime().UTC().Format(time.RFC3339)
	}
	return none
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
func (c *Candidate) blockedUntil(now time.Time) (until time.Time, blocked, transient bool) {
	return c.blockedBy(now, c.usageAt(now))
}

// blockedBy is blockedUntil with the account's usage at now read already.
func (c *Candidate) blockedBy(now time.Time, u usage) (until time.Time, blocked, transient bool) {
	transient = true
	if c.Cooldown != nil && c.Cooldown.Until.After(now) {
		until, blocked, transient = c.Cooldown.Until, true, c.Cooldown.Transient
	}
	if spent := u.spent; !spent.IsZero() {
		// Routing stops sending into a wall of 429s: a spent window is a
		// cooldown until its reset, recovering on its own.
		blocked = true
		if spent.After(until) {
			until = spent
		}
	}
	if c.Gate != nil && c.Gate.Until.After(now) {
		blocked = true
		if c.Gate.Until.After(until) {
			until = c.Gate.Until
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
func (c *Candidate) quotaUntil(now time.Time) (quotaEvidence, bool) {
	until, blocked, transient := c.blockedUntil(now)
	if !blocked || !transient {
		return quotaEvidence{}, false
	}
	cd := c.Cooldown
	if cd != nil && (!cd.Until.After(now) || cd.Quota == nil) {
		cd = nil
	}
	if cd != nil && cd.Quota.ResetsAt.IsZero() {
		return quotaEvidence{windowMinutes: cd.Quota.WindowMinutes, kind: cd.Quota.Kind, message: cd.Quota.Message}, true
	}
	var best quotaEvidence
	consider := func(e quotaEvidence) {
		if e.resetsAt.After(best.resetsAt) || (e.resetsAt.Equal(best.resetsAt) && e.windowMinutes > best.windowMinutes) {
			best = e
		}
	}
	if cd != nil {
		consider(quotaEvidence{resetsAt: cd.Quota.ResetsAt, windowMinutes: cd.Quota.WindowMinutes,
			kind: cd.Quota.Kind, message: cd.Quota.Message})
	}
	for _, w := range []struct {
		r       *Window
		minutes int32
	}{{c.FiveHour, 300}, {c.SevenDay, 10080}} {
		if w.r.live(now) && w.r.Utilization >= SpentAt {
			consider(quotaEvidence{resetsAt: w.r.ResetsAt, windowMinutes: w.minutes, spent: w.r.Utilization,
				kind: usageViewKind(c.Account.Provider)})
		}
	}
	if g := c.Gate; g != nil && g.Until.After(now) && gateOnReset(g) {
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
func usageViewKind(provider weirv1.Provider) weirv1.QuotaKind {
	if provider == weirv1.Provider_PROVIDER_CODEX {
		return weirv1.QuotaKind_QUOTA_KIND_CODEX_USAGE_LIMIT
	}
	return weirv1.QuotaKind_QUOTA_KIND_ANTHROPIC_WINDOW
}

// gateOnReset says whether a family gate ends on the reset of the scoped
// claim that set it; a gate that ends on a Retry-After or the default has
// no quota reset behind it.
func gateOnReset(g *Gate) bool {
	var e Evidence
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

// QuotaBlock says whether every eligible account for the request (the
// whole pool under the same filters as selection: provider,
// metered_accounts=never, owned_accounts=owners_only; an open breaker does
// not take an account out, since it serves again when the breaker closes;
// not the accounts paused, broken or holding a rejected credential, which
// are not eligible at all) is blocked by quota evidence, and if so describes
// the one that reopens first: the earliest known reset, or when none is
// known, the first account. Any account that could serve, is busy, or is
// out for another reason means no.
func QuotaBlock(cands []Candidate, req RouteRequest, now time.Time) *weirv1.QuotaBlock {
	var (
		first        quotaEvidence
		firstOf      Candidate
		n, noReset   int32
		firstUnknown = true
	)
	for _, c := range cands {
		// An account behind an open breaker counts like any other: unless
		// its own quota is spent, it serves again when the breaker closes,
		// so the pool is not out of quota. Another owner's seat under
		// owners_only is not this request's pool: its quota says nothing
		// of when this request can be served.
		if !c.mayServe(req, now) {
			continue
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
		Provider:             firstOf.Account.Provider,
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

// ReopensFirst says whether block a reopens before b: a known reset before
// a later one, any known reset before none.
func ReopensFirst(a, b *weirv1.QuotaBlock) bool {
	switch {
	case a.ResetsAt == nil:
		return false
	case b.ResetsAt == nil:
		return true
	}
	return a.ResetsAt.AsTime().Before(b.ResetsAt.AsTime())
}

// rankKey is one Candidate's place in the ranking, computed once: the
// comparison then reads small values instead of recomputing the usage
// view's deadlines, and the sort moves indices instead of whole accounts.
type rankKey struct {
	idx int32 // the account's index in the pool: the last key, for ties
	// lastResort: a metered account under metered_accounts=last_resort,
	// ranked after every subscription.
	lastResort bool
	// preferred: the request's preferred account (a same-account retry).
	preferred bool
	// overloaded: it answered overloaded within the last seconds.
	overloaded bool
	first      int // 0: the session's, 1: any other
	seat       int // whose seat it is (seatOf)
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

// ranking ranks one request's eligible accounts as the tally finds them,
// in the pool's order: it keeps every one's key, or when only the best k
// are asked for, the best k in a bounded max-heap (each account is
// compared with the worst of the best so far, and rarely goes further), so
// that only those are sorted. Route at 10,000 accounts sorted them all for
// a caller that claims the first.
type ranking struct {
	req        RouteRequest
	now        time.Time
	lastResort bool // req.lastResort, read once
	k          int  // <= 0: all
	cands      []Candidate
	// keys are the keys kept: every eligible account's, or the best k as
	// a max-heap under compareRanked (keys[0] ranks last of them).
	keys     []rankKey
	next     rankKey // the key add weighs against keys[0]
	eligible int
}

// add ranks c, the pool's eligible account at index i, whose usage at now
// is u.
func (r *ranking) add(c *Candidate, i int32, u usage) {
	r.eligible++
	if r.keys == nil {
		// Made at the first eligible account, for as many as may follow:
		// a pool that cannot serve allocates none.
		n := len(r.cands) - int(i)
		if r.k > 0 {
			n = min(n, r.k)
		}
		r.keys = make([]rankKey, 0, n)
	}
	// Each key is written where it goes: it is large.
	switch {
	case r.k <= 0 || len(r.keys) < r.k:
		r.keys = append(r.keys, rankKey{})
		r.key(&r.keys[len(r.keys)-1], c, i, u)
		if r.k > 0 {
			heapUp(r.keys, len(r.keys)-1)
		}
	default:
		if r.key(&r.next, c, i, u); compareRanked(&r.next, &r.keys[0]) < 0 {
			r.keys[0] = r.next
			heapDown(r.keys, 0)
		}
	}
}

// order is the accounts kept, best first: compareRankKeys, stably.
func (r *ranking) order() []Candidate {
	ranked := r.ranked()
	out := make([]Candidate, len(ranked))
	for j, i := range ranked {
		out[j] = r.cands[i]
	}
	return out
}

// ranked is the pool positions of the accounts kept, best first.
func (r *ranking) ranked() []int32 {
	// The keys are large: sort their indices, which swap cheaply, with the
	// pool's order as the last key, so an unstable sort (O(n log n))
	// gives the stable order.
	keys := r.keys
	order := make([]int32, len(keys))
	for j := range order {
		order[j] = int32(j)
	}
	slices.SortFunc(order, func(x, y int32) int { return compareRanked(&keys[x], &keys[y]) })
	for j, x := range order {
		order[j] = keys[x].idx
	}
	return order
}

// key writes into k the rank key of c, the pool's account at index i,
// whose usage at now is u.
func (r *ranking) key(k *rankKey, c *Candidate, i int32, u usage) {
	req := &r.req
	*k = rankKey{idx: i, lastResort: r.lastResort && IsMetered(c.Account), first: 1, priority: c.Account.Priority,
		live: c.Live, cap: c.Account.MaxConcurrency, lastUsed: c.Account.LastUsedAt,
		overloaded: c.Account.overloadedRecently(r.now), seat: req.seatOf(&c.Account)}
	switch {
	case req.PreferAccount != uuid.Nil && c.Account.ID == req.PreferAccount:
		k.preferred = true
	case req.SessionAccount != uuid.Nil && c.Account.ID == req.SessionAccount:
		k.first = 0
	}
	// The harvest tier, with the demotion's deadline computed once for
	// both.
	k.demoted = c.demotedUntil(r.now, u)
	switch {
	case !k.demoted.IsZero():
		k.tier = tierDemoted
	case c.SevenDay.live(r.now):
		k.tier = tierWeekly
		k.weeklyReset, k.weeklyUtil = c.SevenDay.ResetsAt, c.SevenDay.Utilization
	default:
		k.tier = tierUnknown
	}
}

// compareRanked is compareRankKeys with the pool's order as the last key:
// the stable order, as a total one.
func compareRanked(x, y *rankKey) int {
	if c := compareRankKeys(x, y); c != 0 {
		return c
	}
	return cmp.Compare(x.idx, y.idx)
}

// heapUp and heapDown keep h a max-heap under compareRanked (h[0] ranks
// last) after h[j] was added or replaced.
func heapUp(h []rankKey, j int) {
	for j > 0 {
		parent := (j - 1) / 2
		if compareRanked(&h[j], &h[parent]) <= 0 {
			return
		}
		h[j], h[parent] = h[parent], h[j]
		j = parent
	}
}

func heapDown(h []rankKey, j int) {
	for {
		worst, l := j, 2*j+1
		if l < len(h) && compareRanked(&h[l], &h[worst]) > 0 {
			worst = l
		}
		if r := l + 1; r < len(h) && compareRanked(&h[r], &h[worst]) > 0 {
			worst = r
		}
		if worst == j {
			return
		}
		h[j], h[worst] = h[worst], h[j]
		j = worst
	}
}

// compareRankKeys ranks: under metered_accounts=last_resort, every
// subscription before every metered account (even a session's own, which
// a subscription takes back as soon as one can serve); the request's
// preferred account; then the accounts that did not answer overloaded
// within the last seconds (a storm on some accounts sends turns to the
// ones that answer, the session's own included: it would fail over
// anyway); then the session's own (its prompt cache lives there); then
// whose seat it is, a tie-break before every key that follows (priority
// included): the key's own seats, then its team's, then the accounts
// without an owner, then other owners' seats (reached only under
// owned_accounts=shared), so that an owner's request takes its own seat
// first and another key's takes a seat only when the rest is busy or out;
// it comes after the session's own, so a conversation stays where its
// prompt cache is, whoever's seat that is; then operator priority, an
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
func compareRankKeys(x, y *rankKey) int {
	if x.lastResort != y.lastResort {
		if x.lastResort {
			return 1
		}
		return -1
	}
	if x.preferred != y.preferred {
		if x.preferred {
			return -1
		}
		return 1
	}
	if x.overloaded != y.overloaded {
		if x.overloaded {
			return 1
		}
		return -1
	}
	if c := cmp.Compare(x.first, y.first); c != 0 {
		return c
	}
	if c := cmp.Compare(x.seat, y.seat); c != 0 {
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

// modelProviders are the providers whose models a model id names, by its
// prefix: Claude models are Anthropic's, GPT, o-series and Codex models
// OpenAI's (served by Codex and OpenAI accounts). An id none of them
// names may be any OpenAI-compatible endpoint's, so it is not judged.
var modelProviders = []struct {
	prefix    string
	providers []weirv1.Provider
}{
	{"claude-", []weirv1.Provider{weirv1.Provider_PROVIDER_ANTHROPIC}},
	{"gpt-", []weirv1.Provider{weirv1.Provider_PROVIDER_CODEX, weirv1.Provider_PROVIDER_OPENAI}},
	{"codex-", []weirv1.Provider{weirv1.Provider_PROVIDER_CODEX, weirv1.Provider_PROVIDER_OPENAI}},
	{"o1", []weirv1.Provider{weirv1.Provider_PROVIDER_CODEX, weirv1.Provider_PROVIDER_OPENAI}},
	{"o3", []weirv1.Provider{weirv1.Provider_PROVIDER_CODEX, weirv1.Provider_PROVIDER_OPENAI}},
	{"o4", []weirv1.Provider{weirv1.Provider_PROVIDER_CODEX, weirv1.Provider_PROVIDER_OPENAI}},
}

// TargetSurface is the surface a request on sf for model is routed as:
// sf itself when its providers serve the model; else, when translate
// allows, the other wire's (Messages for a Claude model; Responses, whose
// providers are Codex's and OpenAI's, for an OpenAI one), the data plane
// translating the request and its answer. ok is false when neither.
func TargetSurface(sf weirv1.Surface, model string, translate bool) (target weirv1.Surface, ok bool) {
	if SurfaceServesModel(sf, model) {
		return sf, true
	}
	if !translate {
		return sf, false
	}
	other := weirv1.Surface_SURFACE_RESPONSES
	if sf == weirv1.Surface_SURFACE_RESPONSES || sf == weirv1.Surface_SURFACE_CHAT_COMPLETIONS {
		other = weirv1.Surface_SURFACE_MESSAGES
	}
	return other, SurfaceServesModel(other, model)
}

// SurfaceServesModel says whether a surface's providers can serve model
// without translating between wires: false only for a model id that
// names another provider's model (a Claude model on Responses or Chat
// Completions, a GPT model on Messages).
func SurfaceServesModel(sf weirv1.Surface, model string) bool {
	m := strings.ToLower(model)
	for _, mp := range modelProviders {
		if !strings.HasPrefix(m, mp.prefix) {
			continue
		}
		for _, p := range mp.providers {
			if Serves(p, sf) {
				return true
			}
		}
		return false
	}
	return true
}
