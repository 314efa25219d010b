package policy

import (
	"slices"
	"time"

	"github.com/google/uuid"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Index is a pool's accounts in routing's order as far as that order is
// the same for every request (RouteIndexed), so that a request can rank
// the best few accounts by walking it from the front instead of ranking
// every account of the pool.
//
// Each account is keyed as compareRankKeys ranks it for a request that
// names none of the pool's accounts (no session, no preferred account, no
// owner: every seat another owner's), with no live lease, its last use as
// the pool has it, and under metered_accounts other than last_resort. A
// request's rank key for an account is then never before that key, but
// for the accounts it names (its preferred account, its session's, the
// seats of its key and team: RouteIndexed ranks those apart) and for
// last_resort (which splits the walk in two: subscriptions, then metered
// accounts): live leases only move an account later, and so does a later
// last use. Accounts are kept apart by provider and by whether they are
// metered, so that a request walks only the providers its surface
// reaches. The walk ranks each eligible account by the request's own key
// and stops once it holds k whose worst ranks before the next account's
// index key: that key bounds every account after it.
//
// An index is a value: Update makes a new one, and the old one stays
// valid for whoever holds it. The keys depend on the time (an overload
// mark that expires, a usage window that resets, a reserve that is
// released): an index serves the instants at which none of its keys
// changes (ValidAt), and Update moves it to another, keying again only
// the accounts whose keys changed.
type Index struct {
	// at is when the keys were computed; from and until bound the
	// instants at which every key is what it was at at (until zero: no
	// bound).
	at, from, until time.Time
	pool            IndexedPool
	members         []*member // by position in the pool
	parts           []indexPart
	// byKey and byTeam are the positions of the seats by owner.
	byKey, byTeam map[uuid.UUID][]int32
	// odd counts the accounts whose concurrency cap is not positive: the
	// free share of such a cap ties with every other (compareRankKeys),
	// which no order by keys can hold, so RouteIndexed declines.
	odd int
}

// IndexedPool is a pool as an index reads it: each account by position,
// without what a request adds (no live lease, no waiter, no family gate),
// and the position of each account id. What Base returns must not change
// while an index refers to it: a changed account is a new Candidate, and
// the index is updated for it (Update).
type IndexedPool interface {
	Len() int
	Base(i int) *Candidate
	Position(id uuid.UUID) (int, bool)
}

// Fill writes into c the account at position i of an indexed pool as one
// request sees it: the pool's Base with the request's live leases and
// waiters (counts, never negative), its family gate, and a last use no
// earlier than the pool's. It may drop a cooldown or a usage window that
// has passed by the instant routed at, nothing else: the index's order
// is the Base's.
type Fill func(i int, c *Candidate)

// member is one account of an index, immutable: indexes share them.
type member struct {
	c   *Candidate
	key rankKey
	// from and until bound the instants at which key (and in) hold.
	from, until time.Time
	// in: the account may serve at all while the key holds (not paused,
	// broken or with a spent window): it is in its part's order.
	in bool
}

// indexPart is the accounts of one provider and kind (metered or not).
type indexPart struct {
	provider weirv1.Provider
	metered  bool
	// order are the members that may serve, best first by their keys.
	order []*member
	// accounts counts every account of the part, in whatever state;
	// owned those that are seats (an owner set).
	accounts, owned int
}

// newMember keys the pool's account c, at position i, at now.
func newMember(c *Candidate, i int, now time.Time) *member {
	m := &member{c: c}
	r := ranking{now: now} // a request that names no account, no owner
	u := c.usageAt(now)
	r.key(&m.key, c, int32(i), u)
	m.key.live = 0
	m.in = !c.Account.Paused && !c.Account.Broken && u.spent.IsZero()
	m.from, m.until = c.keyBounds(now)
	return m
}

// keyBounds are the instants around at between which the account's key
// and whether its windows are spent hold: the last deadline at or before
// at, and the first after it (zero when none). The deadlines are where
// what the key reads of the time turns: the overload mark's expiry
// (overloadedRecently), the windows' resets (live, usageAt), and the
// reserve's release (reserveUntil); each reads "now before deadline".
func (c *Candidate) keyBounds(at time.Time) (from, until time.Time) {
	add := func(b time.Time) {
		switch {
		case at.Before(b):
			if until.IsZero() || b.Before(until) {
				until = b
			}
		case b.After(from):
			from = b
		}
	}
	if o := c.Account.OverloadedAt; o != nil {
		add(o.Add(AnsweringWindow))
	}
	// The same conditions as usage.read and reserveUntil, negated as they
	// are written there (a NaN reading counts as they count it).
	if w := c.FiveHour; w != nil && !(w.Utilization < nearLimitAt) {
		add(w.ResetsAt)
	}
	if w := c.SevenDay; w != nil {
		add(w.ResetsAt)
		if !(w.Utilization <= 1-reserveHeadroom) {
			add(w.ResetsAt.Add(-reserveRelease))
		}
	}
	return from, until
}

func (m *member) validAt(now time.Time) bool { return within(now, m.from, m.until) }

func within(now, from, until time.Time) bool {
	return !now.Before(from) && (until.IsZero() || now.Before(until))
}

func seat(a *Account) bool { return a.OwnerKey != uuid.Nil || a.OwnerTeam != uuid.Nil }

// compareMembers is the index's order: compareRanked over the members'
// keys, a total order (the pool position is the last key).
func compareMembers(x, y *member) int { return compareRanked(&x.key, &y.key) }

// NewIndex indexes pool at now: a sort of the pool, done once per pool
// state (Update follows it).
func NewIndex(pool IndexedPool, now time.Time) *Index {
	n := pool.Len()
	ix := &Index{at: now, pool: pool, members: make([]*member, n)}
	for i := range n {
		m := newMember(pool.Base(i), i, now)
		ix.members[i] = m
		if j := ix.count(m, 1); m.in {
			ix.parts[j].order = append(ix.parts[j].order, m)
		}
		ix.narrow(m)
	}
	for i := range ix.parts {
		slices.SortFunc(ix.parts[i].order, compareMembers)
	}
	ix.indexOwners()
	return ix
}

// ValidAt says whether ix serves a request at now.
func (ix *Index) ValidAt(now time.Time) bool { return within(now, ix.from, ix.until) }

// Update is ix over pool at now: pool is a later state of ix's pool, with
// the same accounts at the same positions, where only those at the
// positions changed may differ. It keys again the accounts changed and
// those whose keys do not hold at now, and moves them in the order; the
// rest is ix's. A pool of another size is indexed anew.
func (ix *Index) Update(pool IndexedPool, changed []int, now time.Time) *Index {
	n := pool.Len()
	if ix == nil || len(ix.members) != n {
		return NewIndex(pool, now)
	}
	out := &Index{at: now, pool: pool, members: slices.Clone(ix.members), parts: slices.Clone(ix.parts),
		byKey: ix.byKey, byTeam: ix.byTeam, odd: ix.odd}
	// moved are the positions whose member goes elsewhere in the orders
	// (or in none), gone how many leave each part's order and fresh the
	// members that enter it; a member whose key and part are its
	// predecessor's takes its place (most accounts read again). touched
	// are the parts whose orders change.
	moved := map[int]bool{}
	gone, fresh := map[int]int{}, map[int][]*member{}
	touched := map[int]bool{}
	owners := false
	replace := func(i int) {
		was := out.members[i]
		m := newMember(pool.Base(i), i, now)
		out.members[i] = m
		owners = owners || seat(&was.c.Account) || seat(&m.c.Account)
		jw, jm := out.count(was, -1), out.count(m, 1)
		if jw == jm && was.in == m.in && compareMembers(was, m) == 0 {
			if m.in {
				touched[jm] = true
			}
			return
		}
		moved[i] = true
		if was.in {
			gone[jw]++
			touched[jw] = true
		}
		if m.in {
			fresh[jm], touched[jm] = append(fresh[jm], m), true
		}
	}
	if ix.ValidAt(now) {
		// Every key holds at now: only the accounts changed are keyed
		// again, and the instants the index serves only narrow.
		out.from, out.until = ix.from, ix.until
		for _, i := range changed {
			if i >= 0 && i < n && out.members[i] == ix.members[i] {
				replace(i)
				out.narrow(out.members[i])
			}
		}
	} else {
		// Some key does not: find which, and bound the instants anew.
		redo := make([]bool, n)
		for _, i := range changed {
			if i >= 0 && i < n {
				redo[i] = true
			}
		}
		for i := range n {
			if redo[i] || !out.members[i].validAt(now) {
				replace(i)
			}
			out.narrow(out.members[i])
		}
	}
	for j := range touched {
		out.parts[j].order = spliced(out.parts[j].order, out.members, moved, gone[j], fresh[j])
	}
	if owners {
		out.indexOwners()
	}
	return out
}

// narrow bounds the index's instants by a member's.
func (ix *Index) narrow(m *member) {
	if m.from.After(ix.from) {
		ix.from = m.from
	}
	if !m.until.IsZero() && (ix.until.IsZero() || m.until.Before(ix.until)) {
		ix.until = m.until
	}
}

// count adds d (1 or -1) of m to its part's counts, and returns the
// part's index (a part is made when it is the first of its kind).
func (ix *Index) count(m *member, d int) int {
	a := &m.c.Account
	metered := IsMetered(*a)
	j := slices.IndexFunc(ix.parts, func(p indexPart) bool { return p.provider == a.Provider && p.metered == metered })
	if j < 0 {
		ix.parts = append(ix.parts, indexPart{provider: a.Provider, metered: metered})
		j = len(ix.parts) - 1
	}
	p := &ix.parts[j]
	p.accounts += d
	if seat(a) {
		p.owned += d
	}
	if a.MaxConcurrency <= 0 {
		ix.odd += d
	}
	return j
}

// indexOwners indexes the seats by owner.
func (ix *Index) indexOwners() {
	ix.byKey, ix.byTeam = nil, nil
	for i, m := range ix.members {
		a := &m.c.Account
		if a.OwnerKey != uuid.Nil {
			if ix.byKey == nil {
				ix.byKey = map[uuid.UUID][]int32{}
			}
			ix.byKey[a.OwnerKey] = append(ix.byKey[a.OwnerKey], int32(i))
		}
		if a.OwnerTeam != uuid.Nil {
			if ix.byTeam == nil {
				ix.byTeam = map[uuid.UUID][]int32{}
			}
			ix.byTeam[a.OwnerTeam] = append(ix.byTeam[a.OwnerTeam], int32(i))
		}
	}
}

// spliced is order with each member replaced by its position's in
// members, less those that moved (gone of them), plus added, in order:
// each added member is placed by binary search among the old keys, and
// the rest copied once.
func spliced(order, members []*member, moved map[int]bool, gone int, added []*member) []*member {
	slices.SortFunc(added, compareMembers)
	at := make([]int, len(added))
	for j, m := range added {
		at[j], _ = slices.BinarySearchFunc(order, m, compareMembers)
	}
	out := make([]*member, 0, len(order)-gone+len(added))
	j := 0
	for i, m := range order {
		for j < len(added) && at[j] <= i {
			out = append(out, added[j])
			j++
		}
		if now := members[m.key.idx]; now != m {
			if moved[int(m.key.idx)] {
				continue // gone from here
			}
			m = now // the same key, in the same place
		}
		out = append(out, m)
	}
	return append(out, added[j:]...)
}

// RouteIndexed is RouteGatedFirst over the pool ix indexes, each account
// as fill writes it for the request, when some account can serve: the same
// first k accounts in the same order, SpillFrom and newRound, without
// ranking (or copying) every account of the pool. ok is false when it
// cannot answer: ix does not serve now (ValidAt), the pool has an account
// with a cap of 0, or no account is eligible; then RouteGatedFirst over
// the whole pool answers, with why none can serve. Pure.
func RouteIndexed(ix *Index, fill Fill, req RouteRequest, g BreakerGate, now time.Time, k int) (o Order, newRound, ok bool) {
	if ix == nil || ix.odd > 0 || !ix.ValidAt(now) {
		return Order{}, false, false
	}
	if o, ok = ix.route(fill, withAvoided(req, g.Avoid), now, k); ok {
		return o, false, true
	}
	if g.Avoid != nil {
		// Every account but those probed already is out: a new round.
		if o, ok = ix.route(fill, req, now, k); ok {
			return o, true, true
		}
	}
	return Order{}, false, false
}

// walker is one request's walk over an index.
type walker struct {
	ix       *Index
	fill     Fill
	req      *RouteRequest
	now      time.Time
	served   providerSet
	withhold bool
	// specials are the positions of the accounts the request names
	// (preferred, session) and of the seats of its key and team: ranked
	// apart, as the request ranks them, and skipped by the walk.
	specials []int32
	// stages are the parts the request walks, in turn: all of them, or
	// under last_resort the subscriptions and then the metered ones;
	// cursor is where the walk stands in each (by part index).
	stages     [2][]int
	cursor     []int
	partOfHead int
	r          ranking
	// subscriptions counts the eligible subscription accounts met.
	subscriptions int
	c             Candidate // the account being looked at
}

// route is RouteFirst over the index for req at now, or ok false when no
// account is eligible.
func (ix *Index) route(fill Fill, req RouteRequest, now time.Time, k int) (Order, bool) {
	w := walker{ix: ix, fill: fill, req: &req, now: now, served: servedBy[req.Surface],
		withhold: req.Metered == weirv1.MeteredAccounts_METERED_ACCOUNTS_NEVER && subscriptionSurfaces[req.Surface],
		cursor:   make([]int, len(ix.parts))}
	w.r = ranking{req: req, now: now, lastResort: req.lastResort(), k: k, keys: make([]rankKey, 0, max(k, 8))}
	w.collectSpecials()
	for _, p := range w.specials {
		w.look(int(p))
	}
	for j := range ix.parts {
		p := &ix.parts[j]
		if !w.served.has(p.provider) || req.BreakerOpen[p.provider] || (w.withhold && p.metered) {
			continue
		}
		s := 0
		if w.r.lastResort && p.metered {
			s = 1
		}
		w.stages[s] = append(w.stages[s], j)
	}
	for s, parts := range w.stages {
		if !w.walk(parts, s == 1) {
			break
		}
	}
	if w.r.eligible == 0 {
		return Order{}, false
	}
	first := make([]Candidate, len(w.r.keys))
	for j, i := range w.r.ranked() {
		fill(int(i), &first[j])
	}
	return Order{First: first, SpillFrom: w.spillFrom(first)}, true
}

// collectSpecials finds the accounts the request ranks apart.
func (w *walker) collectSpecials() {
	named := func(id uuid.UUID) {
		if id == uuid.Nil {
			return
		}
		if i, ok := w.ix.pool.Position(id); ok {
			w.specials = append(w.specials, int32(i))
		}
	}
	named(w.req.PreferAccount)
	named(w.req.SessionAccount)
	if w.req.Key != uuid.Nil {
		w.specials = append(w.specials, w.ix.byKey[w.req.Key]...)
	}
	if w.req.Team != uuid.Nil {
		w.specials = append(w.specials, w.ix.byTeam[w.req.Team]...)
	}
	if len(w.specials) > 1 {
		w.specials = slices.Compact(slices.Sorted(slices.Values(w.specials)))
	}
}

// special says whether a is one of the accounts ranked apart.
func (w *walker) special(a *Account) bool {
	req := w.req
	return (req.PreferAccount != uuid.Nil && a.ID == req.PreferAccount) ||
		(req.SessionAccount != uuid.Nil && a.ID == req.SessionAccount) || w.owns(a)
}

// owns says whether a is a seat of the request's key or team.
func (w *walker) owns(a *Account) bool {
	return (a.OwnerKey != uuid.Nil && a.OwnerKey == w.req.Key) || (a.OwnerTeam != uuid.Nil && a.OwnerTeam == w.req.Team)
}

// look ranks the account at position i when it is eligible.
func (w *walker) look(i int) {
	w.fill(i, &w.c)
	c := &w.c
	if u, ok := c.eligibleFor(w.req, w.now, w.served, w.withhold); ok {
		w.r.add(c, int32(i), u)
		if !IsMetered(c.Account) {
			w.subscriptions++
		}
	}
}

// eligibleFor says whether c may serve req at now, as tallyOf sorts it
// (served and withhold read once by the caller), with its usage at now.
func (c *Candidate) eligibleFor(req *RouteRequest, now time.Time, served providerSet, withhold bool) (usage, bool) {
	a := &c.Account
	if !served.has(a.Provider) || req.keptAway(a) || req.BreakerOpen[a.Provider] || (withhold && IsMetered(*a)) ||
		a.Paused || a.Broken || req.Unreadable[a.ID] || req.Exclude[a.ID] {
		return usage{}, false
	}
	u := c.usageAt(now)
	if _, cooling, _ := c.blockedBy(now, u); cooling || c.Live+c.WaitingAhead >= c.capacity() {
		return u, false
	}
	return u, true
}

// skip says, from what the pool has of the account alone, that it is a
// special or cannot serve this request: what the walk need not fill.
func (w *walker) skip(m *member) bool {
	a, req := &m.c.Account, w.req
	return w.special(a) || (req.Owned == weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY && seat(a)) ||
		(m.c.Cooldown != nil && m.c.Cooldown.Until.After(w.now)) || req.Unreadable[a.ID] || req.Exclude[a.ID]
}

// walk ranks the eligible accounts of parts (one stage: lastResort says
// which) best first by their keys, merged, until no account left can rank
// among the best k: its key in the index, a bound on what the request
// ranks it by, ranks after the worst of them. False when it stopped so
// (the stages after rank later still).
func (w *walker) walk(parts []int, lastResort bool) bool {
	for {
		m := w.head(parts)
		if m == nil {
			return true
		}
		if w.r.k > 0 && len(w.r.keys) == w.r.k && ranksBefore(&w.r.keys[0], &m.key, lastResort) {
			return false
		}
		w.cursor[w.partOfHead]++
		if !w.skip(m) {
			w.look(int(m.key.idx))
		}
	}
}

// head is the member that ranks first among the parts' next ones (nil
// when every part is walked), its part in partOfHead.
func (w *walker) head(parts []int) *member {
	var best *member
	for _, j := range parts {
		order := w.ix.parts[j].order
		if w.cursor[j] >= len(order) {
			continue
		}
		if m := order[w.cursor[j]]; best == nil || compareMembers(m, best) < 0 {
			best, w.partOfHead = m, j
		}
	}
	return best
}

// ranksBefore says whether the ranked key x ranks before an index key
// (whose lastResort is false) taken with lastResort.
func ranksBefore(x, key *rankKey, lastResort bool) bool {
	if x.lastResort != lastResort {
		return !x.lastResort
	}
	y := *x
	y.lastResort = false
	return compareRanked(&y, key) < 0
}

// spillFrom is SpillFrom over the order the whole pool gives, told from
// first, as tally.spillFrom tells it: the tally's counts of the pool's
// subscriptions taken from the index and from a walk on, for an eligible
// subscription ranked after first, only when first ends in metered
// accounts.
func (w *walker) spillFrom(first []Candidate) int {
	if !subscriptionSurfaces[w.req.Surface] {
		return len(first)
	}
	from, subscriptions := subscriptionsIn(first)
	if from == len(first) || w.subscriptions > subscriptions || !w.subscriptionPool() || w.subscriptionAfter() {
		return len(first)
	}
	return from
}

// subscriptionPool says whether the pool as the request sees it has a
// subscription account for its surface, in whatever state (tally's
// subscription).
func (w *walker) subscriptionPool() bool {
	ownersOnly := w.req.Owned == weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY
	for _, p := range w.ix.parts {
		if !p.metered && w.served.has(p.provider) && (p.accounts > p.owned || (!ownersOnly && p.accounts > 0)) {
			return true
		}
	}
	for _, i := range w.specials {
		a := &w.ix.members[i].c.Account
		if w.owns(a) && !IsMetered(*a) && w.served.has(a.Provider) {
			return true
		}
	}
	return false
}

// subscriptionAfter walks on the subscriptions the walk did not reach for
// an eligible one.
func (w *walker) subscriptionAfter() bool {
	for _, parts := range w.stages {
		for _, j := range parts {
			p := &w.ix.parts[j]
			if p.metered {
				continue
			}
			for ; w.cursor[j] < len(p.order); w.cursor[j]++ {
				m := p.order[w.cursor[j]]
				if w.skip(m) {
					continue
				}
				w.fill(int(m.key.idx), &w.c)
				if _, ok := w.c.eligibleFor(w.req, w.now, w.served, w.withhold); ok {
					return true
				}
			}
		}
	}
	return false
}
