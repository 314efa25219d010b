package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/backoff"
)

// poolChannel is the Postgres channel the 0012 triggers notify: an
// account id, "*" (pool-wide) or "keys" (a client key changed).
const poolChannel = "weir_pool"

const (
	// maxPendingAccounts bounds what a slow subscriber accumulates: past
	// it the pending accounts collapse into one "all".
	maxPendingAccounts = 256
	// listenBackoffMin and listenBackoffMax pace reconnections after the
	// listening connection is lost.
	listenBackoffMin = 100 * time.Millisecond
	listenBackoffMax = 5 * time.Second
)

var errWatchStopped = errors.New("the control plane is stopping; watch another replica")

// poolWatch holds one connection LISTENing on weir_pool and fans the
// notifications out to the WatchPool streams of this replica. It never
// waits for a subscriber: each keeps its pending invalidations in a set
// that a slow one lets grow into "all", never into a queue.
type poolWatch struct {
	pool *pgxpool.Pool
	log  *slog.Logger

	mu   sync.Mutex
	subs map[*poolSub]struct{}
	// listeners are told every event as it is published, under mu (the
	// routing cache's marks).
	listeners []func(poolEvent)
	// epoch counts the times the connection started to listen: what was
	// read while it listened in one epoch is kept true by its events.
	epoch uint64
	// syncs are announce's markers awaited, by token.
	syncs map[string]chan struct{}
	// up is whether the connection LISTENs now; upCh is closed when it
	// starts to, and replaced when it stops.
	up   bool
	upCh chan struct{}
	// everUp: the first LISTEN lost nothing; every later one may have.
	everUp  bool
	started bool
	cancel  context.CancelFunc
	// done is closed once the watch stopped for good.
	done chan struct{}
	wg   sync.WaitGroup
}

func newPoolWatch(pool *pgxpool.Pool, log *slog.Logger) *poolWatch {
	return &poolWatch{pool: pool, log: log, subs: map[*poolSub]struct{}{}, syncs: map[string]chan struct{}{},
		upCh: make(chan struct{}), done: make(chan struct{})}
}

// start runs the listener until ctx ends or stop is called. Later calls
// do nothing.
func (w *poolWatch) start(ctx context.Context) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return
	}
	w.started = true
	ctx, w.cancel = context.WithCancel(ctx)
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		w.run(ctx)
		w.mu.Lock()
		defer w.mu.Unlock()
		// Streams end, so their workers reconnect to a replica that listens.
		close(w.done)
	}()
}

// stop ends the listener and every stream, and waits for the listener.
func (w *poolWatch) stop() {
	w.mu.Lock()
	cancel := w.cancel
	w.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	w.wg.Wait()
}

// run keeps a connection listening, reconnecting with backoff.
func (w *poolWatch) run(ctx context.Context) {
	wait := listenBackoffMin
	for {
		listened, err := w.listen(ctx)
		// Stopping ends every stream instead.
		w.setDown(ctx.Err() == nil)
		if ctx.Err() != nil {
			return
		}
		if listened {
			wait = listenBackoffMin // a fresh loss: try again soon
		}
		w.log.WarnContext(ctx, "pool notifications lost; listening again", "err", err, "backoff", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = backoff.Next(wait, 0, listenBackoffMax)
	}
}

// listen holds one connection on LISTEN and publishes what it hears until
// the connection fails or ctx ends; listened says whether it got as far
// as listening.
func (w *poolWatch) listen(ctx context.Context) (listened bool, err error) {
	pc, err := w.pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("acquire a connection: %w", err)
	}
	// A connection that LISTENed never goes back to the pool: another
	// user would receive its notifications.
	conn := pc.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		conn.Close(cctx) //nolint:errcheck // closing a connection we are done with
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+poolChannel); err != nil {
		return false, fmt.Errorf("listen: %w", err)
	}
	w.setUp()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, fmt.Errorf("wait for notification: %w", err)
		}
		w.publish(parsePoolEvent(n.Payload))
	}
}

// setUp marks the connection listening. Streams open across a loss have
// ended (setDown); a subscriber that came in between still gets "all":
// what changed while nobody listened was never announced.
func (w *poolWatch) setUp() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.up = true
	w.epoch++
	close(w.upCh)
	if w.everUp {
		for s := range w.subs {
			s.add(poolEvent{all: true})
		}
	}
	w.everUp = true
}

// setDown marks the connection lost. Told, every stream ends: its worker
// stops reusing leases at once and watches again, and its new stream says
// ready only once this replica listens again. An "all" would not do: the
// worker would go on reusing leases granted while nobody listened.
func (w *poolWatch) setDown(tell bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.up {
		return
	}
	w.up = false
	w.upCh = make(chan struct{})
	if !tell {
		return
	}
	for s := range w.subs {
		s.add(poolEvent{lost: true})
	}
}

// waitUp returns once the connection listens, or ctx's error, or
// errWatchStopped.
func (w *poolWatch) waitUp(ctx context.Context) error {
	for {
		w.mu.Lock()
		up, upCh, done := w.up, w.upCh, w.done
		w.mu.Unlock()
		if up {
			return nil
		}
		select {
		case <-upCh:
		case <-done:
			return errWatchStopped
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (w *poolWatch) subscribe() *poolSub {
	s := &poolSub{wake: make(chan struct{}, 1), accounts: map[string]bool{}}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.subs[s] = struct{}{}
	return s
}

func (w *poolWatch) unsubscribe(s *poolSub) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.subs, s)
}

func (w *poolWatch) publish(ev poolEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ev.sync != "" {
		// Everything committed before the marker was published above.
		if ch := w.syncs[ev.sync]; ch != nil {
			close(ch)
			delete(w.syncs, ev.sync)
		}
		return
	}
	for _, l := range w.listeners {
		l(ev)
	}
	for s := range w.subs {
		s.add(ev)
	}
}

// onEvents tells fn every event from now on, under the watch's lock: fn
// must only take note.
func (w *poolWatch) onEvents(fn func(poolEvent)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.listeners = append(w.listeners, fn)
}

// listening is the current listening epoch, 0 while the connection does
// not listen: a read made while it listens is kept true by the events
// that follow, for as long as the epoch lasts.
func (w *poolWatch) listening() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.up {
		return 0
	}
	return w.epoch
}

// syncPrefix marks announce's own notifications.
const syncPrefix = "sync:"

// announceWait bounds how long an operator's change waits for workers to
// be told; past it the change still reaches them, just after the answer.
const announceWait = 2 * time.Second

// announce returns once every stream of this replica has been sent what
// was committed before the call: an operator's pause, revocation or alias
// change then applies to the next request on every worker watching this
// replica, not milliseconds later. A marker notification, seen after
// every earlier one (Postgres delivers in commit order), says when all of
// them were published; each stream then reports when it sent them.
// Workers on other replicas hear within the notification latency.
func (w *poolWatch) announce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, announceWait)
	defer cancel()
	if !w.sync(ctx) {
		return // nothing listens: workers reuse nothing, and ask
	}
	w.mu.Lock()
	targets := make(map[*poolSub]uint64, len(w.subs))
	for s := range w.subs {
		targets[s] = s.publishedCount()
	}
	w.mu.Unlock()
	for s, target := range targets {
		if !s.waitSent(ctx, target) {
			return
		}
	}
}

// sync returns once everything committed before the call has been
// published (to the listeners and the streams' pending sets): a marker
// notification, seen after every earlier one (Postgres delivers in commit
// order), says so. False when nothing listens or ctx ended first.
func (w *poolWatch) sync(ctx context.Context) bool {
	token := uuid.NewString()
	ch := make(chan struct{})
	w.mu.Lock()
	if !w.up {
		w.mu.Unlock()
		return false
	}
	w.syncs[token] = ch
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.syncs, token)
		w.mu.Unlock()
	}()
	if _, err := w.pool.Exec(ctx, "SELECT pg_notify('"+poolChannel+"', $1)", syncPrefix+token); err != nil {
		return false
	}
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// poolEvent is one notification.
type poolEvent struct {
	account   string
	all, keys bool
	lost      bool   // the listener lost its connection: the stream ends
	sync      string // an announce's marker (see announce), not sent on
}

// parsePoolEvent reads a notification's payload. Anything unexpected
// counts as pool-wide: dropping too much is safe, too little is not.
func parsePoolEvent(payload string) poolEvent {
	if token, ok := strings.CutPrefix(payload, syncPrefix); ok {
		return poolEvent{sync: token}
	}
	switch payload {
	case "*":
		return poolEvent{all: true}
	case "keys":
		return poolEvent{keys: true}
	}
	if _, err := uuid.Parse(payload); err != nil {
		return poolEvent{all: true}
	}
	return poolEvent{account: payload}
}

// poolSub is one stream's pending invalidations: a set, so that events
// arriving together leave as one message and a slow stream's backlog
// stays bounded.
type poolSub struct {
	// wake holds a token when something is pending.
	wake chan struct{}

	mu        sync.Mutex
	accounts  map[string]bool
	all, keys bool
	lost      bool
	// published counts the events added; sent how many of them the
	// stream has sent (sentCh is closed and replaced when it moves).
	published, sent uint64
	sentCh          chan struct{}
	ended           bool
}

func (s *poolSub) publishedCount() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.published
}

// waitSent waits until the stream sent the first n events (or ended);
// false if ctx ended first.
func (s *poolSub) waitSent(ctx context.Context, n uint64) bool {
	for {
		s.mu.Lock()
		if s.sent >= n || s.ended {
			s.mu.Unlock()
			return true
		}
		if s.sentCh == nil {
			s.sentCh = make(chan struct{})
		}
		ch := s.sentCh
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// markSent records that the events up to n were sent, or that the stream
// ended (n 0, ended).
func (s *poolSub) markSent(n uint64, ended bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = max(s.sent, n)
	s.ended = s.ended || ended
	if s.sentCh != nil {
		close(s.sentCh)
		s.sentCh = nil
	}
}

func (s *poolSub) add(ev poolEvent) {
	s.mu.Lock()
	s.published++
	switch {
	case ev.all:
		s.all = true
	case ev.account != "" && !s.all:
		s.accounts[ev.account] = true
	}
	s.keys = s.keys || ev.keys
	s.lost = s.lost || ev.lost
	if s.all || len(s.accounts) > maxPendingAccounts {
		s.all = true
		clear(s.accounts)
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// take returns what is pending as one message and empties it; nil when
// nothing is.
func (s *poolSub) take() (_ *weirv1.WatchPoolResponse, upTo uint64, lost bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	upTo = s.published
	if s.lost {
		return nil, upTo, true
	}
	if !s.all && !s.keys && len(s.accounts) == 0 {
		return nil, upTo, false
	}
	m := &weirv1.WatchPoolResponse{All: s.all, Keys: s.keys}
	for id := range s.accounts {
		m.AccountIds = append(m.AccountIds, id)
	}
	slices.Sort(m.AccountIds)
	s.all, s.keys = false, false
	clear(s.accounts)
	return m, upTo, false
}

// WatchPool streams the pool's invalidations to a worker: ready first, once
// this replica listens, then every change as it commits. The stream has
// no heartbeat; each message is flushed as it is sent. It ends when the
// worker leaves or the replica stops (Unavailable: watch another one).
func (l leaseService) WatchPool(ctx context.Context, _ *connect.Request[weirv1.WatchPoolRequest], stream *connect.ServerStream[weirv1.WatchPoolResponse]) error {
	w := l.watch
	// Subscribed before ready, so nothing committed after ready is missed.
	sub := w.subscribe()
	defer w.unsubscribe(sub)
	defer sub.markSent(0, true) // an ended stream is waited for no more
	if err := w.waitUp(ctx); err != nil {
		return watchErr(err)
	}
	if err := stream.Send(&weirv1.WatchPoolResponse{Ready: true}); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return watchErr(ctx.Err())
		case <-w.done:
			return watchErr(errWatchStopped)
		case <-sub.wake:
			m, upTo, lost := sub.take()
			if lost {
				return connect.NewError(connect.CodeUnavailable, errNotificationsLost)
			}
			if m != nil {
				if err := stream.Send(m); err != nil {
					return err
				}
			}
			sub.markSent(upTo, false)
		}
	}
}

// errNotificationsLost ends the streams of a replica whose listener lost
// its connection.
var errNotificationsLost = errors.New("pool notifications lost; watch again")

func watchErr(err error) error {
	if errors.Is(err, errWatchStopped) {
		return connect.NewError(connect.CodeUnavailable, err)
	}
	return toConnect(err)
}
