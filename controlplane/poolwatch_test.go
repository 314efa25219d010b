package controlplane

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// watchTimeout bounds every wait for a stream message: a missing event
// fails the test instead of hanging it.
const watchTimeout = 20 * time.Second

// watching is setup with the replica started (its listener running) and
// a WatchPool stream open, its ready message already received.
func watching(t *testing.T) (*env, *connect.ServerStreamForClient[weirv1.WatchPoolResponse]) {
	t.Helper()
	e := setup(t)
	if err := e.srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.srv.Stop(context.Background()) }) //nolint:errcheck // teardown
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	stream, err := e.dp.leases.WatchPool(ctx, connect.NewRequest(&weirv1.WatchPoolRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	first := nextEvent(t, stream)
	if !first.Ready || first.All || first.Keys || len(first.AccountIds) != 0 {
		t.Fatalf("first message %v, want ready alone", first)
	}
	return e, stream
}

// nextEvent receives the stream's next message within watchTimeout.
func nextEvent(t *testing.T, stream *connect.ServerStreamForClient[weirv1.WatchPoolResponse]) *weirv1.WatchPoolResponse {
	t.Helper()
	got := make(chan bool, 1)
	go func() { got <- stream.Receive() }()
	select {
	case ok := <-got:
		if !ok {
			t.Fatalf("stream ended: %v", stream.Err())
		}
		return stream.Msg()
	case <-time.After(watchTimeout):
		t.Fatal("no WatchPool message within the timeout")
		return nil
	}
}

// wantAccounts requires the next message to name exactly ids.
func wantAccounts(t *testing.T, stream *connect.ServerStreamForClient[weirv1.WatchPoolResponse], what string, ids ...string) {
	t.Helper()
	m := nextEvent(t, stream)
	slices.Sort(ids)
	if m.All || m.Keys || m.Ready || !slices.Equal(m.AccountIds, ids) {
		t.Fatalf("%s: got %v, want exactly accounts %v", what, m, ids)
	}
}

func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(e.t.Context(), sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// TestWatchPoolAccountEvents: cooldowns, pauses and usage bands name their
// account; the writes every request makes name nothing.
func TestWatchPoolAccountEvents(t *testing.T) {
	t.Parallel()
	e, stream := watching(t)
	a, _ := e.createAccount(acct{})
	wantAccounts(t, stream, "account created", a.Id)
	b, _ := e.createAccount(acct{})
	wantAccounts(t, stream, "account created", b.Id)

	now := e.clock.Now()
	if _, err := e.q.WriteCooldown(t.Context(), dbCooldown(a.Id, "transport", now.Add(time.Minute), now)); err != nil {
		t.Fatal(err)
	}
	wantAccounts(t, stream, "cooldown written", a.Id)
	e.pause(b.Id)
	wantAccounts(t, stream, "paused", b.Id)

	// What every request writes is silent: the next message is the
	// resume's alone.
	e.exec(`UPDATE accounts SET last_success_at = $2, last_used_at = $2, auth_failures = 1, quota_backoffs = 1 WHERE id = $1`,
		uuid.MustParse(a.Id), now)
	e.exec(`UPDATE client_keys SET last_used_at = $1`, now)
	e.exec(`INSERT INTO usage_windows (account_id, window_name, utilization, resets_at, source, observed_at, credential_revision, poll_epoch)
		VALUES ($1, 'five_hour', 0.5, $2, 'header', $2, 1, 1)`, uuid.MustParse(a.Id), now)
	e.exec(`UPDATE usage_windows SET utilization = 0.79 WHERE account_id = $1`, uuid.MustParse(a.Id))
	e.resume(b.Id)
	wantAccounts(t, stream, "resumed", b.Id)

	// Crossing a band, either way, is not.
	e.exec(`UPDATE usage_windows SET utilization = 0.85 WHERE account_id = $1`, uuid.MustParse(a.Id))
	wantAccounts(t, stream, "0.79 -> 0.85", a.Id)
	e.exec(`UPDATE usage_windows SET utilization = NULL WHERE account_id = $1`, uuid.MustParse(a.Id))
	wantAccounts(t, stream, "0.85 -> none", a.Id)

	// A success's release: the out-of-credits cooldown it clears is an
	// event, its success record is not.
	_, key := e.createKey("")
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: key, PreferAccountId: b.Id})
	e.release(l.Id, succeeded200())
	e.pause(a.Id)
	wantAccounts(t, stream, "paused after a success", a.Id)
}

// TestWatchPoolWideEvents: breakers and aliases are pool-wide; a revoked
// key is both a key event and pool-wide.
func TestWatchPoolWideEvents(t *testing.T) {
	t.Parallel()
	e, stream := watching(t)
	now := e.clock.Now()
	e.exec(`INSERT INTO overload_breakers (provider, family, overloads, window_start, updated_at) VALUES ('anthropic', 'sonnet', 1, $1, $1)`, now)
	e.exec(`UPDATE overload_breakers SET overloads = 2`)
	e.exec(`UPDATE overload_breakers SET open_until = $1, open_count = 1`, now.Add(time.Minute))
	if m := nextEvent(t, stream); !m.All || m.Keys || len(m.AccountIds) != 0 {
		t.Fatalf("breaker opened: %v, want all alone (a count is silent)", m)
	}
	e.exec(`INSERT INTO model_aliases (alias, targets, created_at, updated_at) VALUES ('best', '{claude-opus-4-1}', $1, $1)`, now)
	if m := nextEvent(t, stream); !m.All || m.Keys {
		t.Fatalf("alias set: %v, want all", m)
	}

	k, _ := e.createKey("")
	if _, err := e.admin.keys.RevokeKey(t.Context(), connect.NewRequest(&weirv1.RevokeKeyRequest{Id: k.Id})); err != nil {
		t.Fatal(err)
	}
	var keys, all bool
	for !keys || !all {
		m := nextEvent(t, stream)
		keys, all = keys || m.Keys, all || m.All
	}
}

// TestWatchPoolListenerLost: the listening connection killed, every stream
// hears "all" (what changed meanwhile was never announced) and goes on.
func TestWatchPoolListenerLost(t *testing.T) {
	t.Parallel()
	e, stream := watching(t)
	a, _ := e.createAccount(acct{})
	wantAccounts(t, stream, "account created", a.Id)

	if n := e.count(`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND query = 'LISTEN weir_pool'`); n != 1 {
		t.Fatalf("terminated %d listening backends, want 1", n)
	}
	// The stream ends: its worker must stop reusing leases now, not keep
	// reusing ones granted while nothing listened.
	ended := make(chan bool, 1)
	go func() { ended <- stream.Receive() }()
	select {
	case ok := <-ended:
		if ok {
			t.Fatalf("after the listener was lost: %v, want the stream to end", stream.Msg())
		}
		wantCode(t, stream.Err(), connect.CodeUnavailable)
	case <-time.After(watchTimeout):
		t.Fatal("the stream outlived its listener")
	}
	// A new stream says ready once the replica listens again, and sees
	// changes from then on.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	again, err := e.dp.leases.WatchPool(ctx, connect.NewRequest(&weirv1.WatchPoolRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if m := nextEvent(t, again); !m.Ready {
		t.Fatalf("new stream's first message %v, want ready", m)
	}
	e.pause(a.Id)
	for {
		m := nextEvent(t, again)
		if m.All && len(m.AccountIds) == 0 {
			continue // the reconnection's own "all", if it raced the subscribe
		}
		if !slices.Equal(m.AccountIds, []string{a.Id}) {
			t.Fatalf("after reconnecting: %v, want account %s", m, a.Id)
		}
		break
	}
}

// TestWatchPoolEndsOnStop: a stopping replica ends its streams
// (Unavailable: the worker watches another), and a new stream on a
// replica that does not listen never says ready.
func TestWatchPoolEndsOnStop(t *testing.T) {
	t.Parallel()
	e, stream := watching(t)
	if err := e.srv.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	done := make(chan bool, 1)
	go func() { done <- stream.Receive() }()
	select {
	case ok := <-done:
		if ok {
			t.Fatalf("message after stop: %v", stream.Msg())
		}
		wantCode(t, stream.Err(), connect.CodeUnavailable)
	case <-time.After(watchTimeout):
		t.Fatal("the stream outlived the replica's stop")
	}

	idle := setup(t) // never started: nothing listens
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	s, err := idle.dp.leases.WatchPool(ctx, connect.NewRequest(&weirv1.WatchPoolRequest{}))
	if err == nil {
		if s.Receive() {
			t.Fatalf("a replica that does not listen said %v", s.Msg())
		}
		err = s.Err()
	}
	wantCode(t, err, connect.CodeDeadlineExceeded)
}

func TestWatchPoolNeedsTheDataplaneToken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	s, err := e.admin.leases.WatchPool(t.Context(), connect.NewRequest(&weirv1.WatchPoolRequest{}))
	if err == nil {
		if s.Receive() {
			t.Fatalf("the admin token watched: %v", s.Msg())
		}
		err = s.Err()
	}
	wantCode(t, err, connect.CodeUnauthenticated)
}

// TestPoolSubCoalesces: events pile into one message; past the bound, a
// slow stream's accounts collapse into all, keeping keys.
func TestPoolSubCoalesces(t *testing.T) {
	t.Parallel()
	s := &poolSub{wake: make(chan struct{}, 1), accounts: map[string]bool{}}
	if m, _, lost := s.take(); m != nil || lost {
		t.Fatal("message with nothing pending")
	}
	s.add(poolEvent{account: "b"})
	s.add(poolEvent{account: "a"})
	s.add(poolEvent{account: "b"})
	if m, _, _ := s.take(); m.All || m.Keys || !slices.Equal(m.AccountIds, []string{"a", "b"}) {
		t.Fatalf("got %v, want accounts a and b in one message", m)
	}
	s.add(poolEvent{keys: true})
	for i := range maxPendingAccounts + 1 {
		s.add(poolEvent{account: fmt.Sprint(i)})
	}
	if m, _, _ := s.take(); !m.All || !m.Keys || len(m.AccountIds) != 0 {
		t.Fatalf("got %d accounts all=%v keys=%v, want all and keys alone", len(m.AccountIds), m.All, m.Keys)
	}
	s.add(poolEvent{account: "c"})
	s.add(poolEvent{lost: true})
	if m, _, lost := s.take(); m != nil || !lost {
		t.Fatalf("after a loss got %v lost=%v, want the stream to end", m, lost)
	}
	if got := parsePoolEvent("not-an-id"); !got.all {
		t.Errorf("an unknown payload parsed as %+v, want all", got)
	}
}

// TestAnnounceWaitsForStreams: an operator's change returns only once
// every stream of the replica has been sent it, so the next request on a
// worker watching it already follows the change. A subscriber that has
// not sent holds PauseAccount back; its send lets it return.
func TestAnnounceWaitsForStreams(t *testing.T) {
	t.Parallel()
	e, _ := watching(t)
	a, _ := e.createAccount(acct{})
	sub := e.srv.watch.subscribe()
	defer e.srv.watch.unsubscribe(sub)
	before := sub.publishedCount()

	done := make(chan struct{})
	go func() {
		defer close(done)
		e.pause(a.Id)
	}()
	select {
	case <-sub.wake: // the pause reached the subscriber
	case <-time.After(watchTimeout):
		t.Fatal("the pause never reached the subscriber")
	}
	published := sub.publishedCount()
	if published <= before {
		t.Fatalf("published %d, %d before the pause", published, before)
	}
	select {
	case <-done:
		t.Fatal("PauseAccount returned before the subscriber sent the pause")
	default:
	}
	sub.markSent(published, false)
	select {
	case <-done:
	case <-time.After(watchTimeout):
		t.Fatal("PauseAccount still waiting after the subscriber sent the pause")
	}
}
