package controlplane

import (
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// wantDuplicate requires AlreadyExists naming label, with the
// DuplicateAccount detail, and never the credential.
func wantDuplicate(t *testing.T, err error, label, credential string) {
	t.Helper()
	ce := wantCode(t, err, connect.CodeAlreadyExists)
	if !strings.Contains(ce.Message(), "already in the pool as \""+label+"\"") || (credential != "" && strings.Contains(ce.Message(), credential)) {
		t.Fatalf("message %q: want the existing label %q and no credential", ce.Message(), label)
	}
	var found bool
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if dup, ok := v.(*weirv1.DuplicateAccount); ok && dup.Label == label && dup.Id != "" {
				found = true
			}
		}
	}
	if !found {
		t.Fatalf("no DuplicateAccount detail naming %q", label)
	}
}

var hashIdentityRE = regexp.MustCompile(`^sha256:[0-9a-f]{16}$`)

// An API key already in the pool is refused under another label, and so
// is a replacement key that another account has.
func TestIdentityAPIKeyDuplicate(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, key := e.createAccount(acct{label: "first"})
	if !hashIdentityRE.MatchString(a.Identity) || a.Identity != hashIdentity(key) {
		t.Fatalf("identity %q", a.Identity)
	}
	_, err := e.admin.accounts.CreateAccount(t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY, Label: "second", Credential: key,
	}))
	wantDuplicate(t, err, "first", key)

	// The same key is another upstream account at OpenAI: no clash.
	if _, err := e.admin.accounts.CreateAccount(t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider: weirv1.Provider_PROVIDER_OPENAI, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY, Label: "openai", Credential: key,
	})); err != nil {
		t.Fatalf("same key, other provider: %v", err)
	}

	b, _ := e.createAccount(acct{label: "other"})
	_, err = e.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
		Id: b.Id, Credential: key, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credential"}},
	}))
	wantDuplicate(t, err, "first", key)
	newKey := apiKey()
	e.secrets.add(newKey)
	resp, err := e.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
		Id: b.Id, Credential: newKey, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credential"}},
	}))
	if err != nil || resp.Msg.Account.Identity != hashIdentity(newKey) {
		t.Fatalf("a new key: %v, identity %q", err, resp.Msg.GetAccount().GetIdentity())
	}
}

// Accounts from before identities are named from their stored credential
// when a new account must be compared with them.
func TestIdentityUnnamedAccounts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, key := e.createAccount(acct{label: "legacy"})
	if _, err := e.pool.Exec(t.Context(), "UPDATE accounts SET identity = ''"); err != nil {
		t.Fatal(err)
	}
	if got := e.getAccount(a.Id); got.Identity != "" {
		t.Fatalf("identity %q after clearing", got.Identity)
	}
	_, err := e.admin.accounts.CreateAccount(t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY, Label: "again", Credential: key,
	}))
	wantDuplicate(t, err, "legacy", key)
	if got := e.getAccount(a.Id); got.Identity != hashIdentity(key) {
		t.Fatalf("the legacy account was not named: %q", got.Identity)
	}
}

// A Claude login is named by its profile's account uuid when the profile
// endpoint answers, else by its refresh token's hash; the same login is
// found either way.
func TestIdentityClaudeLogin(t *testing.T) {
	t.Parallel()
	sa := refreshable("max")
	u := newOAuthEnv(t, sa)
	u.secrets.add(sa.Credential)
	u.secrets.add(sa.RefreshToken)
	creds := claudeCodeJSON(sa.Credential, sa.RefreshToken, epoch.Add(time.Hour))
	create := func(label, baseURL string) (*weirv1.Account, error) {
		resp, err := u.admin.accounts.CreateAccount(t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
			Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_OAUTH,
			Label: label, Credential: creds, BaseUrl: baseURL,
		}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.Account, nil
	}

	// The profile endpoint is down: the refresh token's hash names it.
	down := httptest.NewServer(nil)
	down.Close()
	first, err := create("offline", down.URL)
	if err != nil {
		t.Fatal(err)
	}
	if first.Identity != hashIdentity(sa.RefreshToken) {
		t.Fatalf("identity %q, want the refresh token's hash", first.Identity)
	}
	// Added again where the profile answers: found by the same hash.
	_, err = create("online", u.simURL)
	wantDuplicate(t, err, "offline", sa.RefreshToken)

	if _, err := u.admin.accounts.DeleteAccount(t.Context(), connect.NewRequest(&weirv1.DeleteAccountRequest{Id: first.Id})); err != nil {
		t.Fatal(err)
	}
	a, err := create("online", u.simURL)
	if err != nil {
		t.Fatal(err)
	}
	if want := u.sim.ProfileUUID("max"); a.Identity != want || want == "" {
		t.Fatalf("identity %q, want the profile uuid %q", a.Identity, want)
	}
	if !a.Refreshable || a.AccessExpiresAt == nil {
		t.Errorf("refreshable %v, expires %v", a.Refreshable, a.AccessExpiresAt)
	}
	_, err = create("twice", u.simURL)
	wantDuplicate(t, err, "online", sa.Credential)
}

// Two Codex accounts of one ChatGPT account are one upstream account.
func TestIdentityCodex(t *testing.T) {
	t.Parallel()
	e := setup(t)
	create := func(label string) error {
		access, refresh := codexAccess("", epoch.Add(24*time.Hour)), codexRefresh()
		e.secrets.add(access)
		e.secrets.add(refresh)
		resp, err := e.admin.accounts.CreateAccount(t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
			Provider: weirv1.Provider_PROVIDER_CODEX, AuthKind: weirv1.AuthKind_AUTH_KIND_OAUTH,
			Label: label, Credential: codexAuthJSON("", access, refresh, "chatgpt-same"),
		}))
		if err == nil && resp.Msg.Account.Identity != "chatgpt-same" {
			t.Fatalf("identity %q", resp.Msg.Account.Identity)
		}
		return err
	}
	if err := create("codex-1"); err != nil {
		t.Fatal(err)
	}
	wantDuplicate(t, create("codex-2"), "codex-1", "")
}
