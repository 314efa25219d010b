package controlplane

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/upstream"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/sim"
)

func TestJudgeCheck(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want checkVerdict
	}{
		{nil, checkGood},
		{&upstream.StatusError{Endpoint: "models endpoint", Code: 401}, checkRejected},
		{scrubbed{err: &upstream.StatusError{Endpoint: "usage endpoint", Code: 401}}, checkRejected},
		{&upstream.StatusError{Endpoint: "usage endpoint", Code: 403}, checkUndecided},
		{&upstream.StatusError{Endpoint: "models endpoint", Code: 503}, checkUndecided},
		{errors.New("models endpoint unreachable: connection refused"), checkUndecided},
		{errCredentialUnreadable, checkUndecided},
	} {
		if got := judgeCheck(c.err); got != c.want {
			t.Errorf("judgeCheck(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

// An added account is unverified until its check runs (a job enqueued with
// it); the check reads the simulator and records good, or broken with the
// reason for a revoked key, whatever the provider and auth.
func TestAccountCheckOnboard(t *testing.T) {
	t.Parallel()
	clock := newClock()
	e := newEnv(t, pgtest.NewPool(t), testConfig(clock), clock)
	scripts := []sim.AccountScript{
		{Name: "good", Kind: sim.KindAPIKey, Credential: apiKey()},
		{Name: "revoked", Kind: sim.KindAPIKey, Credential: apiKey(), Revoked: true},
		{Name: "openai", Kind: sim.KindOpenAIKey, Credential: "sk-proj-" + randid.Hex(40)},
		maxAccount("max"),
	}
	s := sim.New(sim.Config{Now: clock.Now, Script: sim.Script{Accounts: scripts, AcceptUnknown: true}})
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	accts := map[string]*weirv1.Account{}
	for _, sc := range scripts {
		req := &weirv1.CreateAccountRequest{Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY,
			Label: sc.Name, Credential: sc.Credential, BaseUrl: ts.URL}
		switch sc.Kind {
		case sim.KindOAuth:
			req.AuthKind = weirv1.AuthKind_AUTH_KIND_OAUTH
		case sim.KindOpenAIKey:
			req.Provider, req.BaseUrl = weirv1.Provider_PROVIDER_OPENAI, ts.URL+"/v1"
		}
		e.secrets.add(sc.Credential)
		resp, err := e.admin.accounts.CreateAccount(t.Context(), connect.NewRequest(req))
		if err != nil {
			t.Fatalf("CreateAccount %s: %v", sc.Name, err)
		}
		accts[sc.Name] = resp.Msg.Account
	}

	var queued int
	if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM river_job WHERE kind = 'account_check'`).Scan(&queued); err != nil {
		t.Fatal(err)
	}
	if queued != len(accts) {
		t.Errorf("account_check jobs enqueued = %d, want %d (one per account added)", queued, len(accts))
	}
	for name, a := range accts {
		if a.Check != weirv1.AccountCheck_ACCOUNT_CHECK_UNVERIFIED {
			t.Errorf("%s: check right after adding = %v, want unverified", name, a.Check)
		}
		next, err := e.srv.acct.CheckAccount(t.Context(), uuid.MustParse(a.Id), a.CredentialRevision)
		if err != nil || !next.IsZero() {
			t.Fatalf("%s: CheckAccount = %v, %v; want done", name, next, err)
		}
	}
	want := map[string]weirv1.AccountCheck{
		"good": weirv1.AccountCheck_ACCOUNT_CHECK_GOOD, "max": weirv1.AccountCheck_ACCOUNT_CHECK_GOOD,
		"openai": weirv1.AccountCheck_ACCOUNT_CHECK_GOOD, "revoked": weirv1.AccountCheck_ACCOUNT_CHECK_BROKEN,
	}
	list, err := e.admin.accounts.ListAccounts(t.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range list.Msg.Accounts {
		if a.Check != want[a.Label] {
			t.Errorf("%s: check = %v (%q), want %v", a.Label, a.Check, a.CheckReason, want[a.Label])
		}
		switch a.Label {
		case "revoked":
			if a.State != weirv1.AccountState_ACCOUNT_STATE_BROKEN || !strings.Contains(a.CheckReason, "credential rejected by the upstream") ||
				!strings.Contains(a.CheckReason, "401") || a.BrokenReason != a.CheckReason {
				t.Errorf("revoked: state %v, reason %q, broken_reason %q; want broken, the 401 named", a.State, a.CheckReason, a.BrokenReason)
			}
		case "max":
			// The OAuth check is the usage read: its windows landed too.
			if len(a.Usage) == 0 || a.CheckedAt == nil {
				t.Errorf("max: usage %v, checked_at %v; want the check's reading stored", a.Usage, a.CheckedAt)
			}
		}
	}
	paths := map[string]string{}
	for _, at := range s.Attempts() {
		paths[at.Account] = at.Path
	}
	for name, p := range map[string]string{"good": "/v1/models", "revoked": "/v1/models", "openai": "/v1/models", "max": "/api/oauth/usage"} {
		if paths[name] != p {
			t.Errorf("%s: the check read %q, want %q", name, paths[name], p)
		}
	}

	// A new credential is checked again, within the read budget: the old
	// credential's check read the account a moment ago.
	fresh := apiKey()
	e.secrets.add(fresh)
	replaced, err := e.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
		Id: "revoked", Credential: fresh, UpdateMask: fieldMaskOf("credential")}))
	if err != nil {
		t.Fatal(err)
	}
	a := replaced.Msg.Account
	if a.Check != weirv1.AccountCheck_ACCOUNT_CHECK_UNVERIFIED || a.State == weirv1.AccountState_ACCOUNT_STATE_BROKEN {
		t.Errorf("after a new credential: check %v, state %v; want unverified, not broken", a.Check, a.State)
	}
	next, err := e.srv.acct.CheckAccount(t.Context(), uuid.MustParse(a.Id), a.CredentialRevision)
	if err != nil || !next.After(clock.Now()) {
		t.Fatalf("CheckAccount within the budget = %v, %v; want a later time", next, err)
	}
	clock.Advance(next.Sub(clock.Now()))
	if next, err := e.srv.acct.CheckAccount(t.Context(), uuid.MustParse(a.Id), a.CredentialRevision); err != nil || !next.IsZero() {
		t.Fatalf("CheckAccount once the budget allows = %v, %v; want done", next, err)
	}
	got, err := e.admin.accounts.GetAccount(t.Context(), connect.NewRequest(&weirv1.GetAccountRequest{Id: a.Id}))
	if err != nil || got.Msg.Account.Check != weirv1.AccountCheck_ACCOUNT_CHECK_GOOD {
		t.Fatalf("GetAccount after the check: %v, %v; want good", got, err)
	}
}

// An account whose credential this replica cannot open shows broken at
// once, with the reason its next credential check would write, not active
// until then.
func TestAccountCheckUnreadableShowsBroken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createAccount(acct{label: "fine"})
	e.unreadableAccount(acct{label: "sealed-elsewhere"})
	list, err := e.admin.accounts.ListAccounts(t.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range list.Msg.Accounts {
		unreadable := a.Label == "sealed-elsewhere"
		broken := a.State == weirv1.AccountState_ACCOUNT_STATE_BROKEN && a.Check == weirv1.AccountCheck_ACCOUNT_CHECK_BROKEN
		if a.CredentialUnreadable != unreadable || broken != unreadable {
			t.Errorf("%s: unreadable %v, state %v, check %v", a.Label, a.CredentialUnreadable, a.State, a.Check)
		}
		if unreadable && a.BrokenReason != unreadableReason {
			t.Errorf("%s: broken_reason %q, want the unreadable reason", a.Label, a.BrokenReason)
		}
	}
}
