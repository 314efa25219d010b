package controlplane

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	"github.com/weirhq/weir/controlplane/seal"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// started is e with its replica started: the pool notifications heard,
// the routing cache in use.
func (e *env) started() *env {
	e.t.Helper()
	if err := e.srv.Start(e.t.Context()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { e.srv.Stop(context.Background()) }) //nolint:errcheck // teardown
	return e
}

// cachedView is the pool as e's routing cache shows it for family at now;
// freshView as Postgres does.
func (e *env) cachedView(family string, now time.Time) []policy.Candidate {
	e.t.Helper()
	v, err := e.srv.leases().routingView(e.t.Context(), "", "", "", family, waiter{}, now)
	if err != nil {
		e.t.Fatal(err)
	}
	return v.all()
}

func (e *env) freshView(family string, now time.Time) []policy.Candidate {
	e.t.Helper()
	rows, gates, err := e.srv.routes.load(e.t.Context(), nil)
	if err != nil {
		e.t.Fatal(err)
	}
	f, err := e.q.AcquireFacts(e.t.Context(), acquireFactsAt(now))
	if err != nil {
		e.t.Fatal(err)
	}
	return newRouteSnap(rows, gates, 0).candidates(family, now, &f)
}

// acquireFactsAt asks AcquireFacts for no key, session or waiter at now.
func acquireFactsAt(now time.Time) db.AcquireFactsParams {
	return db.AcquireFactsParams{Now: now, WaitingSince: now, WaitersSeenSince: now.Add(-waiterTTL), BoundSince: now}
}

// announced blanks what the cache keeps only as fresh as its periodic
// read (routeRefreshEvery): the columns no notification announces.
func announced(cs []policy.Candidate) []policy.Candidate {
	out := make([]policy.Candidate, len(cs))
	for i, c := range cs {
		c.Account.LastUsedAt, c.Account.OverloadedAt = nil, nil
		c.FiveHour, c.SevenDay = banded(c.FiveHour), banded(c.SevenDay)
		out[i] = c
	}
	return out
}

// banded is a window as the notifications announce it: its band, none
// for the lowest (a reading is announced when it enters a band, not when
// it first appears below them).
func banded(w *policy.Window) *policy.Window {
	if w == nil || usageBand(&w.Utilization) == 0 {
		return nil
	}
	return &policy.Window{Utilization: float64(usageBand(&w.Utilization))}
}

// TestRouteCacheFollowsThePool: over a mixed pool changed at random, by
// operators' calls and by writes straight to Postgres, on one replica or
// the other, each replica's routing cache shows what Postgres does, for
// every family, once the notifications committed before have been heard
// (what announce waits for). Each write is one a worker, an operator or a
// job makes; what no notification announces is compared by its band.
func TestRouteCacheFollowsThePool(t *testing.T) {
	t.Parallel()
	e := setup(t).started()
	r := e.replica().started()
	replicas := []*env{e, r}
	rng := rand.New(rand.NewPCG(7, 26))
	var ids []string
	made := 0
	for i := range 6 {
		made++
		a, _ := e.createAccount(acct{label: fmt.Sprintf("acct-%02d", i)})
		ids = append(ids, a.Id)
	}
	families := []string{"sonnet", "opus", "haiku"}
	for step := range 120 {
		now := e.clock.Now()
		on := replicas[rng.IntN(2)]
		id := uuid.MustParse(ids[rng.IntN(len(ids))])
		var what string
		switch rng.IntN(9) {
		case 0:
			what = "pause"
			on.pause(id.String())
		case 1:
			what = "resume"
			on.resume(id.String())
		case 2:
			what = "cooldown"
			e.exec(`INSERT INTO cooldowns (account_id, reason, transient, until, written_at, evidence)
				VALUES ($1, 'rate_limited', true, $2, $3, '{}')
				ON CONFLICT (account_id) DO UPDATE SET until = EXCLUDED.until`, id, now.Add(time.Duration(1+rng.IntN(60))*time.Second), now)
		case 3:
			what = "cooldown lifted"
			e.exec(`DELETE FROM cooldowns WHERE account_id = $1`, id)
		case 4:
			what = "gate"
			e.exec(`INSERT INTO family_gates (account_id, family, until, written_at, evidence) VALUES ($1, $2, $3, $4, '{}')
				ON CONFLICT (account_id, family) DO UPDATE SET until = EXCLUDED.until`,
				id, families[rng.IntN(len(families))], now.Add(time.Duration(1+rng.IntN(3600))*time.Second), now)
		case 5:
			what = "usage"
			u := []float64{0.1, 0.5, 0.85, 0.95, 1.0}[rng.IntN(5)]
			e.exec(`INSERT INTO usage_windows (account_id, window_name, utilization, resets_at, source, observed_at, credential_revision, poll_epoch)
				VALUES ($1, $2, $3, $4, 'header', $5, 1, 1)
				ON CONFLICT (account_id, window_name) DO UPDATE SET utilization = EXCLUDED.utilization, resets_at = EXCLUDED.resets_at`,
				id, []string{"five_hour", "seven_day"}[rng.IntN(2)], u, now.Add(time.Duration(1+rng.IntN(48))*time.Hour), now)
		case 6:
			what = "priority"
			if _, err := on.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
				Id: id.String(), Priority: int32(rng.IntN(3)), UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"priority"}}})); err != nil {
				t.Fatal(err)
			}
		case 7:
			what = "account added"
			made++
			a, _ := on.createAccount(acct{label: fmt.Sprintf("acct-%02d", made)})
			ids = append(ids, a.Id)
		case 8:
			if len(ids) < 3 {
				continue
			}
			what = "account deleted"
			i := rng.IntN(len(ids))
			if _, err := on.admin.accounts.DeleteAccount(t.Context(), connect.NewRequest(&weirv1.DeleteAccountRequest{Id: ids[i]})); err != nil {
				t.Fatal(err)
			}
			ids = append(ids[:i], ids[i+1:]...)
		}
		if rng.IntN(4) == 0 {
			e.clock.Advance(time.Duration(rng.IntN(90)) * time.Second)
		}
		now = e.clock.Now()
		for ri, rep := range replicas {
			rep.srv.watch.announce(t.Context())
			for _, family := range families {
				got, want := announced(rep.cachedView(family, now)), announced(rep.freshView(family, now))
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d (%s on %s), replica %d, %s: the cache shows\n%s\nPostgres\n%s",
						step, what, id, ri, family, describeCands(got), describeCands(want))
				}
			}
		}
	}
}

func describeCands(cs []policy.Candidate) string {
	var s string
	for _, c := range cs {
		s += fmt.Sprintf("  %s paused=%v prio=%d cooldown=%v gate=%v 5h=%v 7d=%v\n", c.Account.Label, c.Account.Paused,
			c.Account.Priority, c.Cooldown != nil, c.Gate != nil, c.FiveHour, c.SevenDay)
	}
	return s
}

// TestRouteCacheListenerLost: a change made while nothing listened (no
// notification of it is ever heard) is routed on all the same: reads go
// to Postgres until the replica listens again, and then read it whole.
func TestRouteCacheListenerLost(t *testing.T) {
	t.Parallel()
	e := setup(t).started()
	a, _ := e.createAccount(acct{label: "a"})
	now := e.clock.Now()
	if v := e.cachedView("sonnet", now); len(v) != 1 || v[0].Gate != nil {
		t.Fatalf("before: %s", describeCands(v))
	}
	if n := e.count(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND query = 'LISTEN weir_pool'`); n != 1 {
		t.Fatalf("terminated %d listening backends, want 1", n)
	}
	// The listener may not have noticed yet: wait until it has, so the
	// gate below is written while nothing listens.
	deadline := time.Now().Add(watchTimeout)
	for e.srv.watch.listening() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the replica did not notice its listening connection was lost")
		}
		runtime.Gosched()
	}
	e.exec(`INSERT INTO family_gates (account_id, family, until, written_at, evidence) VALUES ($1, 'sonnet', $2, $3, '{}')`,
		uuid.MustParse(a.Id), now.Add(time.Hour), now)
	if v := e.cachedView("sonnet", now); len(v) != 1 || v[0].Gate == nil {
		t.Fatalf("while nothing listens, the gate is not routed on: %s", describeCands(v))
	}
	// Listening again, the cache is read whole: the gate is still there.
	ctx, cancel := context.WithTimeout(t.Context(), watchTimeout)
	defer cancel()
	if err := e.srv.watch.waitUp(ctx); err != nil {
		t.Fatalf("the replica did not listen again: %v", err)
	}
	if v := e.cachedView("sonnet", now); len(v) != 1 || v[0].Gate == nil {
		t.Fatalf("after listening again, the gate is not routed on: %s", describeCands(v))
	}
}

// TestRouteCacheLocalFailure: a failure released on this replica is
// routed on by its next Acquire, without waiting for its notification:
// the account answered overloaded, so a turn goes to the other one.
func TestRouteCacheLocalFailure(t *testing.T) {
	t.Parallel()
	e := setup(t).started()
	e.createAccount(acct{label: "a"})
	e.createAccount(acct{label: "b"})
	_, hash := e.createKey("k")
	req := &weirv1.AcquireRequest{KeyHash: hash, Model: "claude-sonnet-4-5", RequestId: "r1", Surface: weirv1.Surface_SURFACE_MESSAGES}
	first := e.acquire(req).GetLease()
	if first == nil {
		t.Fatal("no lease")
	}
	e.release(first.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, Status: 529})
	for i := range 5 {
		req.RequestId = fmt.Sprintf("r%d", i+2)
		next := e.acquire(req).GetLease()
		if next == nil || next.AccountId == first.AccountId {
			t.Fatalf("after %s answered overloaded, turn %d went to %v", first.AccountLabel, i, next)
		}
		e.release(next.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
	}
}

// TestRouteCacheCatchUp: before an answer that nothing can serve, a
// route over a snapshot that missed a change committed before it (a
// replica that stalled while notifications queued) is told to route
// again; one over a snapshot that missed nothing, or read straight from
// Postgres, is not.
func TestRouteCacheCatchUp(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, _ := e.createAccount(acct{label: "a"})
	c := e.srv.routes
	fresh, err := c.read(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if c.catchUp(t.Context(), fresh) {
		t.Error("a snapshot read from Postgres (nothing listening) was told it missed a change")
	}
	e.started()
	if err := e.srv.watch.waitUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	s, err := c.read(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if s.epoch == 0 {
		t.Fatal("the started replica's read did not come from its cache")
	}
	if c.catchUp(t.Context(), s) {
		t.Error("a snapshot that missed nothing was told to route again")
	}
	// Committed, and not yet heard when the route was made.
	e.pause(a.Id)
	if !c.catchUp(t.Context(), s) {
		t.Error("a snapshot that missed a pause was not told to route again")
	}
	s, err = c.read(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if i, ok := s.index[uuid.MustParse(a.Id)]; !ok || !s.entries[i].cand.Account.Paused {
		t.Error("the read after catching up does not show the pause")
	}
	if c.catchUp(t.Context(), s) {
		t.Error("the read after catching up was told to route again")
	}
}

// TestRefreshPace: the rolling refresh's period and slice at the sizes
// that matter, the figures routeReadShare's comment gives among them.
func TestRefreshPace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		accounts int
		spent    time.Duration // what the last cycle's reads took
		period   time.Duration
		slice    int
	}{
		{0, 0, time.Second, 0},
		{6, time.Millisecond, time.Second, 6},                        // one slice, then the period waits out
		{300, 3 * time.Millisecond, time.Second, 100},                // routeSliceMin: three slices
		{1000, 4 * time.Millisecond, time.Second, 100},               // ten slices of a second's ticks
		{10000, 0, time.Second, 1000},                                // nothing measured yet
		{10000, 25 * time.Millisecond, time.Second, 1000},            // 40 × 25 ms is the floor
		{10000, 45 * time.Millisecond, 1800 * time.Millisecond, 556}, // 18 ticks
		{10000, 53 * time.Millisecond, 2120 * time.Millisecond, 477}, // 21 ticks (a part tick rounds down)
		{100000, 500 * time.Millisecond, 20 * time.Second, 500},      // 200 ticks
		{10000, 2 * time.Second, 80 * time.Second, routeSliceMin},    // a pool very slow to read
		{50, 0, time.Second, 50},                                     // the pool, not more
	} {
		period := refreshPeriod(tc.spent)
		if period != tc.period {
			t.Errorf("%d accounts read in %v: period %v, want %v", tc.accounts, tc.spent, period, tc.period)
		}
		if got := refreshSlice(tc.accounts, period); got != tc.slice {
			t.Errorf("%d accounts, period %v: slice %d, want %d", tc.accounts, period, got, tc.slice)
		}
	}
}

// TestRouteSnapRefreshed: a slice read installs only over the entries it
// was read from. An account read again alone meanwhile (readDirty, after
// its invalidation) keeps that read, one deleted meanwhile does not come
// back, and a snapshot read whole meanwhile takes nothing of it.
func TestRouteSnapRefreshed(t *testing.T) {
	t.Parallel()
	row := func(id uuid.UUID, label string, prio int32) db.RoutingAccountsRow {
		return db.RoutingAccountsRow{ID: id, Label: label, Provider: providerAnthropic, AuthKind: "api_key", MaxConcurrency: 4, Priority: prio}
	}
	a, b, c, d := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	from := newRouteSnap([]db.RoutingAccountsRow{row(a, "a", 0), row(b, "b", 0), row(c, "c", 0), row(d, "d", 0)}, nil, 1)
	// While the slice (a, b, c) is read: b is read again alone after a
	// change, c is deleted.
	now := from.with([]uuid.UUID{b, c}, []db.RoutingAccountsRow{row(b, "b", 2)}, nil)
	// The slice's rows: a changed, b before its change, c before its
	// deletion.
	slice := []db.RoutingAccountsRow{row(a, "a", 1), row(b, "b", 0), row(c, "c", 0)}
	got := now.refreshed(from, []uuid.UUID{a, b, c}, slice, nil)
	prio := map[uuid.UUID]int32{}
	for _, e := range got.entries {
		prio[e.cand.Account.ID] = e.cand.Account.Priority
	}
	if want := map[uuid.UUID]int32{a: 1, b: 2, d: 0}; !reflect.DeepEqual(prio, want) {
		t.Errorf("priorities after the slice: %v, want a 1 (the slice's), b 2 (read alone since), d 0, no c (deleted since); a=%s b=%s c=%s d=%s",
			prio, a, b, c, d)
	}
	if got.entries[got.index[d]] != from.entries[from.index[d]] {
		t.Error("an account outside the slice was replaced")
	}
	// An account the slice finds deleted leaves.
	if got := from.refreshed(from, []uuid.UUID{a, b}, slice[:1], nil); len(got.entries) != 3 {
		t.Errorf("the slice found b deleted: the snapshot holds %d entries, want 3", len(got.entries))
	} else if _, ok := got.index[b]; ok {
		t.Error("the slice found b deleted: the snapshot still holds it")
	}
	// Read whole since, of the same epoch or a new one.
	for _, epoch := range []uint64{1, 2} {
		whole := newRouteSnap([]db.RoutingAccountsRow{row(a, "a", 3), row(b, "b", 3), row(d, "d", 3)}, nil, epoch)
		if got := whole.refreshed(from, []uuid.UUID{a, b, c}, slice, nil); got != whole {
			t.Errorf("epoch %d: a slice read before a whole read was installed over it", epoch)
		}
	}
}

// TestRouteCacheRollingRefresh: what no notification announces (an
// overload mark, a last use, a usage reading within its band) reaches the
// cache through the rolling refresh within one cycle over a pool of
// several slices, slice by slice in the pool's order; the refresh clears
// no invalidation, and begins no cycle while no Acquire reads the cache.
func TestRouteCacheRollingRefresh(t *testing.T) {
	t.Parallel()
	e := setup(t).started()
	ctx := t.Context()
	c := e.srv.routes
	c.stop() // the test drives the refresh itself
	if err := e.srv.watch.waitUp(ctx); err != nil {
		t.Fatal(err)
	}
	const accounts = 300
	now := e.clock.Now()
	ids := make([]uuid.UUID, accounts)
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		for i := range ids {
			ids[i] = uuid.New()
			cred := apiKey()
			if _, err := q.CreateAccount(ctx, db.CreateAccountParams{ID: ids[i], Provider: providerAnthropic, AuthKind: "api_key",
				Label: fmt.Sprintf("roll-%03d", i), MaxConcurrency: 4, CredentialSealed: e.srv.seal.Seal(ids[i], 1, cred),
				CredentialHint: seal.Hint(cred), Now: now}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	e.srv.watch.announce(ctx)
	e.cachedView("sonnet", now) // read whole
	peek := func(id uuid.UUID) policy.Candidate {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.snap.entries[c.snap.index[id]].cand
	}
	first, middle, last := ids[0], ids[accounts/2], ids[accounts-1]
	e.exec(`UPDATE accounts SET overloaded_at = $2 WHERE id = $1`, first, now)
	e.exec(`UPDATE accounts SET last_used_at = $2 WHERE id = $1`, middle, now)
	e.exec(`INSERT INTO usage_windows (account_id, window_name, utilization, resets_at, source, observed_at, credential_revision, poll_epoch)
		VALUES ($1, 'five_hour', 0.5, $2, 'header', $3, 1, 1)`, last, now.Add(time.Hour), now)
	e.srv.watch.announce(ctx)
	e.cachedView("sonnet", now) // an Acquire reads the cache
	if peek(first).Account.OverloadedAt != nil || peek(middle).Account.LastUsedAt != nil || peek(last).FiveHour != nil {
		t.Fatal("a change no notification announces reached the cache before the rolling refresh")
	}

	// A tick past the period: the cycle begins, its first slice read.
	c.mu.Lock()
	tick := c.roll.began.Add(refreshPeriod(c.roll.cost))
	c.mu.Unlock()
	step := func() {
		t.Helper()
		if err := c.refresh(ctx, tick); err != nil {
			t.Fatal(err)
		}
		tick = tick.Add(routeSliceEvery)
	}
	// cycle reads the rest of a cycle of which read slices are read, and
	// says how many it read in all.
	cycle := func(read int) int {
		t.Helper()
		for {
			c.mu.Lock()
			active := c.roll.active
			c.mu.Unlock()
			if !active {
				return read
			}
			if read == accounts/routeSliceMin {
				t.Fatalf("the cycle did not end in %d slices of %d accounts", read, routeSliceMin)
			}
			step()
			read++
		}
	}
	step()
	if peek(first).Account.OverloadedAt == nil {
		t.Fatal("the first slice did not read the first account's overload mark")
	}
	if peek(last).FiveHour != nil {
		t.Fatal("the first slice read the last account: the pool was read whole")
	}
	// An account invalidated while its slice is read stays to be read
	// again: the slice may predate the change.
	c.invalidate(middle)
	if n := cycle(1); n != accounts/routeSliceMin {
		t.Errorf("the cycle read %d slices, want %d", n, accounts/routeSliceMin)
	}
	if peek(middle).Account.LastUsedAt == nil || peek(last).FiveHour == nil {
		t.Fatal("after a whole cycle, the cache misses a change no notification announced")
	}
	c.mu.Lock()
	_, dirty := c.dirty[middle]
	c.mu.Unlock()
	if !dirty {
		t.Error("the rolling refresh cleared an invalidation")
	}
	if got, want := e.cachedView("sonnet", now), e.freshView("sonnet", now); !reflect.DeepEqual(got, want) {
		t.Fatalf("after a whole cycle the cache shows\n%s\nPostgres\n%s", describeCands(got), describeCands(want))
	}

	// Read since, the cache is read once more; then, with no Acquire
	// reading it, no cycle begins.
	next := func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		tick = c.roll.began.Add(refreshPeriod(c.roll.cost))
	}
	next()
	step()
	cycle(1)
	e.exec(`UPDATE accounts SET overloaded_at = NULL WHERE id = $1`, first)
	next()
	for range accounts / routeSliceMin {
		step()
	}
	if peek(first).Account.OverloadedAt == nil {
		t.Error("the rolling refresh read the pool while no Acquire read the cache")
	}

	// Quiet now: the background reader stops ticking until an Acquire
	// reads the cache, and that read wakes it.
	if !c.quiet() {
		t.Error("no cycle runs and no Acquire read the cache since, yet not quiet")
	}
	select {
	case <-c.used: // an earlier read's, while the reader was stopped
	default:
	}
	e.cachedView("sonnet", now)
	if c.quiet() {
		t.Error("an Acquire read the cache, yet quiet")
	}
	select {
	case <-c.used:
	default:
		t.Error("an Acquire's read did not wake the background reader")
	}
}

// BenchmarkRouteSnapCandidates is what one Acquire pays to turn the
// routing cache into its candidates (before policy.RouteFirst ranks
// them), at 1,000 and 10,000 accounts: a tenth cooling, a tenth gated,
// half with readings, a few with live leases.
func BenchmarkRouteSnapCandidates(b *testing.B) {
	now := time.Now()
	for _, n := range []int{1000, 10000} {
		rows := make([]db.RoutingAccountsRow, n)
		var gates []db.FamilyGate
		f := db.AcquireFactsRow{}
		for i := range rows {
			r := &rows[i]
			r.ID, r.Label, r.Provider, r.AuthKind, r.MaxConcurrency = uuid.New(), fmt.Sprintf("a-%05d", i), providerAnthropic, "api_key", 4
			if i%10 == 0 {
				until, reason := now.Add(time.Hour), "rate_limited"
				r.CooldownUntil, r.CooldownWrittenAt, r.CooldownReason = &until, &now, &reason
			}
			if i%10 == 1 {
				gates = append(gates, db.FamilyGate{AccountID: r.ID, Family: "sonnet", Until: now.Add(time.Hour), WrittenAt: now})
			}
			if i%2 == 0 {
				u, at := float64(i%97)/100, now.Add(3*time.Hour)
				r.FiveHourUtilization, r.FiveHourResetsAt, r.SevenDayUtilization, r.SevenDayResetsAt = &u, &at, &u, &at
			}
			if i%50 == 0 {
				f.LiveIds, f.LiveCounts = append(f.LiveIds, r.ID), append(f.LiveCounts, 1)
			}
		}
		s := newRouteSnap(rows, gates, 1)
		b.Run(fmt.Sprintf("accounts=%d", n), func(b *testing.B) {
			for b.Loop() {
				recycleCandidates(s.candidates("sonnet", now, &f))
			}
		})
		// What Acquire's routing costs over the cache, before and after its
		// index: every account's candidate and the tally of them all
		// (whole_route), or the walk over the index, filling the accounts it
		// looks at (indexed_route).
		rr := policy.RouteRequest{Model: "claude-sonnet-4-5", Surface: weirv1.Surface_SURFACE_MESSAGES}
		b.Run(fmt.Sprintf("whole_route/accounts=%d", n), func(b *testing.B) {
			for b.Loop() {
				v := view{snap: s, facts: f, family: "sonnet", now: now}
				policy.RouteGatedFirst(v.all(), rr, policy.BreakerGate{}, now, claimRank)
				v.done()
			}
		})
		b.Run(fmt.Sprintf("indexed_route/accounts=%d", n), func(b *testing.B) {
			v := view{snap: s, facts: f, family: "sonnet", now: now}
			want, _, _ := policy.RouteGatedFirst(v.all(), rr, policy.BreakerGate{}, now, claimRank)
			if o, _, ok := policy.RouteIndexed(s.routeIndex(now), v.fill, rr, policy.BreakerGate{}, now, claimRank); !ok || !reflect.DeepEqual(o.First, want.First) {
				b.Fatalf("indexed route: %v %s, want %s", ok, describeCands(o.First), describeCands(want.First))
			}
			v.done()
			for b.Loop() {
				v := view{snap: s, facts: f, family: "sonnet", now: now}
				policy.RouteIndexed(s.routeIndex(now), v.fill, rr, policy.BreakerGate{}, now, claimRank)
			}
		})
	}
}
