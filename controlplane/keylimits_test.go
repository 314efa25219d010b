package controlplane

import (
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/randid"
)

// createLimitedKey creates a key with restrictions and returns it with
// its secret's hash.
func (e *env) createLimitedKey(req *weirv1.CreateKeyRequest) (*weirv1.Key, string) {
	e.t.Helper()
	if req.Name == "" {
		req.Name = "key-" + randid.Hex(4)
	}
	resp, err := e.admin.keys.CreateKey(e.t.Context(), connect.NewRequest(req))
	if err != nil {
		e.t.Fatalf("CreateKey %s: %v", req.Name, err)
	}
	e.secrets.add(resp.Msg.Secret)
	return resp.Msg.Key, HashKey(resp.Msg.Secret)
}

func (e *env) updateKey(req *weirv1.UpdateKeyRequest, paths ...string) (*weirv1.Key, error) {
	e.t.Helper()
	req.UpdateMask = &fieldmaskpb.FieldMask{Paths: paths}
	resp, err := e.admin.keys.UpdateKey(e.t.Context(), connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg.Key, nil
}

func pinLabels(k *weirv1.Key) string {
	var out []string
	for _, a := range k.PinnedAccounts {
		out = append(out, a.Label)
	}
	return strings.Join(out, ",")
}

func TestKeyRestrictionsStored(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, _ := e.createAccount(acct{label: "alpha"})
	b, _ := e.createAccount(acct{label: "beta"})
	k, hash := e.createLimitedKey(&weirv1.CreateKeyRequest{Name: "ci",
		AllowedModels: []string{"claude-sonnet-*", "gpt-5*", "claude-sonnet-*"}, PinnedAccounts: []string{"alpha", b.Id}, RateLimitPerMinute: 60})
	if strings.Join(k.AllowedModels, " ") != "claude-sonnet-* gpt-5*" || !k.Pinned || pinLabels(k) != "alpha,beta" || k.RateLimitPerMinute != 60 {
		t.Fatalf("created key: %v", k)
	}
	plain, _ := e.createKey("plain")
	if len(plain.AllowedModels) != 0 || plain.Pinned || len(plain.PinnedAccounts) != 0 || plain.RateLimitPerMinute != 0 {
		t.Fatalf("a key without restrictions: %v", plain)
	}
	list, err := e.admin.keys.ListKeys(t.Context(), connect.NewRequest(&weirv1.ListKeysRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if got := list.Msg.Keys[0]; got.Name != "ci" || pinLabels(got) != "alpha,beta" || got.RateLimitPerMinute != 60 || len(got.AllowedModels) != 2 {
		t.Fatalf("ListKeys: %v", got)
	}
	v, err := e.dp.leases.VerifyKey(t.Context(), connect.NewRequest(&weirv1.VerifyKeyRequest{KeyHash: hash}))
	if err != nil || strings.Join(v.Msg.AllowedModels, " ") != "claude-sonnet-* gpt-5*" || v.Msg.RateLimitPerMinute != 60 {
		t.Fatalf("VerifyKey: %v %v", v, err)
	}

	// Each restriction changes alone; the others stay.
	k, err = e.updateKey(&weirv1.UpdateKeyRequest{Id: "ci", AllowedModels: []string{"claude-opus-4-1"}}, "allowed_models")
	if err != nil || strings.Join(k.AllowedModels, " ") != "claude-opus-4-1" || pinLabels(k) != "alpha,beta" || k.RateLimitPerMinute != 60 {
		t.Fatalf("update models: %v %v", k, err)
	}
	k, err = e.updateKey(&weirv1.UpdateKeyRequest{Id: k.Id, PinnedAccounts: []string{a.Id}}, "pinned_accounts")
	if err != nil || pinLabels(k) != "alpha" || len(k.AllowedModels) != 1 || k.RateLimitPerMinute != 60 {
		t.Fatalf("update accounts: %v %v", k, err)
	}
	k, err = e.updateKey(&weirv1.UpdateKeyRequest{Id: "ci", RateLimitPerMinute: 5}, "rate_limit_per_minute")
	if err != nil || k.RateLimitPerMinute != 5 || pinLabels(k) != "alpha" {
		t.Fatalf("update rate: %v %v", k, err)
	}
	// Empty values clear.
	k, err = e.updateKey(&weirv1.UpdateKeyRequest{Id: "ci"}, "allowed_models", "pinned_accounts", "rate_limit_per_minute")
	if err != nil || len(k.AllowedModels) != 0 || k.Pinned || len(k.PinnedAccounts) != 0 || k.RateLimitPerMinute != 0 {
		t.Fatalf("clear: %v %v", k, err)
	}
	if n := e.count(`SELECT count(*) FROM client_keys WHERE allowed_models IS NULL AND rate_limit_per_minute IS NULL AND NOT pinned`); n != 2 {
		t.Errorf("cleared restrictions are not stored as none: %d keys unrestricted", n)
	}

	for _, tc := range []struct {
		name  string
		req   *weirv1.CreateKeyRequest
		field string
	}{
		{"bad glob", &weirv1.CreateKeyRequest{AllowedModels: []string{"claude-*-sonnet"}}, `allowed_models[0] "claude-*-sonnet": only a trailing *`},
		{"question mark", &weirv1.CreateKeyRequest{AllowedModels: []string{"ok", "gpt-5?"}}, "allowed_models[1]"},
		{"empty pattern", &weirv1.CreateKeyRequest{AllowedModels: []string{""}}, "allowed_models[0]"},
		{"unknown account", &weirv1.CreateKeyRequest{PinnedAccounts: []string{"alpha", "gamma"}}, `pinned_accounts[1]: no account "gamma"`},
		{"negative rate", &weirv1.CreateKeyRequest{RateLimitPerMinute: -1}, "rate_limit_per_minute: must be between 1 and"},
		{"huge rate", &weirv1.CreateKeyRequest{RateLimitPerMinute: 1 << 30}, "rate_limit_per_minute"},
	} {
		tc.req.Name = "bad-" + randid.Hex(3)
		_, err := e.admin.keys.CreateKey(t.Context(), connect.NewRequest(tc.req))
		if ce := wantCode(t, err, connect.CodeInvalidArgument); ce != nil && !strings.Contains(ce.Message(), tc.field) {
			t.Errorf("%s: message %q does not say %q", tc.name, ce.Message(), tc.field)
		}
	}
	if n := e.count(`SELECT count(*) FROM client_keys`); n != 2 {
		t.Errorf("%d keys after refused creates, want 2", n)
	}
	_, err = e.updateKey(&weirv1.UpdateKeyRequest{Id: "ci"})
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = e.updateKey(&weirv1.UpdateKeyRequest{Id: "ci"}, "name")
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = e.updateKey(&weirv1.UpdateKeyRequest{Id: "ci", RateLimitPerMinute: -5}, "rate_limit_per_minute")
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = e.updateKey(&weirv1.UpdateKeyRequest{Id: "nope"}, "allowed_models")
	wantCode(t, err, connect.CodeNotFound)
	// The data-plane token cannot change keys.
	_, err = e.dp.keys.UpdateKey(t.Context(), connect.NewRequest(&weirv1.UpdateKeyRequest{Id: "ci",
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"allowed_models"}}}))
	wantCode(t, err, connect.CodeUnauthenticated)
}

func TestKeyModelAllowlistAcquire(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createAccount(acct{})
	_, hash := e.createLimitedKey(&weirv1.CreateKeyRequest{AllowedModels: []string{"claude-sonnet-*"}})
	refused := func(hash, model string) {
		t.Helper()
		_, err := e.dp.leases.Acquire(t.Context(), connect.NewRequest(&weirv1.AcquireRequest{KeyHash: hash, Model: model, RequestId: "r"}))
		ce := wantCode(t, err, connect.CodePermissionDenied)
		if ce == nil {
			return
		}
		if !strings.Contains(ce.Message(), `model "`+model+`" is not allowed for this key`) {
			t.Errorf("Acquire %s: message %q", model, ce.Message())
		}
		var detail *weirv1.ModelNotAllowed
		for _, d := range ce.Details() {
			if v, err := d.Value(); err == nil {
				detail, _ = v.(*weirv1.ModelNotAllowed)
			}
		}
		if detail.GetModel() != model {
			t.Errorf("Acquire %s: no ModelNotAllowed detail naming it: %v", model, ce.Details())
		}
	}
	refused(hash, opusModel)
	if n := e.count(`SELECT count(*) FROM leases`); n != 0 {
		t.Fatalf("a refused model leased %d accounts", n)
	}
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: hash, Model: sonnetModel}); l.Model != "" {
		t.Errorf("a concrete model got lease model %q", l.Model)
	}
	// A model-less call (the model list) is not a model request.
	e.mustLease(&weirv1.AcquireRequest{KeyHash: hash})

	// An alias is allowed by its own name, and then serves only from the
	// targets the list allows too.
	ac := e.aliasClient(e.cfg.AdminToken)
	if _, err := ac.SetAlias(t.Context(), connect.NewRequest(&weirv1.SetAliasRequest{Alias: "best", Targets: []string{opusModel, sonnetModel}})); err != nil {
		t.Fatal(err)
	}
	refused(hash, "best")
	_, both := e.createLimitedKey(&weirv1.CreateKeyRequest{AllowedModels: []string{"best", "claude-sonnet-*"}})
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: both, Model: "best"}); l.Model != sonnetModel {
		t.Errorf("alias for a key allowing sonnet only: lease model %q, want %q (opus is the first target but not allowed)", l.Model, sonnetModel)
	}
	_, aliasOnly := e.createLimitedKey(&weirv1.CreateKeyRequest{AllowedModels: []string{"best", "claude-haiku-*"}})
	refused(aliasOnly, "best")
	// Without an allowlist, the alias's first target serves.
	_, open := e.createKey("")
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: open, Model: "best"}); l.Model != opusModel {
		t.Errorf("alias without allowlist: lease model %q", l.Model)
	}
}

func TestKeyPinnedRouting(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, _ := e.createAccount(acct{label: "a", maxConc: 50})
	b, _ := e.createAccount(acct{label: "b", maxConc: 50})
	c, _ := e.createAccount(acct{label: "c", maxConc: 50})
	_, toB := e.createLimitedKey(&weirv1.CreateKeyRequest{PinnedAccounts: []string{"b"}})
	_, toA := e.createLimitedKey(&weirv1.CreateKeyRequest{PinnedAccounts: []string{"a"}})
	_, open := e.createKey("")

	// Least-recently-used routing would spread these over all three.
	for i := range 6 {
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: toB, Model: sonnetModel})
		if l.AccountId != b.Id {
			t.Fatalf("request %d of the key pinned to b went to %s", i, l.AccountLabel)
		}
		e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
		e.clock.Advance(time.Second)
	}
	seen := map[string]bool{}
	for range 3 {
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: open, Model: sonnetModel})
		seen[l.AccountId] = true
		e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
		e.clock.Advance(time.Second)
	}
	if len(seen) != 3 {
		t.Fatalf("the unpinned key reached %d accounts, want all 3", len(seen))
	}

	// A session bound to a (by the key pinned there) is not followed by the
	// key pinned to b.
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: toA, Model: sonnetModel, SessionKey: "sess"}); l.AccountId != a.Id {
		t.Fatalf("bind: %s", l.AccountLabel)
	}
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: toB, Model: sonnetModel, SessionKey: "sess"}); l.AccountId != b.Id {
		t.Fatalf("the pinned key followed the session to %s", l.AccountLabel)
	}
	// Nor does a prefer or the exclusion of its account open the others.
	e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: toB, Model: sonnetModel, ExcludeAccountIds: []string{b.Id}, PreferAccountId: c.Id},
		weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_TRIED)

	// The pinned account cooling: the usual answer, with why and when.
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: toB, Model: sonnetModel})
	e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, Headers: map[string]string{"retry-after": "120"}})
	none := e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: toB, Model: sonnetModel}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING)
	if none.RetryAt == nil || !strings.Contains(none.Message, "1 accounts are cooling") || !strings.Contains(none.Message, "recovers at") {
		t.Errorf("pinned account cooling: %v", none)
	}
	e.mustLease(&weirv1.AcquireRequest{KeyHash: open, Model: sonnetModel}) // the others still serve other keys
	e.pause(b.Id)
	none = e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: toB, Model: sonnetModel}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED)
	if !none.Permanent {
		t.Errorf("pinned account paused: %v", none)
	}

	// Deleting the only pinned account leaves the key pinned to nothing,
	// not free to use every account.
	if _, err := e.admin.accounts.DeleteAccount(t.Context(), connect.NewRequest(&weirv1.DeleteAccountRequest{Id: b.Id})); err != nil {
		t.Fatal(err)
	}
	none = e.mustNoAccount(&weirv1.AcquireRequest{KeyHash: toB, Model: sonnetModel}, weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED)
	if !none.Permanent || !strings.Contains(none.Message, "pinned to accounts that no longer exist") {
		t.Errorf("pinned account deleted: %v", none)
	}
	list, err := e.admin.keys.ListKeys(t.Context(), connect.NewRequest(&weirv1.ListKeysRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	pinnedToNothing := 0
	for _, k := range list.Msg.Keys {
		if k.Pinned && len(k.PinnedAccounts) == 0 {
			pinnedToNothing++
		}
	}
	if pinnedToNothing != 1 {
		t.Errorf("ListKeys shows %d keys pinned to nothing, want 1: %v", pinnedToNothing, list.Msg.Keys)
	}
	// PoolQuota reads the pin as well: nothing to block.
	if _, err := e.dp.leases.PoolQuota(t.Context(), connect.NewRequest(&weirv1.PoolQuotaRequest{KeyHash: toB, Model: sonnetModel})); err != nil {
		t.Fatal(err)
	}
	// An operator re-pins it, and it serves from there only.
	if _, err := e.updateKey(&weirv1.UpdateKeyRequest{Id: keyIDByHash(e, toB), PinnedAccounts: []string{"c"}}, "pinned_accounts"); err != nil {
		t.Fatal(err)
	}
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: toB, Model: sonnetModel}); l.AccountId != c.Id {
		t.Errorf("re-pinned key went to %s", l.AccountLabel)
	}
}

func keyIDByHash(e *env, hash string) string {
	e.t.Helper()
	v, err := e.dp.leases.VerifyKey(e.t.Context(), connect.NewRequest(&weirv1.VerifyKeyRequest{KeyHash: hash}))
	if err != nil {
		e.t.Fatal(err)
	}
	return v.Msg.KeyId
}

func TestKeyRateLimitBucket(t *testing.T) {
	t.Parallel()
	e := setup(t)
	other := e.replica() // the limit is the key's total over every replica
	k, hash := e.createLimitedKey(&weirv1.CreateKeyRequest{RateLimitPerMinute: 5})
	_, open := e.createKey("")
	take := func(r *env, hash string) *weirv1.TakeRequestTokenResponse {
		t.Helper()
		resp, err := r.dp.leases.TakeRequestToken(t.Context(), connect.NewRequest(&weirv1.TakeRequestTokenRequest{KeyHash: hash}))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Msg
	}
	admitted := func(n int) {
		t.Helper()
		for i := range n {
			r := []*env{e, other}[i%2]
			if got := take(r, hash); !got.Admitted || got.RateLimitPerMinute != 5 {
				t.Fatalf("request %d of %d: %v", i+1, n, got)
			}
		}
	}
	refusedFor := func(want time.Duration) {
		t.Helper()
		for _, r := range []*env{e, other} {
			got := take(r, hash)
			if got.Admitted || got.RetryAfter.AsDuration() != want {
				t.Fatalf("over the limit: %v, want refused for %v", got, want)
			}
		}
	}
	admitted(5) // a full bucket holds the minute's requests
	refusedFor(12 * time.Second)
	e.clock.Advance(5 * time.Second)
	refusedFor(7 * time.Second)
	e.clock.Advance(7 * time.Second)
	admitted(1) // one every 12 s
	refusedFor(12 * time.Second)
	e.clock.Advance(time.Hour)
	admitted(5) // never more than a minute's worth, however long idle
	refusedFor(12 * time.Second)

	// A key without a limit is admitted and never counted.
	for range 20 {
		if got := take(e, open); !got.Admitted || got.RateLimitPerMinute != 0 {
			t.Fatalf("unlimited key: %v", got)
		}
	}
	if n := e.count(`SELECT count(*) FROM client_key_buckets`); n != 1 {
		t.Errorf("%d buckets, want only the limited key's", n)
	}

	// A new limit starts with a full bucket; lifting it admits everything.
	if _, err := e.updateKey(&weirv1.UpdateKeyRequest{Id: k.Id, RateLimitPerMinute: 2}, "rate_limit_per_minute"); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if got := take(other, hash); !got.Admitted {
			t.Fatalf("request %d under the new limit: %v", i, got)
		}
	}
	if got := take(e, hash); got.Admitted || got.RetryAfter.AsDuration() != 30*time.Second {
		t.Fatalf("over the new limit: %v", got)
	}
	if _, err := e.updateKey(&weirv1.UpdateKeyRequest{Id: k.Id}, "rate_limit_per_minute"); err != nil {
		t.Fatal(err)
	}
	if got := take(e, hash); !got.Admitted {
		t.Fatalf("limit lifted: %v", got)
	}

	// A revoked or unknown key takes nothing.
	if _, err := e.admin.keys.RevokeKey(t.Context(), connect.NewRequest(&weirv1.RevokeKeyRequest{Id: k.Id})); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{hash, HashKey("weir_sk_guess")} {
		_, err := e.dp.leases.TakeRequestToken(t.Context(), connect.NewRequest(&weirv1.TakeRequestTokenRequest{KeyHash: h}))
		wantCode(t, err, connect.CodePermissionDenied)
	}
	// Operators' tokens cannot take a worker's call.
	_, err := e.admin.leases.TakeRequestToken(t.Context(), connect.NewRequest(&weirv1.TakeRequestTokenRequest{KeyHash: open}))
	wantCode(t, err, connect.CodeUnauthenticated)
}

func TestTokenWait(t *testing.T) {
	t.Parallel()
	now := epoch
	for _, tc := range []struct {
		tat   time.Time
		limit int32
		want  time.Duration
	}{
		{now, 5, 0},
		{now.Add(time.Minute), 5, 12 * time.Second},
		{now.Add(50 * time.Second), 5, 2 * time.Second},
		{now.Add(time.Minute), 60, time.Second},
		// 60 s / 7 rounds down to the microsecond, as Postgres does.
		{now.Add(7 * 8571428 * time.Microsecond), 7, 8571428*time.Microsecond*8 - time.Minute},
	} {
		if got := tokenWait(tc.tat, tc.limit, now); got != tc.want {
			t.Errorf("tokenWait(now+%v, %d) = %v, want %v", tc.tat.Sub(now), tc.limit, got, tc.want)
		}
	}
}

// TestWatchPoolKeyLimitEvents: every change of a key's restrictions, and
// the deletion of an account a key is pinned to, reach the workers as a
// keys event (they drop cached verifications and reused leases).
func TestWatchPoolKeyLimitEvents(t *testing.T) {
	t.Parallel()
	e, stream := watching(t)
	a, _ := e.createAccount(acct{})
	k, _ := e.createKey("")
	// nextEvent fails the test when no event comes in time.
	wantKeys := func() {
		t.Helper()
		for !nextEvent(t, stream).Keys {
		}
	}
	for _, tc := range []struct {
		path string
		req  *weirv1.UpdateKeyRequest
	}{
		{"allowed_models", &weirv1.UpdateKeyRequest{AllowedModels: []string{"claude-sonnet-*"}}},
		{"rate_limit_per_minute", &weirv1.UpdateKeyRequest{RateLimitPerMinute: 10}},
		{"pinned_accounts", &weirv1.UpdateKeyRequest{PinnedAccounts: []string{a.Id}}},
		{"allowed_models", &weirv1.UpdateKeyRequest{}},
		{"rate_limit_per_minute", &weirv1.UpdateKeyRequest{}},
		{"metered_accounts", &weirv1.UpdateKeyRequest{MeteredAccounts: weirv1.MeteredAccounts_METERED_ACCOUNTS_NEVER}},
		{"metered_accounts", &weirv1.UpdateKeyRequest{}},
	} {
		tc.req.Id = k.Id
		if _, err := e.updateKey(tc.req, tc.path); err != nil {
			t.Fatal(err)
		}
		wantKeys()
	}
	if _, err := e.admin.accounts.DeleteAccount(t.Context(), connect.NewRequest(&weirv1.DeleteAccountRequest{Id: a.Id})); err != nil {
		t.Fatal(err)
	}
	wantKeys() // the pin row goes with the account
}
