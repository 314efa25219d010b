package controlplane

import (
	"slices"
	"strings"

	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

func TestAcquireReturnsLease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	key, keyHash := e.createKey("")
	a, cred := e.createAccount(acct{label: "default-url", kind: weirv1.AuthKind_AUTH_KIND_OAUTH, credential: oauthToken()})

	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: "claude-opus-4-1", RequestId: "req-1"})
	if l.AccountId != a.Id || l.AccountLabel != "default-url" || l.Credential != cred ||
		l.Provider != weirv1.Provider_PROVIDER_ANTHROPIC || l.AuthKind != weirv1.AuthKind_AUTH_KIND_OAUTH {
		t.Errorf("lease: account %s kind %v provider %v credential ok %v", l.AccountLabel, l.AuthKind, l.Provider, l.Credential == cred)
	}
	if l.BaseUrl != "https://api.anthropic.com" {
		t.Errorf("base_url %q, want the Anthropic default", l.BaseUrl)
	}
	if l.Ttl.AsDuration() != 30*time.Second || !l.ExpiresAt.AsTime().Equal(epoch.Add(30*time.Second)) {
		t.Errorf("ttl %v expires %v", l.Ttl.AsDuration(), l.ExpiresAt.AsTime())
	}
	if _, err := uuid.Parse(l.Id); err != nil {
		t.Errorf("lease id %q: %v", l.Id, err)
	}
	// The row records who leased what.
	var keyID, reqID, model string
	if err := e.pool.QueryRow(t.Context(), `SELECT key_id::text, request_id, model FROM leases WHERE id = $1`, l.Id).Scan(&keyID, &reqID, &model); err != nil {
		t.Fatal(err)
	}
	if keyID != key.Id || reqID != "req-1" || model != "claude-opus-4-1" {
		t.Errorf("lease row: key %s request %s model %s", keyID, reqID, model)
	}

	b, _ := e.createAccount(acct{label: "own-url", baseURL: "http://127.0.0.1:8089/", priority: 1})
	l = e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	if l.AccountId != b.Id || l.BaseUrl != "http://127.0.0.1:8089" {
		t.Errorf("lease on %s with base %q", l.AccountLabel, l.BaseUrl)
	}

	for _, bad := range []string{"", HashKey("weir_sk_unknown"), key.Id} {
		_, err := e.dp.leases.Acquire(t.Context(), connect.NewRequest(&weirv1.AcquireRequest{KeyHash: bad}))
		wantCode(t, err, connect.CodePermissionDenied)
	}
	_, err := e.dp.leases.Acquire(t.Context(), connect.NewRequest(&weirv1.AcquireRequest{KeyHash: keyHash, ExcludeAccountIds: []string{"not-a-uuid"}}))
	ce := wantCode(t, err, connect.CodeInvalidArgument)
	if !strings.HasPrefix(ce.Message(), "exclude_account_ids:") {
		t.Errorf("message %q", ce.Message())
	}
}

// TestConcurrencyCapAcrossReplicas: 20 simultaneous Acquires through two
// control-plane replicas over one database grant exactly the cap.
func TestConcurrencyCapAcrossReplicas(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.replica()
	_, keyHash := e.createKey("")
	a, cred := e.createAccount(acct{maxConc: 3})

	const n = 20
	var (
		wg     sync.WaitGroup
		start  = make(chan struct{})
		mu     sync.Mutex
		leases []*weirv1.Lease
		nones  []*weirv1.NoAccount
		errs   []error
	)
	for i := range n {
		c := e.dp.leases
		if i%2 == 1 {
			c = r.dp.leases
		}
		wg.Go(func() {
			<-start
			resp, err := c.Acquire(t.Context(), connect.NewRequest(&weirv1.AcquireRequest{KeyHash: keyHash, RequestId: "burst"}))
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
	if len(leases) != 3 || len(nones) != n-3 {
		t.Fatalf("granted %d leases and %d refusals, want 3 and %d", len(leases), len(nones), n-3)
	}
	for _, l := range leases {
		if l.AccountId != a.Id || l.Credential != cred {
			t.Errorf("lease on the wrong account or with the wrong credential")
		}
	}
	for _, none := range nones {
		if none.Reason != weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY || none.RetryAt == nil {
			t.Errorf("refusal %v (%q), want AT_CAPACITY with retry_at", none.Reason, none.Message)
		}
	}
	if got := e.count(`SELECT count(*) FROM leases WHERE account_id = $1`, a.Id); got != 3 {
		t.Errorf("%d lease rows, want 3", got)
	}
	if got := r.getAccount(a.Id); got.InFlight != 3 {
		t.Errorf("in_flight %d", got.InFlight)
	}

	// Releasing one frees exactly one slot, on either replica.
	r.release(leases[0].Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
	e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	r.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)

	// Leases that expired stop counting at once, with no reaper running.
	e.advanceAlive(e.cfg.LeaseTTL - time.Second)
	r.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
	e.advanceAlive(time.Second) // now == expires_at: expired
	for range 3 {
		r.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	}
	e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
	// The expired rows are still there (for late Releases); only live ones count.
	if got := e.count(`SELECT count(*) FROM leases WHERE account_id = $1`, a.Id); got != 6 {
		t.Errorf("%d lease rows, want 3 expired + 3 live", got)
	}
}

// TestConcurrencyCapManyAccounts spreads a burst over several accounts:
// no account goes over its own cap and the pool's total is granted.
func TestConcurrencyCapManyAccounts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.replica()
	_, keyHash := e.createKey("")
	caps := map[string]int{}
	for _, c := range []int32{1, 2, 3} {
		a, _ := e.createAccount(acct{maxConc: c})
		caps[a.Id] = int(c)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string]int{}
	refused := 0
	start := make(chan struct{})
	for i := range 16 {
		c := []*env{e, r}[i%2]
		wg.Go(func() {
			<-start
			resp, err := c.dp.leases.Acquire(t.Context(), connect.NewRequest(&weirv1.AcquireRequest{KeyHash: keyHash, RequestId: "x"}))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("Acquire: %v", err)
				return
			}
			if l := resp.Msg.GetLease(); l != nil {
				got[l.AccountId]++
			} else {
				refused++
			}
		})
	}
	close(start)
	wg.Wait()
	total := 0
	for id, n := range got {
		if n > caps[id] {
			t.Errorf("account with cap %d got %d leases", caps[id], n)
		}
		total += n
	}
	if total != 6 || refused != 10 {
		t.Errorf("granted %d, refused %d; want 6 and 10", total, refused)
	}
}

func TestRenew(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	e.createAccount(acct{maxConc: 1})
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})

	now := e.advanceAlive(20 * time.Second)
	resp, err := e.dp.leases.RenewBatch(t.Context(), connect.NewRequest(&weirv1.RenewBatchRequest{LeaseIds: []string{l.Id}}))
	if err != nil {
		t.Fatal(err)
	}
	if want := now.Add(e.cfg.LeaseTTL); !slices.Equal(resp.Msg.RenewedLeaseIds, []string{l.Id}) || !resp.Msg.ExpiresAt.AsTime().Equal(want) {
		t.Errorf("renewed %v to %v, want the lease to %v", resp.Msg.RenewedLeaseIds, resp.Msg.ExpiresAt.AsTime(), want)
	}
	// Past the original expiry the renewed lease still holds the slot.
	e.advanceAlive(20 * time.Second)
	e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)

	// Once expired, its place is granted again, and it cannot be renewed
	// over it (TestRenewLapsedLease: with room, it can).
	e.advanceAlive(11 * time.Second)
	l2 := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	if got := e.renewBatch(l.Id); len(got) != 0 {
		t.Errorf("the lapsed lease was renewed over its place: %v", got)
	}

	// A released lease is gone, and so is one never granted.
	e.release(l2.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS})
	if got := e.renewBatch(l2.Id, uuid.NewString()); len(got) != 0 {
		t.Errorf("renewed %v, want nothing", got)
	}
	_, err = e.dp.leases.RenewBatch(t.Context(), connect.NewRequest(&weirv1.RenewBatchRequest{LeaseIds: []string{"nope"}}))
	wantCode(t, err, connect.CodeInvalidArgument)
}

func TestExcludeAccounts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{label: "a", priority: 2})
	b, _ := e.createAccount(acct{label: "b", priority: 1})
	c, _ := e.createAccount(acct{label: "c"})

	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, ExcludeAccountIds: []string{a.Id}}); l.AccountId != b.Id {
		t.Errorf("excluding a: got %s, want b", l.AccountLabel)
	}
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, ExcludeAccountIds: []string{a.Id, b.Id}}); l.AccountId != c.Id {
		t.Errorf("excluding a, b: got %s, want c", l.AccountLabel)
	}
	// Unknown ids in the list are harmless.
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, ExcludeAccountIds: []string{uuid.NewString()}}); l.AccountId != a.Id {
		t.Errorf("excluding nobody: got %s, want a", l.AccountLabel)
	}
	none := e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, ExcludeAccountIds: []string{c.Id, b.Id, a.Id}},
		weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_TRIED)
	if none.Message == "" {
		t.Error("ALL_TRIED without a message")
	}
}

func TestPriorityAndSpread(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	e.createAccount(acct{label: "low", priority: -1})
	e.createAccount(acct{label: "high", priority: 5, maxConc: 2})
	e.createAccount(acct{label: "mid1", maxConc: 2})
	e.createAccount(acct{label: "mid2", maxConc: 2})

	var order []string
	for range 7 {
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
		order = append(order, l.AccountLabel)
		e.clock.Advance(time.Second)
	}
	// high until full; then the two mids alternate (free share, then least
	// recently used); low only when everything better is full.
	want := []string{"high", "high", "mid1", "mid2", "mid1", "mid2", "low"}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("lease order %v, want %v", order, want)
		}
	}
}

func TestLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	for _, l := range []string{"a", "b", "c"} {
		e.createAccount(acct{label: l})
	}
	// Released at once, so free share ties; last_used_at decides.
	seen := map[string]int{}
	var order []string
	for range 6 {
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
		e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS})
		seen[l.AccountLabel]++
		order = append(order, l.AccountLabel)
		e.clock.Advance(time.Second)
	}
	for _, l := range []string{"a", "b", "c"} {
		if seen[l] != 2 {
			t.Fatalf("round robin by LRU: order %v", order)
		}
	}
	for i := 3; i < 6; i++ {
		if order[i] != order[i-3] {
			t.Fatalf("LRU order not stable: %v", order)
		}
	}
}

func TestSessionAffinity(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{label: "a", maxConc: 10})
	b, _ := e.createAccount(acct{label: "b", maxConc: 10})

	first := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, SessionKey: "sess"})
	bound := first.AccountId
	otherID := a.Id
	if bound == a.Id {
		otherID = b.Id
	}
	// Without a session, LRU would now pick the other account; with it,
	// the session stays put, even while its account holds more leases.
	for range 3 {
		e.clock.Advance(time.Second)
		if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}); l.AccountId != otherID {
			t.Fatalf("sessionless lease went to the session's account")
		}
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, SessionKey: "sess"})
		if l.AccountId != bound {
			t.Fatalf("session moved from %s while its account was eligible", first.AccountLabel)
		}
	}
	// Another session is free to land elsewhere.
	e.clock.Advance(time.Second)
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, SessionKey: "other"}); l.AccountId == "" {
		t.Fatal("no lease")
	}

	// Paused: the session moves, and stays on its new account afterwards.
	e.pause(bound)
	moved := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, SessionKey: "sess"})
	if moved.AccountId != otherID {
		t.Fatalf("session did not move off a paused account")
	}
	e.resume(bound)
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, SessionKey: "sess"}); l.AccountId != otherID {
		t.Fatalf("session bounced back after resume")
	}

	// Cooling: the session moves again.
	e.release(moved.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429,
		Headers: map[string]string{"retry-after": "30"}})
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, SessionKey: "sess"}); l.AccountId != bound {
		t.Fatalf("session did not move off a cooling account")
	}
	var boundTo string
	if err := e.pool.QueryRow(t.Context(), `SELECT account_id::text FROM session_bindings WHERE session_key = 'sess'`).Scan(&boundTo); err != nil {
		t.Fatal(err)
	}
	if boundTo != bound {
		t.Errorf("binding points at %s", boundTo)
	}
}

func TestSessionAffinityAtCapacity(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{label: "a", maxConc: 1, priority: 1})
	b, _ := e.createAccount(acct{label: "b", maxConc: 1})
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, SessionKey: "s"})
	if l.AccountId != a.Id {
		t.Fatal("priority account not picked")
	}
	// The session's account is full: the request goes elsewhere rather
	// than failing, and the session follows it.
	if l2 := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, SessionKey: "s"}); l2.AccountId != b.Id {
		t.Fatal("full session account: no failover")
	}
	e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, SessionKey: "s"}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
}

func TestSessionTTL(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	e.createAccount(acct{label: "a"})
	e.createAccount(acct{label: "b"})
	first := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, SessionKey: "idle"})
	e.release(first.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS})

	// Activity within the TTL keeps the binding alive past TTL from binding.
	e.clock.Advance(e.cfg.SessionTTL - time.Minute)
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, SessionKey: "idle"})
	if l.AccountId != first.AccountId {
		t.Fatal("binding lost before its TTL")
	}
	e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS})
	e.clock.Advance(e.cfg.SessionTTL - time.Minute)
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, SessionKey: "idle"}); l.AccountId != first.AccountId {
		t.Fatal("binding lost although the session stayed active")
	} else {
		e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS})
	}

	// Idle past the TTL: unbound, so plain LRU picks the other account.
	e.clock.Advance(e.cfg.SessionTTL + time.Second)
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, SessionKey: "idle"}); l.AccountId == first.AccountId {
		t.Fatal("binding outlived its idle TTL")
	}
}

func TestNoAccountReasons(t *testing.T) {
	t.Parallel()

	t.Run("none configured", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		_, keyHash := e.createKey("")
		none := e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED)
		if none.Message == "" || none.RetryAt != nil {
			t.Errorf("none configured: %v", none)
		}
	})

	t.Run("all disabled", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		_, keyHash := e.createKey("")
		a, _ := e.createAccount(acct{})
		b, _ := e.createAccount(acct{})
		e.pause(a.Id)
		if _, err := e.pool.Exec(t.Context(), `UPDATE accounts SET broken_at = $2, broken_reason = 'x' WHERE id = $1`, b.Id, e.clock.Now()); err != nil {
			t.Fatal(err)
		}
		none := e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED)
		if none.RetryAt != nil {
			t.Errorf("retry_at for disabled accounts: %v", none.RetryAt.AsTime())
		}
	})

	t.Run("all cooling", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		_, keyHash := e.createKey("")
		for range 3 {
			e.createAccount(acct{})
		}
		ls := []*weirv1.Lease{}
		for range 3 {
			ls = append(ls, e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}))
		}
		now := e.clock.Now()
		e.release(ls[0].Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, Headers: map[string]string{"retry-after": "300"}})
		e.release(ls[1].Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, Headers: map[string]string{"retry-after": "120"}})
		// Rejected credential: a minute, but not a recovery to wait for.
		e.release(ls[2].Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR, Status: 401})
		none := e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
		if none.RetryAt == nil || !none.RetryAt.AsTime().Equal(now.Add(120*time.Second)) {
			t.Errorf("retry_at %v, want the soonest transient cooldown %v", none.RetryAt.AsTime(), now.Add(120*time.Second))
		}

		// Cooldowns end with the clock: the auth one first.
		e.clock.Advance(time.Minute + time.Second)
		if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}); l.AccountId != ls[2].AccountId {
			t.Errorf("after a minute only the invalid-credential cooldown has ended")
		}
		e.clock.Advance(time.Minute)
		if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}); l.AccountId != ls[1].AccountId {
			t.Errorf("after two minutes the 120s cooldown has ended")
		}
	})

	t.Run("all cooling, only rejected credentials", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		_, keyHash := e.createKey("")
		e.createAccount(acct{})
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
		e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR, Status: 401})
		none := e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
		if none.RetryAt != nil {
			t.Errorf("retry_at %v for a rejected credential", none.RetryAt.AsTime())
		}
	})

	t.Run("at capacity", func(t *testing.T) {
		t.Parallel()
		e := setup(t)
		_, keyHash := e.createKey("")
		e.createAccount(acct{maxConc: 1})
		e.createAccount(acct{maxConc: 1})
		e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
		e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
		none := e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
		if none.RetryAt == nil || !none.RetryAt.AsTime().After(e.clock.Now()) {
			t.Errorf("retry_at %v", none.RetryAt)
		}
	})
}

// TestLateRelease: a lease that expired (but was not reaped) can still be
// released with its outcome, so the evidence is not lost.
func TestLateRelease(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{})
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	e.clock.Advance(5 * time.Minute)
	d := e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429})
	if d.Cooldown == nil {
		t.Fatal("late release wrote no cooldown")
	}
	if got := e.getAccount(a.Id); got.State != weirv1.AccountState_ACCOUNT_STATE_COOLING {
		t.Errorf("state %v", got.State)
	}
}

// TestRedeliveredReleaseIsDatedBack: a Release a worker sends again after
// an outage carries how long ago its attempt ended; the evidence counts
// from then. A 60 s retry-after seen 50 s ago cools for the 10 s left;
// one seen 90 s ago cools nothing; an old overload moves no breaker. A
// repeat of a delivered Release finds no lease and changes nothing.
func TestRedeliveredReleaseIsDatedBack(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{maxConc: 5})
	limited := func(delay time.Duration) *weirv1.Outcome {
		return &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429,
			Headers: map[string]string{"retry-after": "60"}, Delay: durationpb.New(delay)}
	}

	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	d := e.release(l.Id, limited(50*time.Second))
	if d.Cooldown == nil || !d.Cooldown.Until.AsTime().Equal(e.clock.Now().Add(10*time.Second)) {
		t.Fatalf("cooldown %v, want until now+10s", d.Cooldown)
	}
	// The same Release again (its answer was lost): no lease, no change.
	_, err := e.dp.leases.Release(t.Context(), connect.NewRequest(&weirv1.ReleaseRequest{LeaseId: l.Id, Outcome: limited(0)}))
	wantCode(t, err, connect.CodeNotFound)
	if cd := e.getAccount(a.Id).Cooldown; cd == nil || !cd.Until.AsTime().Equal(e.clock.Now().Add(10*time.Second)) {
		t.Errorf("after the repeat: cooldown %v, want the first one's", cd)
	}

	e.clock.Advance(11 * time.Second)
	l = e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	if d := e.release(l.Id, limited(90*time.Second)); d.Cooldown != nil {
		t.Errorf("a retry-after over before the report arrived wrote %v", d.Cooldown)
	}
	if got := e.getAccount(a.Id).State; got == weirv1.AccountState_ACCOUNT_STATE_COOLING {
		t.Errorf("state %v after a stale 429", got)
	}

	l = e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: "claude-sonnet-4-5"})
	e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, Status: 529,
		ErrorType: "overloaded_error", Delay: durationpb.New(30 * time.Second)})
	if n := e.count(`SELECT count(*) FROM overload_breakers WHERE overloads > 0`); n != 0 {
		t.Errorf("an overload from 30 s ago moved %d breakers", n)
	}
	l = e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: "claude-sonnet-4-5"})
	e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, Status: 529, ErrorType: "overloaded_error"})
	if n := e.count(`SELECT count(*) FROM overload_breakers WHERE overloads > 0`); n != 1 {
		t.Errorf("a fresh overload moved %d breakers, want 1", n)
	}
}

// TestRenewBatch: one call renews every live lease it names and lists
// them; released, expired and unknown leases are left out, not errors.
func TestRenewBatch(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	acc, _ := e.createAccount(acct{maxConc: 3})
	a := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	b := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	gone := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	e.release(gone.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS})

	now := e.clock.Advance(20 * time.Second)
	resp, err := e.dp.leases.RenewBatch(t.Context(), connect.NewRequest(&weirv1.RenewBatchRequest{
		LeaseIds: []string{a.Id, b.Id, gone.Id, uuid.NewString()}}))
	if err != nil {
		t.Fatal(err)
	}
	got := resp.Msg.RenewedLeaseIds
	slices.Sort(got)
	want := []string{a.Id, b.Id}
	slices.Sort(want)
	if !slices.Equal(got, want) || !resp.Msg.ExpiresAt.AsTime().Equal(now.Add(e.cfg.LeaseTTL)) {
		t.Errorf("renewed %v until %v, want %v until %v", got, resp.Msg.ExpiresAt.AsTime(), want, now.Add(e.cfg.LeaseTTL))
	}
	// Past the original expiry both renewed leases still hold their slots.
	e.clock.Advance(20 * time.Second)
	if n := e.getAccount(acc.Id).InFlight; n != 2 {
		t.Errorf("in flight %d, want the 2 renewed leases", n)
	}
	_, err = e.dp.leases.RenewBatch(t.Context(), connect.NewRequest(&weirv1.RenewBatchRequest{LeaseIds: []string{a.Id, "nope"}}))
	wantCode(t, err, connect.CodeInvalidArgument)
}

// TestHeldRequestsServedInTurn: a place that frees goes to the request
// held longest for it, whichever replica a later arrival asks; while
// requests wait for an account its leases are not kept for reuse; a
// waiter that stopped asking drops out of the queue.
func TestHeldRequestsServedInTurn(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.replica()
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{maxConc: 1})
	busy := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, RequestId: "busy"})

	// Two requests, held since different times, wait; the later one asks
	// first, on another replica.
	first, second := e.clock.Now().Add(-2*time.Second), e.clock.Now().Add(-time.Second)
	held := func(id string, since time.Time) *weirv1.AcquireRequest {
		return &weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, RequestId: id, WaitingSince: timestamppb.New(since)}
	}
	r.mustNoAccount(held("second", second), weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
	e.mustNoAccount(held("first", first), weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
	e.release(busy.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})

	// The place is free, but promised: a newcomer and the second waiter are
	// refused, and told why.
	none := r.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, RequestId: "newcomer"}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
	if !strings.Contains(none.Message, "2 requests held longer wait for their places first") {
		t.Errorf("newcomer refused with %q", none.Message)
	}
	r.mustNoAccount(held("second", second), weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
	l := e.mustLease(held("first", first))
	if l.AccountId != a.Id || l.ReuseUntil != nil {
		t.Errorf("first's lease %v: want the account, not kept for reuse while another request waits", l)
	}
	if n := e.count(`SELECT count(*) FROM lease_waiters WHERE request_id = 'first'`); n != 0 {
		t.Errorf("first still waits on %d accounts after its lease", n)
	}
	e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
	r.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, RequestId: "newcomer"}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
	e.release(r.mustLease(held("second", second)).Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})

	// A waiter that stops asking holds no place past the waiter TTL.
	busy = e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, RequestId: "busy2"})
	e.mustNoAccount(held("gone", e.clock.Now()), weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
	e.release(busy.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
	e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, RequestId: "newcomer"}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY)
	e.clock.Advance(waiterTTL)
	e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: sonnet, RequestId: "newcomer"})
}
