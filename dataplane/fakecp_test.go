package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/failpolicy"
	"github.com/weirhq/weir/internal/sim"
)

// A worker under test in a testing/synctest bubble: the real Server, its
// real Connect client talking to fakeCP (a scriptable LeaseService) and its
// real upstream client talking to the simulator, both over memListener.
// Virtual time moves only when every goroutine of the bubble waits, so a
// 20-minute hold takes microseconds and every time the test reads is
// exact.

// memListener is an in-memory network for one server: each dial is a
// net.Pipe pair. A goroutine blocked on a pipe is durably blocked in a
// bubble (one blocked on a real socket is not, and the bubble's clock
// would stall), and nothing escapes the bubble.
type memListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newMemListener() *memListener {
	return &memListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *memListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *memListener) Addr() net.Addr { return memAddr{} }

func (l *memListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case l.conns <- s:
		return c, nil
	case <-l.done:
	case <-ctx.Done():
	}
	c.Close()
	s.Close()
	return nil, &net.OpError{Op: "dial", Net: "mem", Err: errors.New("connection refused")}
}

type memAddr struct{}

func (memAddr) Network() string { return "mem" }
func (memAddr) String() string  { return "mem" }

// serveMem serves h on a memListener and returns a client for it. The
// server and the client's connections end with the test (in the bubble,
// before it checks that every goroutine ended).
func serveMem(t testing.TB, h http.Handler) *http.Client {
	l := newMemListener()
	srv := &http.Server{Handler: h, ErrorLog: nil}
	go srv.Serve(l) //nolint:errcheck // ends with Close
	tr := &http.Transport{DialContext: l.dial, DisableCompression: true}
	t.Cleanup(func() {
		srv.Close()
		tr.CloseIdleConnections()
	})
	return &http.Client{Transport: tr}
}

// fakeAccount is one account as the fake control plane sees it.
type fakeAccount struct {
	id string
	// coolUntil, coolReason: a cooldown (transient unless rejected).
	coolUntil  time.Time
	coolReason weirv1.CooldownReason
	rejected   bool
	// gateUntil: gated for the family.
	gateUntil time.Time
	// spentReset: out of quota until its reset (a zero time with spent
	// set: no known reset).
	spent      bool
	spentReset time.Time
	disabled   bool
	// recoverAt is what a failure on the account writes: the cooldown
	// until then (at least a second), as the control plane reads the
	// upstream's retry-after.
	recoverAt time.Time
	// retrySame: an overload or a burst (with no prior one) is retried on
	// the same account after retryAfter.
	retrySame bool
}

// blockedUntil mirrors policy's Candidate.blockedUntil: cooling now, and
// until when (the latest deadline; all must pass).
func (a *fakeAccount) blockedUntil(now time.Time) (time.Time, bool) {
	var until time.Time
	blocked := false
	for _, t := range []time.Time{a.coolUntil, a.gateUntil} {
		if t.After(now) {
			blocked = true
			until = maxTime(until, t)
		}
	}
	if a.spent && (a.spentReset.IsZero() || a.spentReset.After(now)) {
		blocked = true
		until = maxTime(until, a.spentReset)
	}
	return until, blocked
}

// fakeCP is a LeaseService over a scripted pool. It does not reimplement
// policy: it answers Acquire and Release in the shapes the control plane
// does (controlplane/leases.go, policy.Route, policy.Decide), from states a
// test sets and changes over (virtual) time.
type fakeCP struct {
	weirv1connect.UnimplementedLeaseServiceHandler

	mu       sync.Mutex
	accounts []*fakeAccount
	// breakerUntil: the family's breaker is open until its next probe.
	breakerUntil time.Time
	down         bool
	// reuse offers leases for reuse this long (0: never).
	reuse    time.Duration
	settings *weirv1.Settings
	leases   map[string]*weirv1.Lease
	nextID   int
	watchers map[*fakeWatcher]struct{}

	// afterLease, when set, runs (under the lock) after each lease is
	// granted: a test's way to change the pool between an Acquire and the
	// attempt's Release.
	afterLease func(f *fakeCP, l *weirv1.Lease)
	// hold, when set, keeps every Acquire waiting until it is closed.
	hold chan struct{}

	// What the workers sent.
	acquires    []*weirv1.AcquireRequest
	acquiredAt  []time.Time
	releases    []*weirv1.ReleaseRequest
	batches     [][]*weirv1.ReleaseItem
	routes      []*weirv1.RouteEvent
	unavailable int // calls refused while down
}

type fakeWatcher struct {
	ch   chan *weirv1.WatchPoolResponse
	done chan struct{}
}

func newFakeCP(accounts ...*fakeAccount) *fakeCP {
	return &fakeCP{accounts: accounts, leases: map[string]*weirv1.Lease{}, watchers: map[*fakeWatcher]struct{}{},
		settings: &weirv1.Settings{CapacityHold: durationpb.New(20 * time.Minute), UnreachableHold: durationpb.New(30 * time.Second),
			RequestDeadline: durationpb.New(25 * time.Minute)}}
}

func (f *fakeCP) account(id string) *fakeAccount {
	for _, a := range f.accounts {
		if a.id == id {
			return a
		}
	}
	return nil
}

// set changes the pool under the lock; announce names accounts in a
// WatchPool event, as the control plane's notify triggers do.
func (f *fakeCP) set(fn func(f *fakeCP)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeCP) announce(ev *weirv1.WatchPoolResponse) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.announceLocked(ev)
}

func (f *fakeCP) announceLocked(ev *weirv1.WatchPoolResponse) {
	for w := range f.watchers {
		select {
		case w.ch <- ev:
		case <-w.done:
		}
	}
}

// setDown takes the control plane away (every call Unavailable, the
// WatchPool streams cut) or brings it back.
func (f *fakeCP) setDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
	if down {
		for w := range f.watchers {
			close(w.done)
			delete(f.watchers, w)
		}
	}
}

var errFakeDown = connect.NewError(connect.CodeUnavailable, errors.New("control plane down"))

func (f *fakeCP) downLocked() bool {
	if f.down {
		f.unavailable++
	}
	return f.down
}

func (f *fakeCP) VerifyKey(_ context.Context, req *connect.Request[weirv1.VerifyKeyRequest]) (*connect.Response[weirv1.VerifyKeyResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.downLocked() {
		return nil, errFakeDown
	}
	if req.Msg.KeyHash != hashKey(testClientKey) {
		return nil, connect.NewError(connect.CodePermissionDenied, errors.New("client key is unknown or revoked"))
	}
	return connect.NewResponse(&weirv1.VerifyKeyResponse{KeyId: "key-1", KeyName: "test"}), nil
}

func (f *fakeCP) WorkerSettings(context.Context, *connect.Request[weirv1.WorkerSettingsRequest]) (*connect.Response[weirv1.WorkerSettingsResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.downLocked() {
		return nil, errFakeDown
	}
	return connect.NewResponse(&weirv1.WorkerSettingsResponse{Settings: proto.CloneOf(f.settings)}), nil
}

func (f *fakeCP) Acquire(ctx context.Context, req *connect.Request[weirv1.AcquireRequest]) (*connect.Response[weirv1.AcquireResponse], error) {
	f.mu.Lock()
	if hold := f.hold; hold != nil {
		f.acquiredAt = append(f.acquiredAt, time.Now()) // counted while it waits
		f.mu.Unlock()
		select {
		case <-hold:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		f.mu.Lock()
		f.acquiredAt = f.acquiredAt[:len(f.acquiredAt)-1]
	}
	defer f.mu.Unlock()
	if f.downLocked() {
		return nil, errFakeDown
	}
	f.acquires = append(f.acquires, proto.CloneOf(req.Msg))
	f.acquiredAt = append(f.acquiredAt, time.Now())
	resp := f.acquireLocked(req.Msg, time.Now())
	if none := resp.GetNoAccount(); none != nil && none.QuotaBlock != nil {
		none.QuotaResponseMode = f.settings.GetQuotaResponseMode()
	}
	return connect.NewResponse(resp), nil
}

// acquireLocked mirrors policy.Route's answer over the scripted pool: the
// first eligible account (the preferred one first), else why not and the
// soonest recovery of any account that could serve.
func (f *fakeCP) acquireLocked(m *weirv1.AcquireRequest, now time.Time) *weirv1.AcquireResponse {
	if f.breakerUntil.After(now) {
		return noAccountResp(&weirv1.NoAccount{Reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_BREAKER_OPEN,
			Message: "the overload breaker is open for sonnet; the next probe at " + f.breakerUntil.UTC().Format(time.RFC3339),
			RetryAt: timestamppb.New(f.breakerUntil)})
	}
	excluded := map[string]bool{}
	for _, id := range m.ExcludeAccountIds {
		excluded[id] = true
	}
	var (
		eligible                                   []*fakeAccount
		disabled, recoverable, tried, cooling, out int
		soonest                                    time.Time
		againNow                                   bool
		quota                                      []*fakeAccount
		transport                                  = true
	)
	for _, a := range f.accounts {
		if a.disabled {
			disabled++
			continue
		}
		back, blocked := a.blockedUntil(now)
		if blocked && a.rejected {
			out++
		} else {
			recoverable++
		}
		if a.spent && blocked {
			quota = append(quota, a)
		}
		if !(blocked && a.coolReason == weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT && a.coolUntil.After(now)) {
			transport = false
		}
		if blocked && !a.rejected && !back.IsZero() && (soonest.IsZero() || back.Before(soonest)) {
			soonest = back
		}
		switch {
		case excluded[a.id]:
			tried++
			againNow = againNow || !blocked
		case blocked:
			cooling++
		default:
			eligible = append(eligible, a)
		}
	}
	if len(eligible) > 0 {
		pick := eligible[0]
		for _, a := range eligible {
			if a.id == m.PreferAccountId {
				pick = a
			}
		}
		f.nextID++
		l := &weirv1.Lease{Id: fmt.Sprintf("lease-%d", f.nextID), AccountId: pick.id, AccountLabel: pick.id,
			Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY,
			BaseUrl: "http://upstream.test", Credential: credentialOf(pick.id),
			ExpiresAt: timestamppb.New(now.Add(time.Minute)), Ttl: durationpb.New(time.Minute)}
		if f.reuse > 0 && len(m.ExcludeAccountIds) == 0 && m.PreferAccountId == "" {
			l.ReuseUntil = timestamppb.New(now.Add(f.reuse))
		}
		f.leases[l.Id] = l
		if f.afterLease != nil {
			f.afterLease(f, l)
		}
		return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_Lease{Lease: proto.CloneOf(l)}}
	}
	none := &weirv1.NoAccount{Permanent: recoverable == 0}
	if len(quota) > 0 && len(quota) == recoverable {
		qb := &weirv1.QuotaBlock{Accounts: int32(len(quota)), WindowMinutes: 300, Provider: weirv1.Provider_PROVIDER_ANTHROPIC,
			Kind: weirv1.QuotaKind_QUOTA_KIND_ANTHROPIC_WINDOW, LastUpstreamError: "rate_limit_error: 5-hour limit reached"}
		var first time.Time
		for _, a := range quota {
			if a.spentReset.IsZero() {
				qb.AccountsWithoutReset++
			} else if first.IsZero() || a.spentReset.Before(first) {
				first = a.spentReset
			}
		}
		if !first.IsZero() {
			qb.ResetsAt = timestamppb.New(first)
		}
		none.QuotaBlock = qb
	}
	if transport && recoverable > 0 {
		none.Unreachable = &weirv1.Unreachable{Cause: weirv1.TransportCause_TRANSPORT_CAUSE_REFUSED, Error: "connection refused", Host: "upstream.test"}
	}
	if !soonest.IsZero() && !againNow {
		none.RetryAt = timestamppb.New(soonest)
	}
	switch {
	case len(f.accounts) == 0:
		none.Reason, none.Message = weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED, "no account in the pool serves this model"
	case tried > 0:
		none.Reason, none.Message = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_TRIED, fmt.Sprintf("all %d eligible accounts were tried for this request", tried)
	case cooling > 0:
		none.Reason, none.Message = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING, fmt.Sprintf("all %d accounts are cooling down", cooling)
	default:
		none.Reason, none.Message = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED, fmt.Sprintf("all %d accounts are paused or broken", disabled)
	}
	if none.RetryAt != nil {
		none.Message += "; the first recovers at " + none.RetryAt.AsTime().UTC().Format(time.RFC3339)
	}
	return noAccountResp(none)
}

func noAccountResp(n *weirv1.NoAccount) *weirv1.AcquireResponse {
	return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_NoAccount{NoAccount: n}}
}

func (f *fakeCP) Release(_ context.Context, req *connect.Request[weirv1.ReleaseRequest]) (*connect.Response[weirv1.ReleaseResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.downLocked() {
		return nil, errFakeDown
	}
	f.releases = append(f.releases, proto.CloneOf(req.Msg))
	l, ok := f.leases[req.Msg.LeaseId]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("lease not found"))
	}
	delete(f.leases, l.Id)
	return connect.NewResponse(&weirv1.ReleaseResponse{Decision: f.decideLocked(f.account(l.AccountId), req.Msg.Outcome, time.Now())}), nil
}

// decideLocked mirrors policy.Decide's actions: a failure before output
// cools the account (until its recoverAt) and fails over, or retries the
// same account once; an answer the client got is responded.
func (f *fakeCP) decideLocked(a *fakeAccount, o *weirv1.Outcome, now time.Time) *weirv1.Decision {
	cool := func(reason weirv1.CooldownReason) *weirv1.Decision {
		a.coolUntil, a.coolReason = maxTime(a.recoverAt, now.Add(time.Second)), reason
		f.announceLocked(&weirv1.WatchPoolResponse{AccountIds: []string{a.id}})
		return &weirv1.Decision{Action: weirv1.Action_ACTION_FAILOVER,
			Cooldown: &weirv1.Cooldown{Reason: reason, Until: timestamppb.New(a.coolUntil), WrittenAt: timestamppb.New(now), Transient: true}}
	}
	if o.GetBytesToClient() {
		return &weirv1.Decision{Action: weirv1.Action_ACTION_RESPOND}
	}
	switch o.GetClass() {
	case weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR:
		return &weirv1.Decision{Action: weirv1.Action_ACTION_RESPOND}
	case weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED:
		if a.retrySame && o.PriorOverloads == 0 {
			return &weirv1.Decision{Action: weirv1.Action_ACTION_RETRY_SAME, RetryAfter: durationpb.New(time.Second)}
		}
		return cool(weirv1.CooldownReason_COOLDOWN_REASON_OVERLOADED)
	case weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED:
		if a.retrySame && o.PriorBursts == 0 {
			return &weirv1.Decision{Action: weirv1.Action_ACTION_RETRY_SAME, RetryAfter: durationpb.New(time.Second), Rung: "burst"}
		}
		d := cool(weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED)
		d.Rung = "residual"
		return d
	case weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR:
		return cool(weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT)
	}
	return &weirv1.Decision{Action: failpolicy.For(o)}
}

func (f *fakeCP) ReleaseBatch(_ context.Context, req *connect.Request[weirv1.ReleaseBatchRequest]) (*connect.Response[weirv1.ReleaseBatchResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.downLocked() {
		return nil, errFakeDown
	}
	var items []*weirv1.ReleaseItem
	resp := &weirv1.ReleaseBatchResponse{}
	for _, it := range req.Msg.Items {
		items = append(items, proto.CloneOf(it))
		if _, ok := f.leases[it.LeaseId]; !ok {
			resp.MissingLeaseIds = append(resp.MissingLeaseIds, it.LeaseId)
			continue
		}
		if !it.Keep {
			delete(f.leases, it.LeaseId)
		}
	}
	f.batches = append(f.batches, items)
	return connect.NewResponse(resp), nil
}

func (f *fakeCP) RenewBatch(_ context.Context, req *connect.Request[weirv1.RenewBatchRequest]) (*connect.Response[weirv1.RenewBatchResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.downLocked() {
		return nil, errFakeDown
	}
	exp := time.Now().Add(time.Minute)
	out := &weirv1.RenewBatchResponse{ExpiresAt: timestamppb.New(exp)}
	for _, id := range req.Msg.LeaseIds {
		if l, ok := f.leases[id]; ok {
			l.ExpiresAt = timestamppb.New(exp)
			out.RenewedLeaseIds = append(out.RenewedLeaseIds, id)
		}
	}
	return connect.NewResponse(out), nil
}

func (f *fakeCP) ReportRoutes(_ context.Context, req *connect.Request[weirv1.ReportRoutesRequest]) (*connect.Response[weirv1.ReportRoutesResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.downLocked() {
		return nil, errFakeDown
	}
	for _, ev := range req.Msg.Events {
		if ev.Status != 0 { // not a pending event
			f.routes = append(f.routes, proto.CloneOf(ev))
		}
	}
	return connect.NewResponse(&weirv1.ReportRoutesResponse{}), nil
}

func (f *fakeCP) KeyStanding(context.Context, *connect.Request[weirv1.KeyStandingRequest]) (*connect.Response[weirv1.KeyStandingResponse], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.downLocked() {
		return nil, errFakeDown
	}
	return connect.NewResponse(&weirv1.KeyStandingResponse{AsOf: timestamppb.Now()}), nil
}

func (f *fakeCP) WatchPool(ctx context.Context, _ *connect.Request[weirv1.WatchPoolRequest], stream *connect.ServerStream[weirv1.WatchPoolResponse]) error {
	f.mu.Lock()
	if f.downLocked() {
		f.mu.Unlock()
		return errFakeDown
	}
	w := &fakeWatcher{ch: make(chan *weirv1.WatchPoolResponse), done: make(chan struct{})}
	f.watchers[w] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		if _, ok := f.watchers[w]; ok {
			delete(f.watchers, w)
			close(w.done)
		}
		f.mu.Unlock()
	}()
	if err := stream.Send(&weirv1.WatchPoolResponse{Ready: true}); err != nil {
		return err
	}
	for {
		select {
		case ev := <-w.ch:
			if err := stream.Send(ev); err != nil {
				return err
			}
		case <-w.done:
			return connect.NewError(connect.CodeUnavailable, errors.New("control plane down"))
		case <-ctx.Done():
			return nil
		}
	}
}

// leaseIDs are the live leases' ids, sorted.
func (f *fakeCP) leaseIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.leases {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func credentialOf(account string) string { return "sk-ant-api03-" + account + "-0123456789abcdef" }

// rig is a worker, its fake control plane and its simulated upstream, in
// one bubble.
type rig struct {
	t     testing.TB
	cp    *fakeCP
	sim   *sim.Server
	s     *Server
	h     http.Handler
	start time.Time
}

// newRig builds the rig; call it inside synctest.Test. tweak adjusts the
// worker's config.
func newRig(t testing.TB, cp *fakeCP, tweak func(*Config)) *rig {
	t.Helper()
	var accts []sim.AccountScript
	for _, a := range cp.accounts {
		accts = append(accts, sim.AccountScript{Name: a.id, Credential: credentialOf(a.id), Kind: sim.KindAPIKey})
	}
	up := sim.New(sim.Config{Script: sim.Script{Accounts: accts}, Deltas: 3})
	cfg := Config{
		ControlPlaneURL: "http://cp.test", Token: "dp-token-0123456789",
		ControlPlane: serveMem(t, weirv1connectHandler(cp)),
		Upstream:     serveMem(t, up),
		Logger:       slog.New(slog.DiscardHandler),
		Rand:         func() float64 { return 0.5 },
	}
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Registered after serveMem's: runs first, while the control plane
	// still answers the last reports.
	t.Cleanup(func() { s.Close(context.Background()) })
	r := &rig{t: t, cp: cp, sim: up, s: s, h: s.Handler(), start: time.Now()}
	return r
}

func weirv1connectHandler(cp *fakeCP) http.Handler {
	mux := http.NewServeMux()
	path, h := weirv1connect.NewLeaseServiceHandler(cp)
	mux.Handle(path, h)
	return mux
}

// answer is what a client got, and when (virtual time since the rig
// started).
type answer struct {
	status int
	header http.Header
	body   string
	at     time.Duration
}

const partsModel = "claude-sonnet-4-5"

// send makes one /v1/messages request and waits for its whole answer.
func (r *rig) send(ctx context.Context, stream bool) answer {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":16,"stream":%t,"messages":[{"role":"user","content":"hi"}]}`, partsModel, stream)
	req := httptestRequest(ctx, body)
	w := newRecorder()
	r.h.ServeHTTP(w, req)
	return answer{status: w.Code, header: w.Header(), body: w.Body.String(), at: time.Since(r.start)}
}

// attempts counts the upstream attempts the simulator saw.
func (r *rig) attempts() int { return len(r.sim.Attempts()) }

// at runs fn at d after the rig started (virtual time).
func (r *rig) at(d time.Duration, fn func()) {
	timer := time.AfterFunc(d-time.Since(r.start), fn)
	r.t.Cleanup(func() { timer.Stop() })
}

// verifyKey has the worker verify the test's key now (a later request
// finds it cached, as a client's does while the control plane is away).
func (r *rig) verifyKey() {
	r.t.Helper()
	if _, err := r.s.keys.verify(context.Background(), hashKey(testClientKey)); err != nil {
		r.t.Fatal(err)
	}
}
