package controlplane

import (
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Models of three families for the RPC tests.
const (
	sonnet      = "claude-sonnet-4-5-20250929"
	sonnetAlias = "claude-3-7-sonnet-latest"
	opus        = "claude-opus-4-1-20250805"
	haiku       = "claude-3-5-haiku-20241022"
)

func overloaded(prior int32) *weirv1.Outcome {
	return &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, Status: 529, ErrorType: "overloaded_error", PriorOverloads: prior}
}

// breaker reads a family's breaker row, or nil when there is none.
func (e *env) breaker(family string) *db.OverloadBreaker {
	e.t.Helper()
	b, err := e.q.GetBreaker(e.t.Context(), db.GetBreakerParams{Provider: "anthropic", Family: family})
	if err != nil {
		if storeErr(err) == ErrNotFound {
			return nil
		}
		e.t.Fatalf("read breaker %s: %v", family, err)
	}
	return &b
}

// wantBreakerOpen requires an Acquire for model to be refused by the
// breaker with retry_at at want.
func (e *env) wantBreakerOpen(model, keyHash string, want time.Time) *weirv1.NoAccount {
	e.t.Helper()
	none := e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: model}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_BREAKER_OPEN)
	if none.RetryAt == nil || !none.RetryAt.AsTime().Equal(want) {
		e.t.Fatalf("BREAKER_OPEN retry_at %v, want %v", none.RetryAt.AsTime(), want)
	}
	if none.Permanent {
		e.t.Fatal("an open breaker is not permanent")
	}
	return none
}

// openSonnet opens the sonnet breaker of a one-account pool, whose
// account is judged overloaded by two answers, and returns when it opened.
func openSonnet(t *testing.T) (e *env, keyHash string, a *weirv1.Account, openedAt time.Time) {
	t.Helper()
	e = setup(t)
	_, keyHash = e.createKey("")
	a, _ = e.createAccount(acct{maxConc: 32})
	var ls []*weirv1.Lease
	for range 2 {
		ls = append(ls, e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet}))
	}
	for _, l := range ls {
		e.release(l.Id, overloaded(0))
	}
	openedAt = e.clock.Now()
	if b := e.breaker("sonnet"); b == nil || b.OpenUntil == nil || !b.OpenUntil.Equal(openedAt.Add(policy.BreakerProbeEvery)) || b.OpenCount != 1 {
		t.Fatalf("after 2 overloads: breaker %+v, want open until now+%v", b, policy.BreakerProbeEvery)
	}
	return e, keyHash, a, openedAt
}

// TestBreakerOpensPerFamily: one account of two answering overloaded
// gates nobody; once the second is judged overloaded too, the sonnet
// breaker opens and every sonnet Acquire is refused until open_until,
// while other families still get leases.
func TestBreakerOpensPerFamily(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{label: "a", priority: 1, maxConc: 32})
	b2, _ := e.createAccount(acct{label: "b", maxConc: 32})
	on := func(acc *weirv1.Account) *weirv1.Lease {
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, PreferAccountId: acc.Id})
		if l.AccountId != acc.Id {
			t.Fatalf("lease on %s, want %s", l.AccountLabel, acc.Label)
		}
		return l
	}
	// a answers overloaded again and again: its requests retry once, then
	// fail over; b still serves everyone.
	for i := range 6 {
		d := e.release(on(a).Id, overloaded(int32(i%2)))
		want := weirv1.Action_ACTION_RETRY_SAME
		if i%2 == 1 {
			want = weirv1.Action_ACTION_FAILOVER
		}
		if d.Action != want || d.Cooldown != nil {
			t.Fatalf("a's overload %d: decision %v, want %v", i+1, d, want)
		}
	}
	if b := e.breaker("sonnet"); b == nil || b.Overloads != 6 || b.OpenUntil != nil {
		t.Fatalf("one account judged: %+v, want counted and closed", b)
	}
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, ExcludeAccountIds: []string{a.Id}})
	if l.AccountId != b2.Id {
		t.Fatalf("failover lease on %s, want b", l.AccountLabel)
	}
	e.release(l.Id, overloaded(0))
	extra := on(a)
	straggler := on(b2)

	now := e.clock.Advance(time.Second)
	d := e.release(on(b2).Id, overloaded(1))
	if d.Action != weirv1.Action_ACTION_FAILOVER || d.Cooldown != nil {
		t.Errorf("the opening overload: decision %v", d)
	}
	// Two accounts can serve: each is probed every BreakerProbeEvery, so
	// a probe goes every half of it.
	openUntil := now.Add(policy.ProbeEvery(2))
	none := e.wantBreakerOpen(sonnetAlias, keyHash, openUntil)
	if !strings.Contains(none.Message, "sonnet") {
		t.Errorf("message %q does not name the family", none.Message)
	}
	e.wantBreakerOpen(strings.ToUpper(sonnet), keyHash, openUntil)

	// Family scoped: opus, haiku and model-less requests are served.
	for _, m := range []string{opus, haiku, ""} {
		e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: m})
	}

	// Stragglers sent before it opened do not push the probe further out.
	e.release(straggler.Id, overloaded(0))
	if b := e.breaker("sonnet"); !b.OpenUntil.Equal(openUntil) || b.OpenCount != 1 {
		t.Errorf("after a straggler: %+v, want open until %v, open_count 1", b, openUntil)
	}
	e.clock.Advance(policy.ProbeEvery(2) - time.Millisecond)
	e.wantBreakerOpen(sonnet, keyHash, openUntil)
	// No account is cooling: overload is not an account's fault.
	for _, acc := range []*weirv1.Account{a, b2} {
		if got := e.getAccount(acc.Id); got.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE || got.Cooldown != nil || e.cooldownRow(acc.Id) != nil {
			t.Errorf("%s after overloads: state %v cooldown %v", acc.Label, got.State, got.Cooldown)
		}
	}
	if body := scrape(t, e); !strings.Contains(body, "weir_controlplane_breaker_opens_total 1") {
		t.Error("/metrics: want weir_controlplane_breaker_opens_total 1")
	}
	e.release(extra.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED})
}

// raceProbe sends n concurrent sonnet Acquires through the given replicas
// and returns the leases and refusals.
func raceProbe(t *testing.T, keyHash string, n int, replicas ...*env) ([]*weirv1.Lease, []*weirv1.NoAccount) {
	t.Helper()
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		mu     sync.Mutex
		leases []*weirv1.Lease
		nones  []*weirv1.NoAccount
		errs   []error
	)
	for i := range n {
		c := replicas[i%len(replicas)].dp.leases
		wg.Go(func() {
			<-start
			resp, err := c.Acquire(t.Context(), connect.NewRequest(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, RequestId: "probe-race"}))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs = append(errs, err)
			case resp.Msg.GetLease() != nil:
				leases = append(leases, resp.Msg.GetLease())
			default:
				nones = append(nones, resp.Msg.GetNoAccount())
			}
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d Acquires failed, first: %v", len(errs), errs[0])
	}
	return leases, nones
}

// probing opens the sonnet breaker, waits it out, and lets a crowd of
// Acquires through two replicas race for the probe: exactly one wins.
func probing(t *testing.T) (*env, string, *weirv1.Lease) {
	t.Helper()
	e, keyHash, _, openedAt := openSonnet(t)
	r := e.replica()
	now := e.clock.Advance(policy.BreakerProbeEvery)
	if !now.Equal(openedAt.Add(policy.BreakerProbeEvery)) {
		t.Fatal("clock")
	}
	const n = 12
	leases, nones := raceProbe(t, keyHash, n, e, r)
	if len(leases) != 1 || len(nones) != n-1 {
		t.Fatalf("%d leases and %d refusals, want exactly one probe and %d refusals", len(leases), len(nones), n-1)
	}
	for _, none := range nones {
		if none.Reason != weirv1.NoAccountReason_NO_ACCOUNT_REASON_BREAKER_OPEN || none.RetryAt == nil ||
			!none.RetryAt.AsTime().Equal(now.Add(policy.ProbeEvery(1))) {
			t.Fatalf("refusal %v retry_at %v, want BREAKER_OPEN retrying at now+%v while the probe runs", none.Reason, none.RetryAt.AsTime(), policy.ProbeEvery(1))
		}
	}
	if b := e.breaker("sonnet"); b.ProbeUntil == nil || !b.ProbeUntil.Equal(now.Add(policy.ProbeTTL)) {
		t.Fatalf("probe_until %v, want now+%v", b.ProbeUntil, policy.ProbeTTL)
	}
	if body := scrape(t, e) + scrape(t, r); !strings.Contains(body, "weir_controlplane_breaker_probes_total 1") {
		t.Error("/metrics: want one probe counted")
	}
	return e, keyHash, leases[0]
}

func TestBreakerProbeSuccessCloses(t *testing.T) {
	t.Parallel()
	e, keyHash, probe := probing(t)
	d := e.release(probe.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
	if d.Action != weirv1.Action_ACTION_RESPOND {
		t.Errorf("decision %v", d)
	}
	b := e.breaker("sonnet")
	if b.OpenUntil != nil || b.ProbeUntil != nil || b.OpenCount != 0 || b.Overloads != 0 {
		t.Fatalf("after the probe succeeded: %+v, want closed and reset", b)
	}
	// Closed for everyone, not just one more probe.
	for range 3 {
		e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet})
	}
	// Reset means the next opening needs fresh evidence: one overload
	// leaves it closed.
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetAlias})
	e.release(l.Id, overloaded(0))
	e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet})
	l = e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetAlias})
	e.release(l.Id, overloaded(0))
	e.wantBreakerOpen(sonnet, keyHash, e.clock.Now().Add(policy.BreakerProbeEvery))
}

// TestBreakerProbesSpreadAcrossAccounts: while the breaker is open a
// probe goes every ProbeEvery(3), however many failed, so that each of
// the three accounts is probed every BreakerProbeEvery; each goes to an
// account not probed yet in this round, even while the probes before it
// are still out.
func TestBreakerProbesSpreadAcrossAccounts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	var ids []string
	for _, label := range []string{"a", "b", "c"} {
		a, _ := e.createAccount(acct{label: label, maxConc: 32})
		ids = append(ids, a.Id)
	}
	for _, id := range ids[:2] {
		for range 2 {
			l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, PreferAccountId: id})
			e.release(l.Id, overloaded(0))
		}
	}
	pace := policy.ProbeEvery(3)
	e.wantBreakerOpen(sonnet, keyHash, e.clock.Now().Add(pace))
	var probed []string
	var out []*weirv1.Lease
	for i := range 6 {
		e.clock.Advance(pace - time.Millisecond)
		e.wantBreakerOpen(sonnet, keyHash, e.clock.Now().Add(time.Millisecond))
		e.clock.Advance(time.Millisecond)
		// The probe's own request prefers the account it tried last: the
		// breaker sends it elsewhere all the same.
		prefer := ""
		if len(probed) > 0 {
			prefer = probed[len(probed)-1]
		}
		probe := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, PreferAccountId: prefer})
		if !probe.Probe {
			t.Fatalf("probe %d: the lease is not marked a probe", i+1)
		}
		e.wantBreakerOpen(sonnet, keyHash, e.clock.Now().Add(pace))
		probed = append(probed, probe.AccountId)
		if i%2 == 0 {
			// Half the probes answer only after the next one went out.
			out = append(out, probe)
			continue
		}
		for _, l := range append(out, probe) {
			e.release(l.Id, overloaded(0))
		}
		out = nil
		if b := e.breaker("sonnet"); b.OpenUntil == nil || b.OpenCount != 1 {
			t.Fatalf("failed probe %d: %+v, want still open, never reopened", i+1, b)
		}
	}
	for _, round := range [][]string{probed[:3], probed[3:]} {
		seen := map[string]bool{}
		for _, id := range round {
			seen[id] = true
		}
		if len(seen) != 3 {
			t.Errorf("probes went to %v, want each round of three on three accounts", probed)
		}
	}
}

// TestBreakerProbeNeverReports: a probe that never reports back does not
// hold the others up: the next goes one pace later all the same, and the
// lost probe's late success still closes the breaker.
func TestBreakerProbeNeverReports(t *testing.T) {
	t.Parallel()
	e, keyHash, probe := probing(t)
	e.clock.Advance(policy.ProbeEvery(1) - time.Millisecond)
	e.wantBreakerOpen(sonnet, keyHash, e.clock.Now().Add(time.Millisecond))
	e.clock.Advance(time.Millisecond)
	next := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet})
	e.wantBreakerOpen(sonnet, keyHash, e.clock.Now().Add(policy.ProbeEvery(1)))
	e.release(probe.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
	e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet})
	e.release(next.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
}

// TestBreakerProbeOtherOutcomes: a probe that reports back with an answer
// that is not an overload never keeps the slot until policy.ProbeTTL. A real
// answer from the provider (a rate limit, a client error) shows it serves
// again and closes the breaker; an attempt that got no answer (a dropped
// connection, a gateway error, a cut stream, a client that left) only
// gives the slot back, and the next request probes at once.
func TestBreakerProbeOtherOutcomes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		o      *weirv1.Outcome
		closes bool
	}{
		{&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, Headers: map[string]string{"retry-after": "2"}}, true},
		{&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR, Status: 400, ErrorType: "invalid_request_error"}, true},
		{&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, TransportError: "connection reset"}, false},
		{&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR, Status: 502}, false},
		{&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR, Status: 200, BytesToClient: true}, false},
		{&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED}, false},
	} {
		t.Run(shortOutcome(tc.o), func(t *testing.T) {
			t.Parallel()
			e, keyHash, probe := probing(t)
			other, _ := e.createAccount(acct{})
			e.release(probe.Id, tc.o)
			b := e.breaker("sonnet")
			if b.ProbeUntil != nil {
				t.Fatalf("the probe reported %v and still holds the slot until %v", tc.o.Class, b.ProbeUntil)
			}
			if tc.closes != (b.OpenUntil == nil) {
				t.Fatalf("after a probe's %v: breaker %+v, want closed %v", tc.o.Class, b, tc.closes)
			}
			// The probe's request fails over at once: it gets a lease, not
			// a 30 s wait.
			l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, ExcludeAccountIds: []string{probe.AccountId}})
			if l.AccountId != other.Id {
				t.Errorf("failover lease on %s, want %s", l.AccountLabel, other.Label)
			}
			if tc.closes {
				e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, ExcludeAccountIds: []string{probe.AccountId}})
			} else {
				// That lease is the new probe: the rest still wait for it.
				e.wantBreakerOpen(sonnet, keyHash, e.clock.Now().Add(policy.ProbeEvery(1)))
			}
		})
	}
}

func shortOutcome(o *weirv1.Outcome) string {
	return strings.TrimPrefix(strings.ToLower(o.Class.String()), "outcome_class_")
}

// TestBreakerProbeSlotNotTakenWithoutLease: an Acquire that passes the
// breaker as its probe but then gets no lease (every account full of other
// families' requests, cooling or excluded) never reaches the upstream, so
// it must not hold the probe slot. It gives the slot back at once.
func TestBreakerProbeSlotNotTakenWithoutLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	e.createAccount(acct{maxConc: 2})
	var ls []*weirv1.Lease
	for range 2 {
		ls = append(ls, e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet}))
	}
	for _, l := range ls {
		e.release(l.Id, overloaded(0))
	}
	// Opus traffic fills the account while the sonnet breaker waits.
	var opusLeases []*weirv1.Lease
	for range 2 {
		opusLeases = append(opusLeases, e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: opus}))
	}
	e.clock.Advance(policy.BreakerProbeEvery)
	refused := e.clock.Now()
	e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, RequestId: "held"}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
	// A slot frees a second later: the sonnet request that comes back,
	// held since its refusal, must be able to probe.
	e.clock.Advance(time.Second)
	e.release(opusLeases[0].Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
	resp := e.acquire(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, RequestId: "held", WaitingSince: timestamppb.New(refused)})
	if resp.GetLease() == nil {
		t.Fatalf("no probe after a slot freed: %v (%q), retry at %v", resp.GetNoAccount().GetReason(), resp.GetNoAccount().GetMessage(),
			resp.GetNoAccount().GetRetryAt().AsTime())
	}
}

// TestReleaseOverloadLadderThroughRPC: an overloaded Release answers
// RETRY_SAME after 1 s for the account's first overload in the request and
// FAILOVER after that, and never cools the account.
func TestReleaseOverloadLadderThroughRPC(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{maxConc: 8})
	first := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet})
	second := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet})
	d := e.release(first.Id, overloaded(0))
	if d.Action != weirv1.Action_ACTION_RETRY_SAME || d.RetryAfter == nil || d.RetryAfter.AsDuration() != time.Second || d.Cooldown != nil {
		t.Errorf("prior 0: decision %v, want RETRY_SAME after 1s and no cooldown", d)
	}
	d = e.release(second.Id, overloaded(1))
	if d.Action != weirv1.Action_ACTION_FAILOVER || d.RetryAfter != nil || d.Cooldown != nil {
		t.Errorf("prior 1: decision %v, want FAILOVER without retry_after or cooldown", d)
	}
	if cd := e.cooldownRow(a.Id); cd != nil {
		t.Errorf("an overload wrote a cooldown: %+v", cd)
	}
	if got := e.getAccount(a.Id); got.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE {
		t.Errorf("state %v after overloads", got.State)
	}
	// The account still serves other families at once.
	e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: opus})
}

// TestReleaseGatewayError: a 502 from a gateway on the way fails over at
// once, cools nothing and does not count towards the breaker.
func TestReleaseGatewayError(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{maxConc: 8})
	for range 3 {
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet})
		d := e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR, Status: 502})
		if d.Action != weirv1.Action_ACTION_FAILOVER || d.Cooldown != nil || d.RetryAfter != nil {
			t.Fatalf("decision %v, want FAILOVER without cooldown", d)
		}
	}
	if cd := e.cooldownRow(a.Id); cd != nil {
		t.Errorf("a gateway error wrote a cooldown: %+v", cd)
	}
	if b := e.breaker("sonnet"); b != nil && (b.Overloads != 0 || b.OpenUntil != nil) {
		t.Errorf("gateway errors counted towards the breaker: %+v", b)
	}
	e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet})
}

// TestAcquirePreferAccount: prefer_account_id (the account an overload
// retry returns to) goes first when eligible, ahead of priority and the
// session's account, and is ignored when it cannot serve.
func TestAcquirePreferAccount(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	high, _ := e.createAccount(acct{label: "high", priority: 5, maxConc: 8})
	low, _ := e.createAccount(acct{label: "low", priority: -5, maxConc: 1})
	prefer := func(id string, edit ...func(*weirv1.AcquireRequest)) *weirv1.Lease {
		req := &weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, PreferAccountId: id}
		for _, f := range edit {
			f(req)
		}
		return e.mustLease(req)
	}
	if l := prefer(""); l.AccountId != high.Id {
		t.Fatalf("without a preference: %s, want high", l.AccountLabel)
	}
	// A session bound to high.
	bound := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, SessionKey: "sess"})
	e.release(bound.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})

	l := prefer(low.Id, func(r *weirv1.AcquireRequest) { r.SessionKey = "sess" })
	if l.AccountId != low.Id {
		t.Fatalf("preferring low: %s, want low over priority and session", l.AccountLabel)
	}
	// low is now at its cap of 1: the preference is ignored, not an error.
	if l2 := prefer(low.Id); l2.AccountId != high.Id {
		t.Errorf("preferring a full account: %s, want high", l2.AccountLabel)
	}
	e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})

	// Excluded wins over preferred.
	if l := prefer(low.Id, func(r *weirv1.AcquireRequest) { r.ExcludeAccountIds = []string{low.Id} }); l.AccountId != high.Id {
		t.Errorf("preferring an excluded account: %s, want high", l.AccountLabel)
	}
	// An unknown account is ignored.
	if l := prefer(uuid.NewString()); l.AccountId != high.Id {
		t.Errorf("preferring an unknown account: %s, want high", l.AccountLabel)
	}
	// Paused: ignored.
	e.pause(low.Id)
	if l := prefer(low.Id); l.AccountId != high.Id {
		t.Errorf("preferring a paused account: %s, want high", l.AccountLabel)
	}
	e.resume(low.Id)
	// Cooling: ignored.
	cl := prefer(low.Id)
	if cl.AccountId != low.Id {
		t.Fatalf("preferring low again: %s", cl.AccountLabel)
	}
	e.release(cl.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429})
	if l := prefer(low.Id); l.AccountId != high.Id {
		t.Errorf("preferring a cooling account: %s, want high", l.AccountLabel)
	}
	// Paused and only account left: no account, with the usual reason.
	e.pause(high.Id)
	e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, PreferAccountId: high.Id}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)

	for _, bad := range []string{"not-a-uuid", "123", high.Id + "x"} {
		_, err := e.dp.leases.Acquire(t.Context(), connect.NewRequest(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, PreferAccountId: bad}))
		ce := wantCode(t, err, connect.CodeInvalidArgument)
		if !strings.HasPrefix(ce.Message(), "prefer_account_id:") {
			t.Errorf("message %q, want it to name prefer_account_id", ce.Message())
		}
	}
}

// TestBreakerOpenOnOneProviderOfTheSurface: the Responses surface is
// served by Codex logins and OpenAI keys. With the Codex breaker open and
// no OpenAI account in the pool, an Acquire is told the breaker is open
// (wait for its probe), never that no account serves the model, which
// clients take as final.
func TestBreakerOpenOnOneProviderOfTheSurface(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a := e.createCodex("codex-a")
	req := codexRequest(keyHash)
	for range 2 {
		l := e.mustLease(req)
		if l.AccountId != a.Id {
			t.Fatalf("lease on %s", l.AccountLabel)
		}
		e.release(l.Id, overloaded(0))
	}
	none := e.mustNoAccount(req, weirv1.NoAccountReason_NO_ACCOUNT_REASON_BREAKER_OPEN)
	if none.Permanent || none.RetryAt == nil || !none.RetryAt.AsTime().Equal(e.clock.Now().Add(policy.BreakerProbeEvery)) {
		t.Fatalf("answer %v, want the breaker's, retrying at its next probe", none)
	}
	// A retry that excludes the account it tried is told the same.
	e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: "gpt-5-codex", Surface: weirv1.Surface_SURFACE_RESPONSES,
		ExcludeAccountIds: []string{a.Id}}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_BREAKER_OPEN)
}
