package controlplane

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	"github.com/weirhq/weir/controlplane/upstream"
)

// routeRefreshEvery is the shortest period in which the routing cache's
// rolling refresh reads every account again while Acquires use it (longer
// for a pool that takes long to read: see routeReadShare): what no
// notification announces (when an account last answered overloaded or
// another replica last leased it, a usage reading that stays within its
// band, a label) is about this old at most, give or take a tick.
const routeRefreshEvery = time.Second

// routeCache is this replica's copy of what routing reads of every
// account: the account, its live cooldown, its usage windows and its
// family gates. Reading them from Postgres on every Acquire cost a scan of
// the pool per request (175 ms at 10,000 accounts); Acquire now reads only
// what changes per request (live leases, waiters, the key, the session:
// AcquireFacts) and routes over this copy.
//
// It is kept true by the pool notifications (poolwatch.go): an account
// named is read again before the next Acquire routes, "all" reads every
// account again, and while nothing listens (before Start, or with the
// listening connection lost) every read reads the pool afresh, as before.
// What no notification announces is caught by the rolling refresh
// (refresh): every routeSliceEvery the background reader reads the next
// slice of the accounts again, so that the whole pool is read within
// refreshPeriod; a whole read in one burst (45 ms of CPU at 10,000
// accounts) queued the Acquires that came during it on a small machine.
// This replica's own writes invalidate the accounts they touch at once
// (a released failure, a claim that failed, a success that ended an
// overload or moved a usage band), so its workers never route on a state
// it has already changed; another replica's writes arrive within the
// notification latency. Nothing routing reads here can break a cap or
// lease a paused, broken, cooling or re-credentialed account: the claim
// re-checks those under the account's row lock, and the lease carries the
// credential and upstream the claim read (ClaimLease).
type routeCache struct {
	store
	watch *poolWatch
	log   *slog.Logger
	now   func() time.Time

	// fullMu serializes whole reads; dirtyMu the reads of named accounts.
	// The rolling refresh's slice reads take neither: only the background
	// reader makes them, one at a time, and they install only what no
	// other read replaced meanwhile (routeSnap.refreshed).
	fullMu, dirtyMu sync.Mutex

	mu   sync.Mutex
	snap *routeSnap
	// dirty are the accounts to read again before the next route, with the
	// invalidation's sequence number: one invalidated again while it was
	// being read stays dirty.
	dirty map[uuid.UUID]uint64
	seq   uint64
	// touched are the accounts invalidated or read alone while a whole
	// read runs (nil when none runs): that read may predate them, so they
	// are dirty again once it is installed.
	touched map[uuid.UUID]bool
	// usedSince: an Acquire read the cache since the last whole read or
	// the last rolling cycle began.
	usedSince bool
	// roll is where the rolling refresh stands.
	roll rolling
	// kick wakes the background reader for an "all"; used wakes it
	// when an Acquire reads a cache it stopped ticking for (quiet).
	kick, used chan struct{}
	// cancel and done stop the background reader.
	cancel context.CancelFunc
	done   chan struct{}
}

func newRouteCache(s store, watch *poolWatch, log *slog.Logger, now func() time.Time) *routeCache {
	c := &routeCache{store: s, watch: watch, log: log, now: now, dirty: map[uuid.UUID]uint64{}, kick: make(chan struct{}, 1), used: make(chan struct{}, 1)}
	watch.onEvents(c.onEvent)
	return c
}

// routeSnap is one immutable state of the cache: shared by every read,
// replaced whole (a copy of the entry pointers) when an account changes.
type routeSnap struct {
	// entries are by label, then id: the order routing breaks its last
	// ties in.
	entries []*routeEntry
	index   map[uuid.UUID]int
	// epoch is the notification connection's listening epoch the cache
	// was read whole in (poolWatch.listening); 0 for a private read.
	epoch uint64

	// ix is the routing index over the entries (policy.Index), made at
	// the first route over the snapshot and moved on in time as routes
	// need (routeIndex); ixMu serializes making it.
	ix   atomic.Pointer[policy.Index]
	ixMu sync.Mutex
	// from is the index of the snapshot this one was made from, with the
	// positions replaced since: this one's index is that one updated for
	// them (a few accounts keyed again and moved) rather than a sort of
	// the pool. Nil when none is (the snapshot was read whole, or accounts
	// came, went or moved in the order since), or once ix is made.
	from atomic.Pointer[indexFrom]
}

// indexFrom is an index to update and the positions to update it for.
type indexFrom struct {
	ix      *policy.Index
	changed []int
}

// routeEntry is one account as routing reads it.
type routeEntry struct {
	// cand is the account's candidate without what a request adds (its
	// live leases, its waiters, its gate for the request's family).
	cand     policy.Candidate
	revision int64
	gates    []policy.Gate
	// usedAt is when this replica last leased the account since it was
	// read (Unix nanoseconds, 0 when not): routing's last tie-break, the
	// least recently used, stays exact for this replica's own leases.
	usedAt atomic.Int64
}

// onEvent takes a pool notification, under the watch's lock: it only
// marks. (A lost connection is no event: it ends the listening epoch,
// which every read checks.)
func (c *routeCache) onEvent(ev poolEvent) {
	if ev.keys {
		return // a key's change is AcquireFacts'
	}
	if ev.account == "" {
		// Read every account again, in the background: what a pool-wide
		// event changes (breakers, aliases) is AcquireFacts', so routing
		// need not wait for it.
		select {
		case c.kick <- struct{}{}:
		default:
		}
		return
	}
	if id, err := uuid.Parse(ev.account); err == nil {
		c.invalidate(id)
	}
}

// invalidate marks an account to be read again before the next route.
func (c *routeCache) invalidate(ids ...uuid.UUID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range ids {
		c.seq++
		c.dirty[id] = c.seq
		if c.touched != nil {
			c.touched[id] = true
		}
	}
}

// afterSuccess invalidates an account a released success changed in what
// routing reads (notified too, but this replica's next Acquire may come
// first): it had answered overloaded, was on its recovery probe, or the
// answer's usage headers move one of its windows to another band.
func (c *routeCache) afterSuccess(id uuid.UUID, headers map[string]string, now time.Time) {
	c.mu.Lock()
	var e *routeEntry
	if c.snap != nil {
		if i, ok := c.snap.index[id]; ok {
			e = c.snap.entries[i]
		}
	}
	c.mu.Unlock()
	if e == nil {
		return
	}
	if e.cand.Account.OverloadedAt != nil || e.cand.Account.RecoveryProbe || e.bandMoves(headers, now) {
		c.invalidate(id)
	}
}

// bandMoves says whether an answer's usage headers move one of the
// account's windows to another band than the cache has it in.
func (e *routeEntry) bandMoves(headers map[string]string, now time.Time) bool {
	for _, r := range readingsOf(upstream.HeaderReadings(headers, now)) {
		var w *policy.Window
		switch r.window {
		case upstream.FiveHour:
			w = e.cand.FiveHour
		case upstream.SevenDay:
			w = e.cand.SevenDay
		default:
			continue
		}
		var was *float64
		if w != nil && w.ResetsAt.After(now) {
			was = &w.Utilization
		}
		if usageBand(was) != usageBand(r.utilization) {
			return true
		}
	}
	return false
}

// usageBand is weir_usage_band (0012_pool_notify.sql): the bands routing
// acts on, no evidence counting as 0.
func usageBand(u *float64) int {
	switch {
	case u == nil:
		return 0
	case *u >= policy.SpentAt:
		return 3
	case *u >= 0.9:
		return 2
	case *u >= 0.8:
		return 1
	}
	return 0
}

// start runs the background reader until ctx ends or stop.
func (c *routeCache) start(ctx context.Context) {
	ctx, c.cancel = context.WithCancel(ctx)
	c.done = make(chan struct{})
	go func() {
		defer close(c.done)
		c.run(ctx)
	}()
}

// stop ends the background reader and waits for it; a no-op when it
// never started.
func (c *routeCache) stop() {
	if c.cancel == nil {
		return
	}
	c.cancel()
	<-c.done
}

// routeReadShare bounds the share of one core the rolling refresh takes:
// a cycle lasts at least this many times what the last one's reads took
// (refreshPeriod). At 10,000 accounts the pool's reads take about 45 ms:
// a cycle of about 1.8 s, 18 slices of some 560 accounts, each an
// eighteenth of those 45 ms plus its two round trips, 2.5% of a core in
// all, where the whole read took its 45 ms in one burst.
const routeReadShare = 40

// routeSliceEvery is the rolling refresh's tick: each reads one slice.
const routeSliceEvery = 100 * time.Millisecond

// routeSliceMin is the fewest accounts a slice reads (unless the cycle
// has fewer left): every slice pays its two round trips whatever its
// size, and with slices of a handful of accounts those would be most of
// what the cycle's reads take, which lengthens the next cycle
// (routeReadShare) and shrinks its slices further. Below 100 accounts per
// tick (pools under 1,000 accounts), a cycle reads in fewer slices than
// its period has ticks and waits out the rest.
const routeSliceMin = 100

// refreshPeriod is how long a rolling cycle lasts, the least time in
// which it reads every account once, when the last cycle's reads took
// spent in all (or the last whole read did, when no cycle ended since):
// routeRefreshEvery, or routeReadShare times spent for a pool that takes
// long to read.
func refreshPeriod(spent time.Duration) time.Duration {
	return max(routeRefreshEvery, routeReadShare*spent)
}

// refreshSlice is how many of a pool's n accounts each tick of a cycle
// of period reads: the pool spread over the period's ticks, at least
// routeSliceMin, at most the pool.
func refreshSlice(n int, period time.Duration) int {
	ticks := max(int(period/routeSliceEvery), 1)
	return min(max((n+ticks-1)/ticks, routeSliceMin), n)
}

// rolling is where the rolling refresh stands: a cycle walks the
// snapshot's entries in their order, a slice a tick, from its first to
// its last; the next begins once the period since it began is over and an
// Acquire read the cache since (usedSince), so a cache no Acquire reads
// is read once more at most, as the whole reads were. A whole read (a new
// listening epoch, an "all") ends the cycle and counts as one.
type rolling struct {
	// cycle counts the cycles begun and the whole reads: a slice read in
	// an earlier one moves nothing of this one.
	cycle  uint64
	active bool
	// began is when the cycle, or the last whole read, began.
	began time.Time
	// next is where the cycle goes on: the first entry at or after it.
	// A key rather than a position: accounts added or removed meanwhile
	// shift positions, not keys.
	next routeKey
	// spent is what the cycle's reads have taken so far; cost what the
	// last cycle's (or whole read's) took, which sets the period.
	spent, cost time.Duration
}

// routeKey is an entry's place in a snapshot's order.
type routeKey struct {
	label string
	id    uuid.UUID
}

func (e *routeEntry) key() routeKey {
	return routeKey{e.cand.Account.Label, e.cand.Account.ID}
}

func compareRouteKey(e *routeEntry, k routeKey) int {
	if c := cmp.Compare(e.cand.Account.Label, k.label); c != 0 {
		return c
	}
	return slices.Compare(e.cand.Account.ID[:], k.id[:])
}

// run reads the cache in the background until ctx ends: whole on an
// "all", and a slice every routeSliceEvery (refresh). While nothing is
// to be read until an Acquire reads the cache (quiet), it stops ticking,
// so that an idle control plane does not wake ten times a second.
func (c *routeCache) run(ctx context.Context) {
	t := time.NewTicker(routeSliceEvery)
	defer t.Stop()
	tick := t.C
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
			epoch := c.watch.listening()
			if epoch == 0 {
				continue // reads read afresh until it listens again
			}
			if err := c.reload(ctx, epoch, true); err != nil && ctx.Err() == nil {
				c.log.WarnContext(ctx, "routing cache: read the pool", "err", err)
			}
		case <-c.used:
			if tick == nil {
				t.Reset(routeSliceEvery)
				tick = t.C
			}
		case <-tick:
			err := c.refresh(ctx, time.Now())
			if err != nil && !failing && ctx.Err() == nil {
				// Once per run of failures: the tick retries the slice.
				c.log.WarnContext(ctx, "routing cache: read a slice of the pool", "err", err)
			}
			failing = err != nil
			if !failing && c.quiet() {
				t.Stop()
				tick = nil
			}
		}
	}
}

// quiet says whether the rolling refresh has nothing to read until an
// Acquire reads the cache: no cycle runs, and none read it since the last
// one began. read wakes run then (used).
func (c *routeCache) quiet() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.roll.active && !c.usedSince
}

// refresh is one tick of the rolling refresh at now: it reads the cycle's
// next slice of the accounts again and installs what no other read
// replaced meanwhile (routeSnap.refreshed), or begins a cycle when one is
// due. Only the accounts the snapshot holds are walked: a new account is
// announced (accounts_notify_pool_insert_delete, 0012_pool_notify.sql) and
// read before the next route, and one deleted has no row when its slice
// is read, so it leaves the cache then if its notification was missed.
//
// It never clears a dirty mark: an account invalidated while its slice
// is read may be read before the change, and stays dirty, so the next
// read reads it again (readDirty). Nor does it mark what it read in
// touched: a whole read running meanwhile installs a new snapshot after
// it, which the slice's older entries do not outlive, and whose own are
// no more than a whole read old, as before.
func (c *routeCache) refresh(ctx context.Context, now time.Time) error {
	epoch := c.watch.listening()
	c.mu.Lock()
	from, r := c.snap, &c.roll
	if epoch == 0 || from == nil || from.epoch != epoch {
		c.mu.Unlock()
		return nil // the next read reads whole, or afresh
	}
	if !r.active {
		if !c.usedSince || now.Sub(r.began) < refreshPeriod(r.cost) {
			c.mu.Unlock()
			return nil
		}
		c.usedSince = false
		*r = rolling{cycle: r.cycle + 1, active: true, began: now, cost: r.cost}
	}
	cycle := r.cycle
	i, _ := slices.BinarySearchFunc(from.entries, r.next, compareRouteKey)
	end := min(i+refreshSlice(len(from.entries), refreshPeriod(r.cost)), len(from.entries))
	ids := make([]uuid.UUID, 0, end-i)
	for _, e := range from.entries[i:end] {
		ids = append(ids, e.cand.Account.ID)
	}
	var next routeKey
	if end < len(from.entries) {
		next = from.entries[end].key()
	}
	c.mu.Unlock()

	var rows []db.RoutingAccountsRow
	var gates []db.FamilyGate
	start := time.Now()
	if len(ids) > 0 {
		var err error
		if rows, gates, err = c.load(ctx, ids); err != nil {
			return err // the cursor stays: the next tick reads the slice again
		}
	}
	took := time.Since(start)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.snap = c.snap.refreshed(from, ids, rows, gates)
	if r.cycle != cycle {
		return nil // a whole read ended the cycle meanwhile
	}
	r.spent += took
	if end == len(from.entries) {
		r.active, r.cost = false, r.spent
	} else {
		r.next = next
	}
	return nil
}

// read returns the cache as of now: read whole first when it was never
// read in this listening epoch, its named accounts read again first. While
// nothing listens, the pool is read afresh for this read alone.
func (c *routeCache) read(ctx context.Context) (*routeSnap, error) {
	epoch := c.watch.listening()
	if epoch == 0 {
		rows, gates, err := c.load(ctx, nil)
		if err != nil {
			return nil, err
		}
		return newRouteSnap(rows, gates, 0), nil
	}
	c.mu.Lock()
	s := c.snap
	woke := !c.usedSince
	c.usedSince = true
	c.mu.Unlock()
	if woke {
		select {
		case c.used <- struct{}{}:
		default:
		}
	}
	if s == nil || s.epoch != epoch {
		if err := c.reload(ctx, epoch, false); err != nil {
			return nil, err
		}
	}
	if err := c.readDirty(ctx); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snap, nil
}

// catchUpWait bounds how long an answer that no account can serve waits
// for the notifications committed before it (catchUp).
const catchUpWait = 250 * time.Millisecond

// catchUp says whether a route over s may have missed a change committed
// before now, once every notification committed before now has been
// heard: this replica stalled (a pause, a GC, a loaded machine) while
// they queued, or another replica wrote a moment ago. Acquire asks it
// before answering that no account can serve (a hold, a final usage
// limit), the answer a stale cache would make wrongly; a lease needs no
// such care, the claim re-checks what must hold. A snapshot read straight
// from Postgres missed nothing. A slice of the rolling refresh installed
// since counts as a change: it may bring one no notification announced.
func (c *routeCache) catchUp(ctx context.Context, s *routeSnap) bool {
	if s.epoch == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, catchUpWait)
	defer cancel()
	if !c.watch.sync(ctx) {
		// Not listening any more: the next read goes to Postgres.
		return c.watch.listening() != s.epoch
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.dirty) > 0 || c.snap != s
}

// reload reads every account and installs the result. Unless always, it
// does nothing when a read of the same epoch was installed while this one
// waited its turn (a synchronous read finds the background one done).
func (c *routeCache) reload(ctx context.Context, epoch uint64, always bool) error {
	c.fullMu.Lock()
	defer c.fullMu.Unlock()
	c.mu.Lock()
	if s := c.snap; !always && s != nil && s.epoch == epoch {
		c.mu.Unlock()
		return nil
	}
	c.touched = map[uuid.UUID]bool{}
	c.usedSince = false
	c.mu.Unlock()
	start := time.Now()
	rows, gates, err := c.load(ctx, nil)
	took := time.Since(start)
	c.mu.Lock()
	defer c.mu.Unlock()
	touched := c.touched
	c.touched = nil
	if err != nil {
		return err
	}
	c.snap = newRouteSnap(rows, gates, epoch)
	// A whole read is a rolling cycle read at once.
	c.roll = rolling{cycle: c.roll.cycle + 1, began: start, cost: took}
	for id := range touched {
		c.seq++
		c.dirty[id] = c.seq
	}
	return nil
}

// readDirty reads the accounts marked dirty again and installs them.
func (c *routeCache) readDirty(ctx context.Context) error {
	c.mu.Lock()
	n := len(c.dirty)
	c.mu.Unlock()
	if n == 0 {
		return nil
	}
	c.dirtyMu.Lock()
	defer c.dirtyMu.Unlock()
	c.mu.Lock()
	taken := make(map[uuid.UUID]uint64, len(c.dirty))
	ids := make([]uuid.UUID, 0, len(c.dirty))
	for id, seq := range c.dirty {
		taken[id] = seq
		ids = append(ids, id)
	}
	c.mu.Unlock()
	if len(ids) == 0 {
		return nil // another read took them
	}
	rows, gates, err := c.load(ctx, ids)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.snap = c.snap.with(ids, rows, gates)
	for id, seq := range taken {
		if c.dirty[id] == seq {
			delete(c.dirty, id)
		}
		if c.touched != nil {
			c.touched[id] = true
		}
	}
	return nil
}

// load reads the named accounts (every one when ids is nil) and their
// live gates.
func (c *routeCache) load(ctx context.Context, ids []uuid.UUID) ([]db.RoutingAccountsRow, []db.FamilyGate, error) {
	now := c.now()
	if ids == nil {
		rows, err := c.q.RoutingAccounts(ctx, now)
		if err != nil {
			return nil, nil, err
		}
		gates, err := c.q.RoutingGates(ctx, now)
		return rows, gates, err
	}
	of, err := c.q.RoutingAccountsOf(ctx, db.RoutingAccountsOfParams{Now: now, Ids: ids})
	if err != nil {
		return nil, nil, err
	}
	rows := make([]db.RoutingAccountsRow, len(of))
	for i, r := range of {
		rows[i] = db.RoutingAccountsRow(r)
	}
	gates, err := c.q.RoutingGatesOf(ctx, db.RoutingGatesOfParams{Now: now, Ids: ids})
	return rows, gates, err
}

func newRouteSnap(rows []db.RoutingAccountsRow, gates []db.FamilyGate, epoch uint64) *routeSnap {
	s := &routeSnap{entries: make([]*routeEntry, 0, len(rows)), epoch: epoch}
	byAccount := gatesByAccount(gates)
	for _, r := range rows {
		s.entries = append(s.entries, newRouteEntry(r, byAccount[r.ID]))
	}
	s.reindex()
	return s
}

func gatesByAccount(gates []db.FamilyGate) map[uuid.UUID][]policy.Gate {
	out := map[uuid.UUID][]policy.Gate{}
	for _, g := range gates {
		out[g.AccountID] = append(out[g.AccountID], policyGate(g))
	}
	return out
}

func newRouteEntry(r db.RoutingAccountsRow, gates []policy.Gate) *routeEntry {
	c := policy.Candidate{Account: policyAccount(db.Account{ID: r.ID, Label: r.Label, Provider: r.Provider, AuthKind: r.AuthKind,
		BaseUrl: r.BaseUrl, Paused: r.Paused, BrokenAt: r.BrokenAt, RecoveryProbe: r.RecoveryProbe, MaxConcurrency: r.MaxConcurrency,
		Priority: r.Priority, LastUsedAt: r.LastUsedAt, OverloadedAt: r.OverloadedAt, OwnerKeyID: r.OwnerKeyID, OwnerTeamID: r.OwnerTeamID})}
	if r.CooldownUntil != nil {
		cd := policyCooldown(db.Cooldown{
			AccountID: r.ID,
			Reason:    *r.CooldownReason,
			Transient: r.CooldownTransient.Bool,
			Until:     *r.CooldownUntil,
			WrittenAt: *r.CooldownWrittenAt,
			Evidence:  r.CooldownEvidence,
			// The quota evidence behind the deadline, if any.
			QuotaKind:          r.CooldownQuotaKind,
			QuotaResetsAt:      r.CooldownQuotaResetsAt,
			QuotaWindowMinutes: orZero(r.CooldownQuotaWindowMinutes),
			QuotaMessage:       orZero(r.CooldownQuotaMessage),
		})
		c.Cooldown = &cd
	}
	c.FiveHour = policyWindow(r.FiveHourUtilization, r.FiveHourResetsAt)
	c.SevenDay = policyWindow(r.SevenDayUtilization, r.SevenDayResetsAt)
	return &routeEntry{cand: c, revision: r.CredentialRevision, gates: gates}
}

// reindex sorts the entries as the pool is listed and indexes them.
func (s *routeSnap) reindex() {
	slices.SortFunc(s.entries, func(a, b *routeEntry) int {
		if c := cmp.Compare(a.cand.Account.Label, b.cand.Account.Label); c != 0 {
			return c
		}
		return slices.Compare(a.cand.Account.ID[:], b.cand.Account.ID[:])
	})
	s.index = make(map[uuid.UUID]int, len(s.entries))
	for i, e := range s.entries {
		s.index[e.cand.Account.ID] = i
	}
}

// with is s with the named accounts replaced by their rows read again:
// an account without a row is gone.
func (s *routeSnap) with(ids []uuid.UUID, rows []db.RoutingAccountsRow, gates []db.FamilyGate) *routeSnap {
	out := &routeSnap{entries: slices.Clone(s.entries), index: s.index, epoch: s.epoch}
	byAccount := gatesByAccount(gates)
	found := make(map[uuid.UUID]bool, len(rows))
	reorder := false
	changed := make([]int, 0, len(rows))
	for _, r := range rows {
		found[r.ID] = true
		e := newRouteEntry(r, byAccount[r.ID])
		i, ok := s.index[r.ID]
		if !ok || s.entries[i].cand.Account.Label != r.Label {
			reorder = true
		}
		if ok {
			out.entries[i] = e
			changed = append(changed, i)
		} else {
			out.entries = append(out.entries, e)
		}
	}
	for _, id := range ids {
		if i, ok := s.index[id]; ok && !found[id] {
			out.entries[i] = nil
			reorder = true
		}
	}
	if reorder {
		out.entries = slices.DeleteFunc(out.entries, func(e *routeEntry) bool { return e == nil })
		out.reindex()
		return out // indexed anew at its first route
	}
	out.inherit(s, changed)
	return out
}

// inherit makes s's index, when it is first needed, s's predecessor's
// updated for the positions changed since (from), while that costs less
// than indexing anew.
func (s *routeSnap) inherit(prev *routeSnap, changed []int) {
	if s.epoch == 0 {
		return
	}
	// from before ix: routeIndex stores ix before it drops from.
	f := prev.from.Load()
	from := &indexFrom{ix: prev.ix.Load(), changed: changed}
	if from.ix == nil {
		// The predecessor was never routed over: its own predecessor's,
		// for both changes.
		if f == nil {
			return
		}
		from = &indexFrom{ix: f.ix, changed: append(slices.Clone(f.changed), changed...)}
	}
	if len(from.changed) > len(s.entries)/4 {
		return // as dear as a new index: one is made
	}
	s.from.Store(from)
}

// routeIndex is the routing index over s's accounts, serving now: made at
// the first route (from the predecessor's when there is one: inherit),
// and moved on when now passes one of its deadlines (an overload mark
// that expires, a usage window that resets). Nil for a private read,
// routed once: the whole pool is ranked then, as it always was.
func (s *routeSnap) routeIndex(now time.Time) *policy.Index {
	if s.epoch == 0 {
		return nil
	}
	if ix := s.ix.Load(); ix != nil && ix.ValidAt(now) {
		return ix
	}
	s.ixMu.Lock()
	defer s.ixMu.Unlock()
	ix := s.ix.Load()
	switch from := s.from.Load(); {
	case ix != nil && ix.ValidAt(now):
		return ix
	case ix != nil:
		ix = ix.Update(s, nil, now)
	case from != nil:
		ix = from.ix.Update(s, from.changed, now)
	default:
		ix = policy.NewIndex(s, now)
	}
	s.ix.Store(ix)
	s.from.Store(nil) // what it was made from may go
	return ix
}

// Len, Base and Position make s the pool its index reads
// (policy.IndexedPool): each entry's candidate without what a request
// adds.
func (s *routeSnap) Len() int                     { return len(s.entries) }
func (s *routeSnap) Base(i int) *policy.Candidate { return &s.entries[i].cand }
func (s *routeSnap) Position(id uuid.UUID) (int, bool) {
	i, ok := s.index[id]
	return i, ok
}

// refreshed is s with a slice of the rolling refresh installed: the rows
// read of ids, which were from's entries. Only the accounts whose entry
// in s is still the one from had take the rows (or leave, without one):
// one read again alone since (readDirty) keeps that read, made after its
// invalidation, and one gone since does not come back. Nothing is
// installed over a snapshot read whole since (a new epoch, an "all"):
// every entry of it is newer than from's.
func (s *routeSnap) refreshed(from *routeSnap, ids []uuid.UUID, rows []db.RoutingAccountsRow, gates []db.FamilyGate) *routeSnap {
	if s.epoch != from.epoch || len(ids) == 0 {
		return s
	}
	same := make(map[uuid.UUID]bool, len(ids))
	kept := make([]uuid.UUID, 0, len(ids))
	for _, id := range ids {
		if i, ok := s.index[id]; ok && s.entries[i] == from.entries[from.index[id]] {
			same[id] = true
			kept = append(kept, id)
		}
	}
	if len(kept) == 0 {
		return s
	}
	rows = slices.DeleteFunc(slices.Clone(rows), func(r db.RoutingAccountsRow) bool { return !same[r.ID] })
	return s.with(kept, rows, gates)
}

// row is what a claim of one of s's candidates starts from: the account's
// id, label and the credential revision routing saw (the claim reads the
// rest).
func (s *routeSnap) row(c *policy.Candidate) db.Account {
	return db.Account{ID: c.Account.ID, Label: c.Account.Label, CredentialRevision: s.entries[s.index[c.Account.ID]].revision}
}

// leased notes that this replica leased the account at now.
func (s *routeSnap) leased(id uuid.UUID, now time.Time) {
	if i, ok := s.index[id]; ok {
		s.entries[i].usedAt.Store(now.UnixNano())
	}
}

// candidates is the pool as one request's routing reads it at now: each
// account with its live leases and waiters (f), its gate for family, and
// only what is still live of its cooldown and windows.
func (s *routeSnap) candidates(family string, now time.Time, f *db.AcquireFactsRow) []policy.Candidate {
	out := candidateBuffer(len(s.entries))
	for i := range s.entries {
		s.candidate(i, &out[i], family, now)
	}
	for j, id := range f.LiveIds {
		if i, ok := s.index[id]; ok {
			out[i].Live = f.LiveCounts[j]
		}
	}
	for j, id := range f.WaiterIds {
		if i, ok := s.index[id]; ok {
			out[i].WaitingAhead, out[i].Waiting = f.WaitersAhead[j], f.Waiters[j]
		}
	}
	return out
}

// candidate writes the account at position i into c as candidates does,
// less its live leases and waiters.
func (s *routeSnap) candidate(i int, c *policy.Candidate, family string, now time.Time) {
	e := s.entries[i]
	*c = e.cand
	if used := e.usedAt.Load(); used != 0 {
		if t := time.Unix(0, used); c.Account.LastUsedAt == nil || t.After(*c.Account.LastUsedAt) {
			c.Account.LastUsedAt = &t
		}
	}
	if c.Cooldown != nil && !c.Cooldown.Until.After(now) {
		c.Cooldown = nil
	}
	if c.FiveHour != nil && !c.FiveHour.ResetsAt.After(now) {
		c.FiveHour = nil
	}
	if c.SevenDay != nil && !c.SevenDay.ResetsAt.After(now) {
		c.SevenDay = nil
	}
	for j := range e.gates {
		if g := &e.gates[j]; g.Family == family && g.Until.After(now) {
			c.Gate = g
		}
	}
}

// requestFacts is one request's live leases and waiters by account
// position, for the accounts its route looks at one by one
// (policy.RouteIndexed's Fill) rather than the whole pool's candidates.
type requestFacts struct {
	live    map[int]int32
	waiters map[int][2]int32 // ahead, every other
}

// factsOf is f by position in s, each account's last entry winning as in
// candidates.
func (s *routeSnap) factsOf(f *db.AcquireFactsRow) requestFacts {
	out := requestFacts{live: make(map[int]int32, len(f.LiveIds)), waiters: make(map[int][2]int32, len(f.WaiterIds))}
	for j, id := range f.LiveIds {
		if i, ok := s.index[id]; ok {
			out.live[i] = f.LiveCounts[j]
		}
	}
	for j, id := range f.WaiterIds {
		if i, ok := s.index[id]; ok {
			out.waiters[i] = [2]int32{f.WaitersAhead[j], f.Waiters[j]}
		}
	}
	return out
}

// fill writes the account at position i into c exactly as candidates
// does for the request whose facts these are.
func (s *routeSnap) fill(i int, c *policy.Candidate, family string, now time.Time, rf *requestFacts) {
	s.candidate(i, c, family, now)
	c.Live = rf.live[i]
	w := rf.waiters[i]
	c.WaitingAhead, c.Waiting = w[0], w[1]
}

// candBufs are the candidate slices of finished reads, for the next ones:
// at 10,000 accounts a read's is 1.7 MB.
var candBufs sync.Pool

// candidateBuffer is a slice of n candidates, every one to be written.
func candidateBuffer(n int) []policy.Candidate {
	if p, ok := candBufs.Get().(*[]policy.Candidate); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]policy.Candidate, n)
}

// recycleCandidates gives a read's candidates back once nothing refers to
// them (policy's orders are copies).
func recycleCandidates(cs []policy.Candidate) {
	if cap(cs) == 0 {
		return
	}
	clear(cs) // no pointer into an old snapshot outlives it here
	candBufs.Put(&cs)
}
