package controlplane

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/weirhq/weir/controlplane/seal"
	"github.com/weirhq/weir/controlplane/upstream"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/sim"
)

func refreshToken() string { return "sk-ant-ort01-" + randid.Hex(40) }

// oauthJSON is the {"access_token","refresh_token","expires_at"} form.
func oauthJSON(access, refresh string, expires time.Time) string {
	b, _ := json.Marshal(map[string]string{
		"access_token": access, "refresh_token": refresh, "expires_at": expires.Format(time.RFC3339),
	})
	return string(b)
}

// claudeCodeJSON is Claude Code's ~/.claude/.credentials.json, pretty
// printed as Claude Code writes it.
func claudeCodeJSON(access, refresh string, expires time.Time) string {
	b, _ := json.MarshalIndent(map[string]any{"claudeAiOauth": map[string]any{
		"accessToken": access, "refreshToken": refresh, "expiresAt": expires.UnixMilli(),
		"scopes": []string{"user:inference", "user:profile"}, "subscriptionType": "max",
	}}, "", "  ")
	return string(b) + "\n"
}

func TestParseCredential(t *testing.T) {
	t.Parallel()
	access, refresh := oauthToken(), refreshToken()
	at := time.Date(2030, 3, 4, 5, 6, 7, 0, time.UTC)
	oauth, apiKind := weirv1.AuthKind_AUTH_KIND_OAUTH, weirv1.AuthKind_AUTH_KIND_API_KEY
	for _, tc := range []struct {
		name    string
		kind    weirv1.AuthKind
		in      string
		want    credentialInput
		wantErr string
	}{
		{name: "bare access token", kind: oauth, in: access, want: credentialInput{access: access}},
		{name: "api key", kind: apiKind, in: "sk-ant-api03-abcdefgh", want: credentialInput{access: "sk-ant-api03-abcdefgh"}},
		{name: "flat JSON", kind: oauth, in: oauthJSON(access, refresh, at), want: credentialInput{access: access, refresh: refresh, expiresAt: &at}},
		{name: "flat JSON, Unix seconds", kind: oauth,
			in:   fmt.Sprintf(`{"access_token":%q,"refresh_token":%q,"expires_at":%d}`, access, refresh, at.Unix()),
			want: credentialInput{access: access, refresh: refresh, expiresAt: &at}},
		{name: "flat JSON, access only", kind: oauth, in: fmt.Sprintf(`{"access_token":%q}`, access), want: credentialInput{access: access}},
		{name: "Claude Code credentials file", kind: oauth, in: claudeCodeJSON(access, refresh, at), want: credentialInput{access: access, refresh: refresh, expiresAt: &at}},
		{name: "JSON for an api key", kind: apiKind, in: oauthJSON(access, refresh, at), wantErr: "for oauth accounts only"},
		{name: "bad JSON", kind: oauth, in: `{"access_token": "` + access, wantErr: "credential: not valid JSON"},
		{name: "not an object", kind: oauth, in: `{"access_token": 12}`, wantErr: "credential: access_token: must be a string"},
		{name: "no known field", kind: oauth, in: `{"token":"x"}`, wantErr: "access_token, refresh_token and expires_at, or Claude Code's claudeAiOauth"},
		{name: "missing access token", kind: oauth, in: fmt.Sprintf(`{"refresh_token":%q,"expires_at":%d}`, refresh, at.Unix()), wantErr: "credential: access_token: required"},
		{name: "missing expiry", kind: oauth, in: fmt.Sprintf(`{"access_token":%q,"refresh_token":%q}`, access, refresh), wantErr: "credential: expires_at: required with refresh_token"},
		{name: "bad expiry", kind: oauth, in: fmt.Sprintf(`{"access_token":%q,"refresh_token":%q,"expires_at":"tomorrow"}`, access, refresh), wantErr: "credential: expires_at: must be"},
		{name: "bad refresh token", kind: oauth, in: fmt.Sprintf(`{"access_token":%q,"refresh_token":"a b","expires_at":1}`, access), wantErr: "credential: refresh_token: 8 to 8192"},
		{name: "Claude Code, missing access token", kind: oauth, in: `{"claudeAiOauth":{"refreshToken":"` + refresh + `","expiresAt":1}}`, wantErr: "credential: claudeAiOauth.accessToken: required"},
		{name: "Claude Code, missing expiry", kind: oauth, in: `{"claudeAiOauth":{"accessToken":"` + access + `","refreshToken":"` + refresh + `"}}`, wantErr: "credential: claudeAiOauth.expiresAt: required with claudeAiOauth.refreshToken"},
		{name: "Claude Code, not an object", kind: oauth, in: `{"claudeAiOauth":"x"}`, wantErr: "credential: claudeAiOauth: must be a JSON object"},
		{name: "bare token with spaces", kind: oauth, in: "sk-ant oat01", wantErr: "credential: required, 8 to 8192"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseCredential(weirv1.Provider_PROVIDER_ANTHROPIC, tc.kind, tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), access) || strings.Contains(err.Error(), refresh) {
					t.Fatal("the error quotes a token")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.access != tc.want.access || got.refresh != tc.want.refresh || !sameTime(got.expiresAt, tc.want.expiresAt) {
				t.Fatalf("got %q %q %v, want %q %q %v", got.access, got.refresh, got.expiresAt, tc.want.access, tc.want.refresh, tc.want.expiresAt)
			}
		})
	}
}

// oauthEnv is a control plane whose OAuth accounts live in a simulator
// sharing its clock; every token the token endpoint hands out is recorded
// as a secret that must never be logged.
type oauthEnv struct {
	*env
	sim    *sim.Server
	simURL string
}

// secretsTransport records the tokens in every token endpoint answer.
type secretsTransport struct{ u *oauthEnv }

func (s secretsTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil {
		return resp, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	var tok upstream.Tokens
	if json.Unmarshal(b, &tok) == nil {
		for _, v := range []string{tok.AccessToken, tok.RefreshToken} {
			if v != "" {
				s.u.secrets.add(v)
			}
		}
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return resp, nil
}

func newOAuthEnv(t *testing.T, accounts ...sim.AccountScript) *oauthEnv {
	t.Helper()
	u := &oauthEnv{}
	clock := newClock()
	cfg := testConfig(clock)
	cfg.OAuthClient = &http.Client{Transport: secretsTransport{u}, Timeout: 10 * time.Second}
	u.env = newEnv(t, pgtest.NewPool(t), cfg, clock)
	u.sim = sim.New(sim.Config{Now: clock.Now, Script: sim.Script{Accounts: accounts}})
	ts := httptest.NewServer(u.sim)
	t.Cleanup(ts.Close)
	u.simURL = ts.URL
	return u
}

// refreshable is a simulator OAuth account with a refresh token.
func refreshable(name string) sim.AccountScript {
	return sim.AccountScript{Name: name, Kind: sim.KindOAuth, Credential: oauthToken(), RefreshToken: refreshToken()}
}

// addOAuth creates the weir account for a, its access token expiring at
// expires, in Claude Code's credentials-file form.
func (u *oauthEnv) addOAuth(a sim.AccountScript, expires time.Time) *weirv1.Account {
	u.t.Helper()
	u.secrets.add(a.Credential)
	u.secrets.add(a.RefreshToken)
	acct, _ := u.createAccount(acct{label: a.Name, kind: weirv1.AuthKind_AUTH_KIND_OAUTH, baseURL: u.simURL,
		credential: claudeCodeJSON(a.Credential, a.RefreshToken, expires)})
	return acct
}

// simAccepts reports whether the simulator serves a message with token.
func (u *oauthEnv) simAccepts(token string) bool {
	u.t.Helper()
	req, err := http.NewRequestWithContext(u.t.Context(), http.MethodPost, u.simURL+"/v1/messages",
		strings.NewReader(`{"model":"claude-sonnet-4-5","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		u.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("anthropic-beta", oauthBeta)
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		u.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// tokenCalls is how many requests reached the simulator's token endpoint.
func (u *oauthEnv) tokenCalls() int {
	n := 0
	for _, a := range u.sim.Attempts() {
		if a.Path == upstream.AnthropicTokenPath {
			n++
		}
	}
	return n
}

func (u *oauthEnv) refreshDue() int {
	u.t.Helper()
	n, err := u.srv.acct.RefreshDue(u.t.Context())
	if err != nil {
		u.t.Fatalf("RefreshDue: %v", err)
	}
	return n
}

func TestCreateAccountOAuthJSON(t *testing.T) {
	t.Parallel()
	e := setup(t)
	access, refresh := oauthToken(), refreshToken()
	e.secrets.add(access)
	e.secrets.add(refresh)
	expires := epoch.Add(8 * time.Hour)
	for _, in := range []string{claudeCodeJSON(access, refresh, expires), oauthJSON(access, refresh, expires)} {
		resp, err := e.admin.accounts.CreateAccount(t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
			Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_OAUTH,
			Label: "max-" + randid.Hex(3), Credential: in,
		}))
		if err != nil {
			t.Fatalf("CreateAccount: %v", err)
		}
		a := resp.Msg.Account
		requireAbsent(t, "CreateAccount", resp.Msg, access)
		requireAbsent(t, "CreateAccount", resp.Msg, refresh)
		if a.CredentialHint != "sk-ant-oat01-…"+access[len(access)-4:] {
			t.Errorf("hint %q: want the access token's", a.CredentialHint)
		}
		row := e.accountRow(a.Id)
		if got, err := e.srv.seal.Open(row.ID, 1, row.CredentialSealed); err != nil || got != access {
			t.Errorf("credential_sealed does not open to the access token: %v", err)
		}
		if got, err := e.srv.seal.OpenRefresh(row.ID, 1, row.RefreshSealed); err != nil || got != refresh {
			t.Errorf("refresh_sealed does not open to the refresh token: %v", err)
		}
		// Distinct associated data: neither ciphertext opens as the other.
		if _, err := e.srv.seal.OpenRefresh(row.ID, 1, row.CredentialSealed); err == nil {
			t.Error("the access ciphertext opened as a refresh token")
		}
		if _, err := e.srv.seal.Open(row.ID, 1, row.RefreshSealed); err == nil {
			t.Error("the refresh ciphertext opened as an access token")
		}
		if !sameTime(row.AccessExpiresAt, &expires) {
			t.Errorf("access_expires_at %v, want %v", row.AccessExpiresAt, expires)
		}
		// The next form of the same login would be a duplicate.
		if _, err := e.admin.accounts.DeleteAccount(t.Context(), connect.NewRequest(&weirv1.DeleteAccountRequest{Id: a.Id})); err != nil {
			t.Fatal(err)
		}
	}

	for _, tc := range []struct {
		kind weirv1.AuthKind
		in   string
		want string
	}{
		{weirv1.AuthKind_AUTH_KIND_OAUTH, `{"claudeAiOauth":{"accessToken":"` + access + `"`, "credential: not valid JSON"},
		{weirv1.AuthKind_AUTH_KIND_OAUTH, `{"claudeAiOauth":{"refreshToken":"` + refresh + `","expiresAt":1}}`, "claudeAiOauth.accessToken: required"},
		{weirv1.AuthKind_AUTH_KIND_API_KEY, oauthJSON(access, refresh, expires), "for oauth accounts only"},
	} {
		_, err := e.admin.accounts.CreateAccount(t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
			Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: tc.kind, Label: "bad-" + randid.Hex(3), Credential: tc.in,
		}))
		ce := wantCode(t, err, connect.CodeInvalidArgument)
		if !strings.Contains(ce.Message(), tc.want) {
			t.Errorf("message %q, want %q", ce.Message(), tc.want)
		}
	}

	// A new credential replaces the refresh half too, under the new revision;
	// a bare access token leaves the account without one.
	a, _ := e.createAccount(acct{kind: weirv1.AuthKind_AUTH_KIND_OAUTH, credential: oauthToken()})
	if row := e.accountRow(a.Id); row.RefreshSealed != nil || row.AccessExpiresAt != nil {
		t.Fatal("a bare access token got a refresh token or an expiry")
	}
	access2, refresh2 := oauthToken(), refreshToken()
	e.secrets.add(access2)
	e.secrets.add(refresh2)
	update := func(cred string) {
		t.Helper()
		if _, err := e.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
			Id: a.Id, Credential: cred, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credential"}},
		})); err != nil {
			t.Fatalf("UpdateAccount: %v", err)
		}
	}
	update(oauthJSON(access2, refresh2, expires))
	row := e.accountRow(a.Id)
	if got, err := e.srv.seal.OpenRefresh(row.ID, 2, row.RefreshSealed); err != nil || got != refresh2 || row.CredentialRevision != 2 {
		t.Fatalf("after the update: revision %d, refresh opens: %v", row.CredentialRevision, err)
	}
	update(oauthToken())
	if row := e.accountRow(a.Id); row.RefreshSealed != nil || row.AccessExpiresAt != nil || row.CredentialRevision != 3 {
		t.Fatal("a bare access token kept the old refresh token")
	}
}

// A credential expiring within 10 minutes is refreshed: new access and
// refresh tokens and expiry, the next revision, a new usage epoch; a lease
// taken after carries the new access token, which the provider accepts.
func TestTokenRefresh(t *testing.T) {
	t.Parallel()
	sa, later := refreshable("max"), refreshable("later")
	u := newOAuthEnv(t, sa, later)
	a := u.addOAuth(sa, epoch.Add(9*time.Minute))
	u.addOAuth(later, epoch.Add(11*time.Minute))
	before := u.accountRow(a.Id)
	epochBefore, err := u.q.GetUsagePoll(t.Context(), before.ID)
	if err != nil {
		t.Fatal(err)
	}

	if n := u.refreshDue(); n != 1 {
		t.Fatalf("refreshed %d accounts, want 1 (the other expires in 11 minutes)", n)
	}
	if got := u.sim.TokenRefreshes("max"); got != 1 {
		t.Fatalf("%d refresh calls for max, want 1", got)
	}
	if got := u.sim.TokenRefreshes("later"); got != 0 {
		t.Fatalf("%d refresh calls for later, want 0", got)
	}
	row := u.accountRow(a.Id)
	if row.CredentialRevision != 2 || row.RefreshingUntil != nil || row.RefreshFailures != 0 {
		t.Fatalf("after the refresh: revision %d, refreshing until %v, failures %d", row.CredentialRevision, row.RefreshingUntil, row.RefreshFailures)
	}
	if want := epoch.Add(8 * time.Hour); !sameTime(row.AccessExpiresAt, &want) {
		t.Errorf("access_expires_at %v, want %v (expires_in)", row.AccessExpiresAt, want)
	}
	access, err := u.srv.seal.Open(row.ID, 2, row.CredentialSealed)
	if err != nil || access == sa.Credential {
		t.Fatalf("new access token: %v (unchanged: %v)", err, access == sa.Credential)
	}
	refresh, err := u.srv.seal.OpenRefresh(row.ID, 2, row.RefreshSealed)
	if err != nil || refresh == sa.RefreshToken {
		t.Fatalf("new refresh token: %v (unchanged: %v)", err, refresh == sa.RefreshToken)
	}
	if row.CredentialHint != seal.Hint(access) {
		t.Errorf("hint %q is not the new token's", row.CredentialHint)
	}
	if p, err := u.q.GetUsagePoll(t.Context(), row.ID); err != nil || p.Epoch != epochBefore.Epoch+1 || p.CredentialRevision != 2 {
		t.Errorf("usage poll after the refresh: %+v, %v; want epoch %d at revision 2", p, err, epochBefore.Epoch+1)
	}
	if got := u.getAccount(a.Id); got.CredentialRevision != 2 || got.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE {
		t.Errorf("account: revision %d, state %v", got.CredentialRevision, got.State)
	}

	// Not due again: nothing happens.
	if n := u.refreshDue(); n != 0 || u.sim.TokenRefreshes("max") != 1 {
		t.Fatalf("a second run refreshed %d (%d calls)", n, u.sim.TokenRefreshes("max"))
	}

	_, keyHash := u.createKey("")
	lease := u.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: "claude-sonnet-4-5", PreferAccountId: a.Id})
	if lease.AccountId != a.Id {
		t.Fatalf("leased %s, want %s", lease.AccountLabel, a.Label)
	}
	if lease.Credential != access {
		t.Fatal("the lease does not carry the refreshed access token")
	}
	if !u.simAccepts(lease.Credential) {
		t.Fatal("the simulator rejects the refreshed access token")
	}
	// The replaced access token stops working after its grace.
	u.clock.Advance(2 * time.Minute)
	if u.simAccepts(sa.Credential) {
		t.Error("the old access token still works after the refresh grace")
	}
	if !strings.Contains(u.logs.String(), "oauth token refreshed") {
		t.Errorf("no refresh logged:\n%s", u.logs.String())
	}
	// The cleanup in newEnv proves no token (old, new, access or refresh)
	// reached the log.
}

// Two control-plane replicas over one database, both running the refresher
// at once (several times each), with one expiring token: exactly one call
// reaches the token endpoint, and both replicas see the new revision.
func TestTokenRefreshSingleFlightAcrossReplicas(t *testing.T) {
	t.Parallel()
	sa := refreshable("max")
	u := newOAuthEnv(t, sa)
	a := u.addOAuth(sa, epoch.Add(time.Minute))
	r := u.replica()

	var (
		start     = make(chan struct{})
		wg        sync.WaitGroup
		refreshed atomic.Int32
	)
	for i := range 8 {
		srv := u.srv
		if i%2 == 1 {
			srv = r.srv
		}
		wg.Go(func() {
			<-start
			n, err := srv.acct.RefreshDue(t.Context())
			if err != nil {
				t.Errorf("RefreshDue: %v", err)
			}
			refreshed.Add(int32(n))
		})
	}
	close(start)
	wg.Wait()
	if got := u.sim.TokenRefreshes("max"); got != 1 {
		t.Fatalf("%d refresh calls reached the token endpoint, want exactly 1", got)
	}
	if got := refreshed.Load(); got != 1 {
		t.Fatalf("%d refreshes reported, want 1", got)
	}
	for _, e := range []*env{u.env, r} {
		got := e.getAccount(a.Id)
		if got.CredentialRevision != 2 || got.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE {
			t.Fatalf("replica sees revision %d, state %v (%s); want 2, active", got.CredentialRevision, got.State, got.BrokenReason)
		}
	}
	// The token the winner stored works.
	row := u.accountRow(a.Id)
	access, err := r.srv.seal.Open(row.ID, row.CredentialRevision, row.CredentialSealed)
	if err != nil || !u.simAccepts(access) {
		t.Fatalf("the stored token: %v", err)
	}
}

// A refresh token the token endpoint rejects breaks the account with the
// reason, and it is not tried again.
func TestTokenRefreshRejected(t *testing.T) {
	t.Parallel()
	sa := refreshable("max")
	u := newOAuthEnv(t, sa)
	stale := sa
	stale.RefreshToken = refreshToken() // unknown to the provider
	a := u.addOAuth(stale, epoch.Add(-time.Minute))

	if n := u.refreshDue(); n != 0 {
		t.Fatalf("refreshed %d", n)
	}
	got := u.getAccount(a.Id)
	if got.State != weirv1.AccountState_ACCOUNT_STATE_BROKEN || got.BrokenReason != "refresh token rejected by the provider: invalid_grant" {
		t.Fatalf("state %v, reason %q", got.State, got.BrokenReason)
	}
	if got.CredentialRevision != 1 {
		t.Errorf("revision %d, want 1", got.CredentialRevision)
	}
	u.clock.Advance(time.Hour)
	if n := u.refreshDue(); n != 0 || u.tokenCalls() != 1 {
		t.Fatalf("a broken account was refreshed again: %d, %d calls", n, u.tokenCalls())
	}
	if !strings.Contains(u.logs.String(), "refresh token rejected by the provider: invalid_grant") {
		t.Errorf("the rejection is not logged:\n%s", u.logs.String())
	}
}

// A token endpoint that fails transiently is retried on a later run, with
// a bounded backoff, and the account stays in service.
func TestTokenRefreshTransientBackoff(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == upstream.AnthropicTokenPath { // not the profile read at create
			calls.Add(1)
		}
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":"temporarily_unavailable","error_description":"try later"}`))
	}))
	t.Cleanup(failing.Close)
	e := setup(t)
	access, refresh := oauthToken(), refreshToken()
	e.secrets.add(access)
	e.secrets.add(refresh)
	a, _ := e.createAccount(acct{kind: weirv1.AuthKind_AUTH_KIND_OAUTH, baseURL: failing.URL,
		credential: oauthJSON(access, refresh, epoch.Add(5*time.Minute))})

	run := func() {
		t.Helper()
		if n, err := e.srv.acct.RefreshDue(t.Context()); n != 0 || err != nil {
			t.Fatalf("RefreshDue: %d, %v", n, err)
		}
	}
	run()
	row := e.accountRow(a.Id)
	if calls.Load() != 1 || row.RefreshFailures != 1 || !sameTime(row.RefreshBlockedUntil, tm(epoch.Add(30*time.Second))) || row.RefreshingUntil != nil {
		t.Fatalf("after a failure: %d calls, failures %d, blocked until %v, refreshing until %v",
			calls.Load(), row.RefreshFailures, row.RefreshBlockedUntil, row.RefreshingUntil)
	}
	run() // within the backoff
	if calls.Load() != 1 {
		t.Fatalf("%d calls within the backoff", calls.Load())
	}
	e.clock.Advance(30 * time.Second)
	run()
	row = e.accountRow(a.Id)
	if calls.Load() != 2 || row.RefreshFailures != 2 || !sameTime(row.RefreshBlockedUntil, tm(e.clock.Now().Add(time.Minute))) {
		t.Fatalf("after a second failure: %d calls, failures %d, blocked until %v", calls.Load(), row.RefreshFailures, row.RefreshBlockedUntil)
	}
	if got := e.getAccount(a.Id); got.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE || got.CredentialRevision != 1 {
		t.Fatalf("state %v, revision %d", got.State, got.CredentialRevision)
	}
	if !strings.Contains(e.logs.String(), "token endpoint answered 503 (temporarily_unavailable)") {
		t.Errorf("log:\n%s", e.logs.String())
	}
	for f, want := range map[int32]time.Duration{1: 30 * time.Second, 2: time.Minute, 3: 2 * time.Minute, 6: 10 * time.Minute, 40: 10 * time.Minute} {
		if got := refreshBackoff(f); got != want {
			t.Errorf("refreshBackoff(%d) = %v, want %v", f, got, want)
		}
	}
}

// A refresh whose answer lands after an operator replaced the credential
// does not overwrite it.
func TestTokenRefreshLosesToANewCredential(t *testing.T) {
	t.Parallel()
	sa := refreshable("max")
	u := newOAuthEnv(t, sa)
	a := u.addOAuth(sa, epoch.Add(time.Minute))
	replacement := oauthToken()
	u.secrets.add(replacement)
	u.srv.acct.cfg.OAuthClient = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		// The operator's update lands while the refresh is in flight.
		if _, err := u.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
			Id: a.Id, Credential: replacement, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"credential"}},
		})); err != nil {
			t.Errorf("UpdateAccount: %v", err)
		}
		return secretsTransport{u}.RoundTrip(r)
	})}
	if n := u.refreshDue(); n != 0 {
		t.Fatalf("refreshed %d", n)
	}
	row := u.accountRow(a.Id)
	got, err := u.srv.seal.Open(row.ID, row.CredentialRevision, row.CredentialSealed)
	if err != nil || got != replacement || row.CredentialRevision != 2 || row.RefreshSealed != nil {
		t.Fatalf("revision %d: the operator's credential was overwritten (%v)", row.CredentialRevision, err)
	}
	if !strings.Contains(u.logs.String(), "refreshed token dropped") {
		t.Errorf("log:\n%s", u.logs.String())
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// An account broken by its expired access token's 401s (the refresh came
// too late: no replica ran) is refreshed once its token has expired, and
// the refresh mends it. One broken by a rejected refresh token is not.
func TestTokenRefreshMendsAnExpiredAccount(t *testing.T) {
	t.Parallel()
	sa := refreshable("max")
	u := newOAuthEnv(t, sa)
	a := u.addOAuth(sa, epoch.Add(time.Minute))
	if _, err := u.pool.Exec(t.Context(), `UPDATE accounts SET broken_at = $2, broken_reason = 'credential rejected by the upstream (401 authentication_error: OAuth token has expired)', auth_failures = 3 WHERE id = $1`,
		uuid.MustParse(a.Id), epoch); err != nil {
		t.Fatal(err)
	}
	// Broken, and its token has not expired yet: left alone.
	if n := u.refreshDue(); n != 0 || u.tokenCalls() != 0 {
		t.Fatalf("refreshed %d before the token expired", n)
	}
	u.clock.Advance(time.Minute)
	if n := u.refreshDue(); n != 1 {
		t.Fatalf("refreshed %d, want 1", n)
	}
	got := u.getAccount(a.Id)
	if got.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE || got.CredentialRevision != 2 || got.BrokenReason != "" {
		t.Fatalf("state %v, revision %d, reason %q", got.State, got.CredentialRevision, got.BrokenReason)
	}
	if row := u.accountRow(a.Id); row.AuthFailures != 0 {
		t.Errorf("auth failures %d after the refresh", row.AuthFailures)
	}
}

// A token answer without a refresh token keeps the old one; the client id
// and grant go out as configured.
func TestTokenRefreshKeepsTheRefreshTokenWhenNoneComesBack(t *testing.T) {
	t.Parallel()
	next := oauthToken()
	var got map[string]string
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != upstream.AnthropicTokenPath || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		json.NewDecoder(r.Body).Decode(&got) //nolint:errcheck // checked through got
		w.Header().Set("content-type", "application/json")
		fmt.Fprintf(w, `{"access_token":%q,"expires_in":3600,"token_type":"Bearer"}`, next)
	}))
	t.Cleanup(endpoint.Close)
	e := setup(t)
	e.secrets.add(next)
	access, refresh := oauthToken(), refreshToken()
	e.secrets.add(access)
	e.secrets.add(refresh)
	a, _ := e.createAccount(acct{kind: weirv1.AuthKind_AUTH_KIND_OAUTH, baseURL: endpoint.URL,
		credential: oauthJSON(access, refresh, epoch.Add(-time.Second))})
	if n, err := e.srv.acct.RefreshDue(t.Context()); n != 1 || err != nil {
		t.Fatalf("RefreshDue: %d, %v", n, err)
	}
	if got["grant_type"] != "refresh_token" || got["refresh_token"] != refresh || got["client_id"] != upstream.AnthropicClientID {
		t.Errorf("token request grant %q, client %q, refresh token sent: %v", got["grant_type"], got["client_id"], got["refresh_token"] == refresh)
	}
	row := e.accountRow(a.Id)
	if r, err := e.srv.seal.OpenRefresh(row.ID, 2, row.RefreshSealed); err != nil || r != refresh {
		t.Fatalf("the refresh token was not kept: %v", err)
	}
	if c, err := e.srv.seal.Open(row.ID, 2, row.CredentialSealed); err != nil || c != next {
		t.Fatalf("the new access token was not stored: %v", err)
	}
	if want := epoch.Add(time.Hour); !sameTime(row.AccessExpiresAt, &want) {
		t.Errorf("expires %v, want %v", row.AccessExpiresAt, want)
	}
	if u := (&AccountJobs{cfg: Config{OAuthTokenURL: upstream.AnthropicTokenURL}}); u.tokenURL(row) != endpoint.URL+upstream.AnthropicTokenPath {
		t.Errorf("token URL %q for an account with a base URL", u.tokenURL(row))
	} else if row.BaseUrl = ""; u.tokenURL(row) != "https://platform.claude.com/v1/oauth/token" {
		t.Errorf("default token URL %q", u.tokenURL(row))
	}
}

// With jobs on, River runs the refresher on start.
func TestTokenRefreshRunsUnderRiver(t *testing.T) {
	t.Parallel()
	sa := refreshable("max")
	u := &oauthEnv{}
	called := make(chan struct{}, 1)
	clock := newClock()
	cfg := testConfig(clock)
	cfg.DisableJobs = false
	cfg.OAuthClient = &http.Client{Timeout: 10 * time.Second, Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := secretsTransport{u}.RoundTrip(r)
		select {
		case called <- struct{}{}:
		default:
		}
		return resp, err
	})}
	u.env = newEnv(t, pgtest.NewPool(t), cfg, clock)
	u.sim = sim.New(sim.Config{Now: clock.Now, Script: sim.Script{Accounts: []sim.AccountScript{sa}}})
	ts := httptest.NewServer(u.sim)
	t.Cleanup(ts.Close)
	u.simURL = ts.URL
	a := u.addOAuth(sa, epoch.Add(time.Minute))
	if err := u.srv.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-called:
	case <-time.After(30 * time.Second):
		t.Fatal("River did not run the token refresher within 30s")
	}
	// Stop waits for the running refresh to finish.
	if err := u.srv.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := u.getAccount(a.Id); got.CredentialRevision != 2 || u.sim.TokenRefreshes("max") != 1 {
		t.Fatalf("after the job: revision %d, %d refresh calls", got.CredentialRevision, u.sim.TokenRefreshes("max"))
	}
}

func TestOAuthConfig(t *testing.T) {
	t.Parallel()
	cfg := testConfig(newClock())
	cfg.OAuthTokenURL = "ftp://platform.example/token"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "WEIR_OAUTH_TOKEN_URL") {
		t.Errorf("Validate with a bad token URL: %v", err)
	}
	cfg = testConfig(newClock())
	cfg.setDefaults()
	if cfg.OAuthTokenURL != "https://platform.claude.com/v1/oauth/token" || cfg.OAuthClientID != "9d1c250a-e61b-44d9-88ed-5944d1962f5e" || cfg.OAuthClient == nil {
		t.Errorf("defaults: %q %q %v", cfg.OAuthTokenURL, cfg.OAuthClientID, cfg.OAuthClient)
	}
}
