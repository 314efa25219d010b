package controlplane

import (
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

func TestModelFamily(t *testing.T) {
	t.Parallel()
	for model, want := range map[string]string{
		"claude-opus-4-1-20250805":   "opus",
		"claude-opus-4-20250514":     "opus",
		"claude-3-opus-20240229":     "opus",
		"claude-opus-4-1":            "opus",
		"opus":                       "opus",
		"Claude-Opus-4-1":            "opus",
		"CLAUDE-3-OPUS-LATEST":       "opus",
		"claude-sonnet-4-5-20250929": "sonnet",
		"claude-sonnet-4-5":          "sonnet",
		"claude-3-7-sonnet-20250219": "sonnet",
		"claude-3-7-sonnet-latest":   "sonnet",
		"sonnet":                     "sonnet",
		"Claude-Sonnet-4-5[1m]":      "sonnet",
		"claude-3-5-haiku-20241022":  "haiku",
		"claude-haiku-4-5-20251001":  "haiku",
		"claude-3-5-haiku-latest":    "haiku",
		"HAIKU":                      "haiku",
		// Unknown models are their own family, lower-cased so that case
		// variants share one breaker.
		"gpt-5-codex":      "gpt-5-codex",
		"Mystery-Model-X":  "mystery-model-x",
		"claude-2.1":       "claude-2.1",
		"":                 "",
		"CLAUDE-INSTANT-1": "claude-instant-1",
	} {
		if got := modelFamily(model); got != want {
			t.Errorf("modelFamily(%q) = %q, want %q", model, got, want)
		}
	}
}

// brkAt is the breaker's clock in these pure tests.
var brkAt = epoch

func tp(t time.Time) *time.Time { return &t }

func TestAfterOverloadOpensAtThreshold(t *testing.T) {
	t.Parallel()
	var b db.OverloadBreaker
	for i := range breakerThreshold - 1 {
		now := brkAt.Add(time.Duration(i) * time.Second)
		b = afterOverload(b, now)
		if b.Overloads != int32(i+1) || !b.WindowStart.Equal(brkAt) || b.OpenUntil != nil || b.OpenCount != 0 {
			t.Fatalf("overload %d: %+v, want counted in the window that began at the first, still closed", i+1, b)
		}
	}
	// The last one lands exactly breakerWindow after the first: still inside.
	now := brkAt.Add(breakerWindow)
	b = afterOverload(b, now)
	if b.Overloads != breakerThreshold || b.OpenUntil == nil || !b.OpenUntil.Equal(now.Add(breakerBaseOpen)) ||
		b.OpenCount != 1 || b.ProbeUntil != nil {
		t.Fatalf("threshold reached: %+v, want open until now+%v with open_count 1", b, breakerBaseOpen)
	}
}

func TestAfterOverloadWindowResets(t *testing.T) {
	t.Parallel()
	b := db.OverloadBreaker{Overloads: breakerThreshold - 1, WindowStart: brkAt}
	now := brkAt.Add(breakerWindow + time.Millisecond)
	b = afterOverload(b, now)
	if b.Overloads != 1 || !b.WindowStart.Equal(now) || b.OpenUntil != nil || b.OpenCount != 0 {
		t.Fatalf("after the window: %+v, want a fresh window holding this one overload, closed", b)
	}
	// A zero window start (a new row) starts a window too.
	b = afterOverload(db.OverloadBreaker{Overloads: 7}, now)
	if b.Overloads != 1 || !b.WindowStart.Equal(now) || b.OpenUntil != nil {
		t.Fatalf("new breaker: %+v", b)
	}
}

func TestAfterOverloadWhileOpen(t *testing.T) {
	t.Parallel()
	until := brkAt.Add(breakerBaseOpen)
	probe := brkAt.Add(probeTTL)
	open := db.OverloadBreaker{Overloads: breakerThreshold, WindowStart: brkAt, OpenUntil: tp(until), OpenCount: 1, ProbeUntil: tp(probe)}
	// Stragglers from before the opening: counted, but nothing doubles.
	b := open
	for _, d := range []time.Duration{0, time.Millisecond, breakerBaseOpen - time.Nanosecond} {
		b = afterOverload(b, brkAt.Add(d))
		if !b.OpenUntil.Equal(until) || b.OpenCount != 1 || b.ProbeUntil == nil || !b.ProbeUntil.Equal(probe) {
			t.Fatalf("overload at +%v while open: %+v, want open_until and open_count unchanged", d, b)
		}
	}
	if b.Overloads != breakerThreshold+3 {
		t.Errorf("overloads %d, want %d", b.Overloads, breakerThreshold+3)
	}
	// At open_until the wait is over: an overload now is the probe failing.
	now := until
	b = afterOverload(b, now)
	if !b.OpenUntil.Equal(now.Add(2*breakerBaseOpen)) || b.OpenCount != 2 || b.ProbeUntil != nil {
		t.Fatalf("probe failed: %+v, want reopened until now+%v, open_count 2, probe slot free", b, 2*breakerBaseOpen)
	}
	// A failed probe reopens even when the window has long rolled over.
	later := db.OverloadBreaker{Overloads: 1, WindowStart: brkAt, OpenUntil: tp(brkAt.Add(time.Second)), OpenCount: 1}
	now = brkAt.Add(time.Hour)
	b = afterOverload(later, now)
	if b.Overloads != 1 || !b.OpenUntil.Equal(now.Add(2*breakerBaseOpen)) || b.OpenCount != 2 {
		t.Fatalf("probe failed an hour later: %+v", b)
	}
}

func TestAfterOverloadLadder(t *testing.T) {
	t.Parallel()
	// Each failed probe doubles the wait from 2 s, capped at 30 s.
	want := []time.Duration{2, 4, 8, 16, 30, 30, 30, 30, 30, 30, 30, 30}
	b := db.OverloadBreaker{}
	now := brkAt
	for range breakerThreshold - 1 {
		b = afterOverload(b, now)
	}
	for i, w := range want {
		b = afterOverload(b, now)
		if b.OpenUntil == nil || !b.OpenUntil.Equal(now.Add(w*time.Second)) || b.OpenCount != int32(i+1) {
			t.Fatalf("opening %d: %+v, want open until now+%vs with open_count %d", i+1, b, w, i+1)
		}
		now = *b.OpenUntil
	}
	// However often it opened, the wait stays capped (no shift overflow).
	for _, n := range []int32{9, 31, 32, 64, 1 << 30} {
		b := afterOverload(db.OverloadBreaker{WindowStart: brkAt, OpenUntil: tp(brkAt), OpenCount: n}, brkAt)
		if !b.OpenUntil.Equal(brkAt.Add(breakerMaxOpen)) || b.OpenCount != n+1 {
			t.Errorf("open_count %d: open until now+%v, want the %v cap", n, b.OpenUntil.Sub(brkAt), breakerMaxOpen)
		}
	}
}

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

// openSonnet opens the sonnet breaker with threshold overloads and returns
// when it opened and until when.
func openSonnet(t *testing.T) (e *env, keyHash string, a *weirv1.Account, openedAt time.Time) {
	t.Helper()
	e = setup(t)
	_, keyHash = e.createKey("")
	a, _ = e.createAccount(acct{maxConc: 32})
	var ls []*weirv1.Lease
	for range breakerThreshold {
		ls = append(ls, e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet}))
	}
	for _, l := range ls {
		e.release(l.Id, overloaded(0))
	}
	openedAt = e.clock.Now()
	if b := e.breaker("sonnet"); b == nil || b.OpenUntil == nil || !b.OpenUntil.Equal(openedAt.Add(breakerBaseOpen)) || b.OpenCount != 1 {
		t.Fatalf("after %d overloads: breaker %+v, want open until now+%v", breakerThreshold, b, breakerBaseOpen)
	}
	return e, keyHash, a, openedAt
}

// TestBreakerOpensPerFamily: three overloaded Releases for a sonnet model
// open the sonnet breaker; every sonnet Acquire is then refused until
// open_until, while other families still get leases.
func TestBreakerOpensPerFamily(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{maxConc: 32})
	var ls []*weirv1.Lease
	for range breakerThreshold + 2 {
		ls = append(ls, e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet}))
	}
	// Below the threshold: counted, still closed.
	for i, l := range ls[:breakerThreshold-1] {
		d := e.release(l.Id, overloaded(0))
		if d.Action != weirv1.Action_ACTION_RETRY_SAME || d.RetryAfter.AsDuration() != time.Second || d.Cooldown != nil {
			t.Fatalf("overload %d: decision %v", i+1, d)
		}
	}
	if b := e.breaker("sonnet"); b == nil || b.Overloads != breakerThreshold-1 || b.OpenUntil != nil {
		t.Fatalf("below the threshold: %+v", b)
	}
	extra := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet})

	now := e.clock.Advance(time.Second)
	d := e.release(ls[breakerThreshold-1].Id, overloaded(0))
	if d.Action != weirv1.Action_ACTION_RETRY_SAME || d.Cooldown != nil {
		t.Errorf("the opening overload: decision %v", d)
	}
	openUntil := now.Add(breakerBaseOpen)
	none := e.wantBreakerOpen(sonnetAlias, keyHash, openUntil)
	if !strings.Contains(none.Message, "sonnet") {
		t.Errorf("message %q does not name the family", none.Message)
	}
	e.wantBreakerOpen(strings.ToUpper(sonnet), keyHash, openUntil)

	// Family scoped: opus, haiku and model-less requests are served.
	for _, m := range []string{opus, haiku, ""} {
		if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: m}); l.AccountId != a.Id {
			t.Errorf("model %q: lease on %s", m, l.AccountLabel)
		}
	}

	// Stragglers sent before it opened do not push the probe further out.
	for _, l := range ls[breakerThreshold:] {
		e.release(l.Id, overloaded(0))
	}
	if b := e.breaker("sonnet"); !b.OpenUntil.Equal(openUntil) || b.OpenCount != 1 || b.Overloads != breakerThreshold+2 {
		t.Errorf("after stragglers: %+v, want open until %v, open_count 1", b, openUntil)
	}
	e.clock.Advance(breakerBaseOpen - time.Millisecond)
	e.wantBreakerOpen(sonnet, keyHash, openUntil)
	// The account is not cooling: overload is the provider's, not its.
	if got := e.getAccount(a.Id); got.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE || got.Cooldown != nil || e.cooldownRow(a.Id) != nil {
		t.Errorf("account after overloads: state %v cooldown %v", got.State, got.Cooldown)
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
	now := e.clock.Advance(breakerBaseOpen)
	if !now.Equal(openedAt.Add(breakerBaseOpen)) {
		t.Fatal("clock")
	}
	const n = 12
	leases, nones := raceProbe(t, keyHash, n, e, r)
	if len(leases) != 1 || len(nones) != n-1 {
		t.Fatalf("%d leases and %d refusals, want exactly one probe and %d refusals", len(leases), len(nones), n-1)
	}
	for _, none := range nones {
		if none.Reason != weirv1.NoAccountReason_NO_ACCOUNT_REASON_BREAKER_OPEN || none.RetryAt == nil ||
			!none.RetryAt.AsTime().Equal(now.Add(breakerPoll)) {
			t.Fatalf("refusal %v retry_at %v, want BREAKER_OPEN retrying at now+%v while the probe runs", none.Reason, none.RetryAt.AsTime(), breakerPoll)
		}
	}
	if b := e.breaker("sonnet"); b.ProbeUntil == nil || !b.ProbeUntil.Equal(now.Add(probeTTL)) {
		t.Fatalf("probe_until %v, want now+%v", b.ProbeUntil, probeTTL)
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
	// Reset means the next opening starts from the base wait again.
	ls := []*weirv1.Lease{}
	for range breakerThreshold {
		ls = append(ls, e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnetAlias}))
	}
	for _, l := range ls {
		e.release(l.Id, overloaded(0))
	}
	e.wantBreakerOpen(sonnet, keyHash, e.clock.Now().Add(breakerBaseOpen))
}

func TestBreakerProbeOverloadReopensDoubled(t *testing.T) {
	t.Parallel()
	e, keyHash, probe := probing(t)
	for i, wait := range []time.Duration{4 * time.Second, 8 * time.Second, 16 * time.Second, breakerMaxOpen, breakerMaxOpen} {
		now := e.clock.Now()
		d := e.release(probe.Id, overloaded(0))
		if d.Action != weirv1.Action_ACTION_RETRY_SAME || d.Cooldown != nil {
			t.Errorf("failed probe %d: decision %v", i+1, d)
		}
		b := e.breaker("sonnet")
		if b.OpenUntil == nil || !b.OpenUntil.Equal(now.Add(wait)) || b.OpenCount != int32(i+2) || b.ProbeUntil != nil {
			t.Fatalf("failed probe %d: %+v, want reopened until now+%v, open_count %d, probe slot free", i+1, b, wait, i+2)
		}
		e.wantBreakerOpen(sonnet, keyHash, now.Add(wait))
		e.clock.Advance(wait - time.Millisecond)
		e.wantBreakerOpen(sonnet, keyHash, now.Add(wait))
		e.clock.Advance(time.Millisecond)
		probe = e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet})
		e.wantBreakerOpen(sonnet, keyHash, e.clock.Now().Add(breakerPoll))
	}
}

func TestBreakerProbeTTL(t *testing.T) {
	t.Parallel()
	e, keyHash, probe := probing(t)
	// The probe never reports. Its slot is held for probeTTL...
	e.clock.Advance(probeTTL - time.Millisecond)
	e.wantBreakerOpen(sonnet, keyHash, e.clock.Now().Add(breakerPoll))
	// ...then the next request probes.
	e.clock.Advance(time.Millisecond)
	next := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet})
	e.wantBreakerOpen(sonnet, keyHash, e.clock.Now().Add(breakerPoll))
	// The lost probe's late success still closes the breaker.
	e.release(probe.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
	e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet})
	e.release(next.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
}

// TestBreakerProbeOtherOutcomes: a probe that reports back with an answer
// that is not an overload never keeps the slot until probeTTL. A real
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
				e.wantBreakerOpen(sonnet, keyHash, e.clock.Now().Add(breakerPoll))
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
	e.createAccount(acct{maxConc: breakerThreshold})
	var ls []*weirv1.Lease
	for range breakerThreshold {
		ls = append(ls, e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet}))
	}
	for _, l := range ls {
		e.release(l.Id, overloaded(0))
	}
	// Opus traffic fills the account while the sonnet breaker waits.
	var opusLeases []*weirv1.Lease
	for range breakerThreshold {
		opusLeases = append(opusLeases, e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: opus}))
	}
	e.clock.Advance(breakerBaseOpen)
	e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
	// A slot frees a second later: the sonnet request that comes back
	// must be able to probe.
	e.clock.Advance(time.Second)
	e.release(opusLeases[0].Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
	resp := e.acquire(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet})
	if resp.GetLease() == nil {
		t.Fatalf("no probe after a slot freed: %v (%q), retry at %v", resp.GetNoAccount().GetReason(), resp.GetNoAccount().GetMessage(),
			resp.GetNoAccount().GetRetryAt().AsTime())
	}
}

// TestReleaseOverloadLadderThroughRPC: an overloaded Release answers
// RETRY_SAME after 1, 2, 4, 8 s for prior overloads 0..3 and FAILOVER at
// 4, and never cools the account.
func TestReleaseOverloadLadderThroughRPC(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{maxConc: 8})
	var ls []*weirv1.Lease
	for range 5 {
		ls = append(ls, e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet}))
	}
	for prior, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second} {
		d := e.release(ls[prior].Id, overloaded(int32(prior)))
		if d.Action != weirv1.Action_ACTION_RETRY_SAME || d.RetryAfter == nil || d.RetryAfter.AsDuration() != wait || d.Cooldown != nil {
			t.Errorf("prior %d: decision %v, want RETRY_SAME after %v and no cooldown", prior, d, wait)
		}
	}
	d := e.release(ls[4].Id, overloaded(4))
	if d.Action != weirv1.Action_ACTION_FAILOVER || d.RetryAfter != nil || d.Cooldown != nil {
		t.Errorf("prior 4: decision %v, want FAILOVER without retry_after or cooldown", d)
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
	for range breakerThreshold + 1 {
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
