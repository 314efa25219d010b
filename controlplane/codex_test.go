package controlplane

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/weirhq/weir/controlplane/upstream"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/sim"
)

// testJWT is a JWT-shaped token with claims and a random signature, as
// OpenAI's auth server hands them out (weir never verifies them).
func testJWT(claims map[string]any) string {
	enc := base64.RawURLEncoding
	payload, _ := json.Marshal(claims)
	return enc.EncodeToString([]byte(`{"alg":"RS256","typ":"JWT"}`)) + "." + enc.EncodeToString(payload) + "." + randid.Hex(32)
}

// codexAccess is a ChatGPT access token for accountID ("" for none) that
// expires at exp (zero for no exp claim).
func codexAccess(accountID string, exp time.Time) string {
	claims := map[string]any{"iss": "https://auth.openai.com", "jti": randid.Hex(8)}
	if !exp.IsZero() {
		claims["exp"] = exp.Unix()
	}
	if accountID != "" {
		claims["https://api.openai.com/auth"] = map[string]any{"chatgpt_account_id": accountID, "chatgpt_plan_type": "plus"}
	}
	return testJWT(claims)
}

func codexRefresh() string { return "rt_" + randid.Hex(32) }

func uuidOf(t *testing.T, id string) uuid.UUID {
	t.Helper()
	u, err := uuid.Parse(id)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// codexAuthJSON is Codex CLI's ~/.codex/auth.json; accountID "" leaves
// tokens.account_id out.
func codexAuthJSON(idToken, access, refresh, accountID string) string {
	tokens := map[string]any{"id_token": idToken, "access_token": access, "refresh_token": refresh}
	if accountID != "" {
		tokens["account_id"] = accountID
	}
	b, _ := json.MarshalIndent(map[string]any{"OPENAI_API_KEY": nil, "tokens": tokens, "last_refresh": "2030-03-04T05:00:00Z"}, "", "  ")
	return string(b)
}

func TestParseCodexCredential(t *testing.T) {
	t.Parallel()
	exp := epoch.Add(10 * 24 * time.Hour)
	refresh := codexRefresh()
	withClaim := codexAccess("acct-from-access", exp)
	noClaim := codexAccess("", exp)
	idToken := testJWT(map[string]any{"https://api.openai.com/auth": map[string]any{"chatgpt_account_id": "acct-from-id"}})
	codex, oauth := weirv1.Provider_PROVIDER_CODEX, weirv1.AuthKind_AUTH_KIND_OAUTH
	for _, tc := range []struct {
		name     string
		provider weirv1.Provider
		in       string
		want     credentialInput
		wantErr  string
	}{
		{name: "auth.json with account_id", provider: codex, in: codexAuthJSON(idToken, withClaim, refresh, "acct-from-file"),
			want: credentialInput{withClaim, refresh, &exp, "acct-from-file"}},
		{name: "auth.json, id token claim", provider: codex, in: codexAuthJSON(idToken, withClaim, refresh, ""),
			want: credentialInput{withClaim, refresh, &exp, "acct-from-id"}},
		{name: "auth.json, access token claim", provider: codex, in: codexAuthJSON("", withClaim, refresh, ""),
			want: credentialInput{withClaim, refresh, &exp, "acct-from-access"}},
		{name: "auth.json, no account id anywhere", provider: codex, in: codexAuthJSON("", noClaim, refresh, ""),
			want: credentialInput{noClaim, refresh, &exp, ""}},
		{name: "auth.json, access token not a JWT: expiry unknown", provider: codex, in: codexAuthJSON("", "opaque-access-token", refresh, "a1"),
			want: credentialInput{"opaque-access-token", refresh, nil, "a1"}},
		{name: "bare access token", provider: codex, in: withClaim, want: credentialInput{access: withClaim, expiresAt: &exp, accountID: "acct-from-access"}},
		{name: "flat JSON takes the expiry from the JWT", provider: codex, in: fmt.Sprintf(`{"access_token":%q,"refresh_token":%q}`, withClaim, refresh),
			want: credentialInput{withClaim, refresh, &exp, "acct-from-access"}},
		{name: "auth.json for an anthropic account", provider: weirv1.Provider_PROVIDER_ANTHROPIC, in: codexAuthJSON(idToken, withClaim, refresh, "a1"),
			wantErr: "credential: Codex's auth.json is for codex accounts only"},
		{name: "auth.json without an access token", provider: codex, in: `{"tokens":{"refresh_token":"` + refresh + `"}}`,
			wantErr: "credential: tokens.access_token: required"},
		{name: "auth.json with a bad refresh token", provider: codex, in: codexAuthJSON("", withClaim, "a b", ""),
			wantErr: "credential: tokens.refresh_token: 8 to 8192"},
		{name: "auth.json with a bad account id", provider: codex, in: codexAuthJSON("", withClaim, refresh, "a b"),
			wantErr: "credential: tokens.account_id: 1 to 256"},
		{name: "auth.json tokens not an object", provider: codex, in: `{"tokens":"` + refresh + `"}`,
			wantErr: "credential: tokens: must be a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseCredential(tc.provider, oauth, tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				for _, s := range []string{withClaim, refresh} {
					if strings.Contains(err.Error(), s) {
						t.Fatal("the error quotes a token")
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.access != tc.want.access || got.refresh != tc.want.refresh || !sameTime(got.expiresAt, tc.want.expiresAt) || got.accountID != tc.want.accountID {
				t.Fatalf("got %q %q %v %q, want %q %q %v %q", got.access, got.refresh, got.expiresAt, got.accountID,
					tc.want.access, tc.want.refresh, tc.want.expiresAt, tc.want.accountID)
			}
		})
	}
}

// Each provider takes the auth kinds it can serve; anything else names
// the allowed combinations. Provider and upstream account id come back
// from every read.
func TestCreateAccountProviders(t *testing.T) {
	t.Parallel()
	e := setup(t)
	anthropic, openai, codex := weirv1.Provider_PROVIDER_ANTHROPIC, weirv1.Provider_PROVIDER_OPENAI, weirv1.Provider_PROVIDER_CODEX
	apiKind, oauth := weirv1.AuthKind_AUTH_KIND_API_KEY, weirv1.AuthKind_AUTH_KIND_OAUTH
	codexToken := codexAccess("chatgpt-acct-1", epoch.Add(time.Hour))
	e.secrets.add(codexToken)
	for _, tc := range []struct {
		provider weirv1.Provider
		kind     weirv1.AuthKind
		cred     string
		wantErr  string // a prefix of the message
	}{
		{anthropic, apiKind, apiKey(), ""},
		{anthropic, oauth, oauthToken(), ""},
		{openai, apiKind, "sk-proj-" + randid.Hex(24), ""},
		{codex, oauth, codexToken, ""},
		{openai, oauth, "sk-proj-" + randid.Hex(24), "auth_kind: not valid for a openai account"},
		{codex, apiKind, "sk-proj-" + randid.Hex(24), "auth_kind: not valid for a codex account"},
		{anthropic, weirv1.AuthKind_AUTH_KIND_UNSPECIFIED, apiKey(), "auth_kind:"},
		{weirv1.Provider_PROVIDER_UNSPECIFIED, apiKind, apiKey(), "provider: must be anthropic, openai or codex"},
		{99, apiKind, apiKey(), "provider:"},
	} {
		e.secrets.add(tc.cred)
		label := fmt.Sprintf("%d-%d-%s", tc.provider, tc.kind, randid.Hex(2))
		resp, err := e.admin.accounts.CreateAccount(t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
			Provider: tc.provider, AuthKind: tc.kind, Label: label, Credential: tc.cred,
		}))
		if tc.wantErr != "" {
			ce := wantCode(t, err, connect.CodeInvalidArgument)
			if !strings.HasPrefix(ce.Message(), tc.wantErr) || !strings.Contains(ce.Message(), "anthropic with api_key or oauth, openai with api_key, or codex with oauth") {
				t.Errorf("%s: message %q, want %q and the allowed combinations", label, ce.Message(), tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		a := resp.Msg.Account
		if a.Provider != tc.provider || a.AuthKind != tc.kind {
			t.Errorf("%s: provider/kind %v/%v", label, a.Provider, a.AuthKind)
		}
		if row := e.accountRow(a.Id); row.Provider != enumName(tc.provider) {
			t.Errorf("%s: stored provider %q", label, row.Provider)
		}
	}
	list, err := e.admin.accounts.ListAccounts(t.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Msg.Accounts) != 4 {
		t.Fatalf("%d accounts, want 4", len(list.Msg.Accounts))
	}
	for _, a := range list.Msg.Accounts {
		want := ""
		if a.Provider == codex {
			want = "chatgpt-acct-1"
		}
		if a.UpstreamAccountId != want {
			t.Errorf("list %s: upstream account id %q, want %q", a.Label, a.UpstreamAccountId, want)
		}
		if got := e.getAccount(a.Id); got.Provider != a.Provider || got.UpstreamAccountId != want {
			t.Errorf("get %s: %v %q", a.Label, got.Provider, got.UpstreamAccountId)
		}
	}
}

// A Codex account is created from auth.json with its ChatGPT account id,
// or the operator's; without one anywhere it is refused. A new auth.json
// carries its account id along; the update mask sets it too.
func TestCreateCodexAccount(t *testing.T) {
	t.Parallel()
	e := setup(t)
	exp := epoch.Add(10 * 24 * time.Hour)
	access, refresh := codexAccess("", exp), codexRefresh()
	e.secrets.add(access)
	e.secrets.add(refresh)
	create := func(label, cred, upstream string) (*weirv1.Account, error) {
		resp, err := e.admin.accounts.CreateAccount(t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
			Provider: weirv1.Provider_PROVIDER_CODEX, AuthKind: weirv1.AuthKind_AUTH_KIND_OAUTH,
			Label: label, Credential: cred, UpstreamAccountId: upstream,
		}))
		if err != nil {
			return nil, err
		}
		requireAbsent(t, "CreateAccount", resp.Msg, access)
		requireAbsent(t, "CreateAccount", resp.Msg, refresh)
		return resp.Msg.Account, nil
	}

	a, err := create("codex", codexAuthJSON("", access, refresh, "from-auth-json"), "")
	if err != nil {
		t.Fatal(err)
	}
	row := e.accountRow(a.Id)
	if a.UpstreamAccountId != "from-auth-json" || row.UpstreamAccountID != "from-auth-json" {
		t.Errorf("upstream account id %q / %q", a.UpstreamAccountId, row.UpstreamAccountID)
	}
	if !sameTime(row.AccessExpiresAt, &exp) {
		t.Errorf("access_expires_at %v, want the JWT's exp %v", row.AccessExpiresAt, exp)
	}
	if got, err := e.srv.seal.OpenRefresh(row.ID, 1, row.RefreshSealed); err != nil || got != refresh {
		t.Errorf("refresh_sealed does not open to the refresh token: %v", err)
	}
	if got, err := e.srv.seal.Open(row.ID, 1, row.CredentialSealed); err != nil || got != access {
		t.Errorf("credential_sealed does not open to the access token: %v", err)
	}

	// The operator's id wins over the file's.
	b, err := create("codex-named", codexAuthJSON("", access, refresh, "from-auth-json"), "from-operator")
	if err != nil || b.UpstreamAccountId != "from-operator" {
		t.Fatalf("with --upstream-account-id: %v %v", b, err)
	}

	// No account id anywhere.
	_, err = create("codex-anon", codexAuthJSON("", access, refresh, ""), "")
	ce := wantCode(t, err, connect.CodeInvalidArgument)
	if !strings.Contains(ce.Message(), "codex accounts need the ChatGPT account id: pass --upstream-account-id or the auth.json that holds it") {
		t.Errorf("message %q", ce.Message())
	}
	_, err = create("codex-bad-id", access, "has space")
	wantCode(t, err, connect.CodeInvalidArgument)

	update := func(paths []string, cred, upstream string) (*weirv1.Account, error) {
		resp, err := e.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
			Id: a.Id, Credential: cred, UpstreamAccountId: upstream, UpdateMask: &fieldmaskpb.FieldMask{Paths: paths},
		}))
		if err != nil {
			return nil, err
		}
		return resp.Msg.Account, nil
	}
	// A new auth.json of another ChatGPT account moves the account id along.
	access2, refresh2 := codexAccess("claimed-id", exp.Add(time.Hour)), codexRefresh()
	e.secrets.add(access2)
	e.secrets.add(refresh2)
	got, err := update([]string{"credential"}, codexAuthJSON("", access2, refresh2, ""), "")
	if err != nil {
		t.Fatal(err)
	}
	if got.UpstreamAccountId != "claimed-id" || got.CredentialRevision != 2 {
		t.Errorf("after a new auth.json: id %q revision %d", got.UpstreamAccountId, got.CredentialRevision)
	}
	// The mask path sets it; a codex account cannot lose it.
	if got, err = update([]string{"upstream_account_id"}, "", "set-by-operator"); err != nil || got.UpstreamAccountId != "set-by-operator" {
		t.Fatalf("update upstream_account_id: %v %v", got, err)
	}
	_, err = update([]string{"upstream_account_id"}, "", "")
	wantCode(t, err, connect.CodeInvalidArgument)
	// Both at once: the request's id wins over the credential's.
	if got, err = update([]string{"credential", "upstream_account_id"}, codexAuthJSON("", access2, refresh2, ""), "explicit"); err != nil || got.UpstreamAccountId != "explicit" {
		t.Fatalf("credential and upstream_account_id: %v %v", got, err)
	}
	// A credential without an id keeps the stored one.
	bare := codexAccess("", exp)
	e.secrets.add(bare)
	if got, err = update([]string{"credential"}, bare, ""); err != nil || got.UpstreamAccountId != "explicit" {
		t.Fatalf("a bare token: %v %v", got, err)
	}
}

// codexEnv is a control plane and a simulator whose chatgpt accounts it
// serves as Codex accounts, at {sim}/backend-api.
type codexEnv struct {
	*oauthEnv
}

func newCodexEnv(t *testing.T, accounts ...sim.AccountScript) *codexEnv {
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
	return &codexEnv{u}
}

// chatgptAccount is a simulator ChatGPT login whose access token names
// its account id, at 25% of its five-hour window and 62.5% of its week.
func chatgptAccount(name string) sim.AccountScript {
	return sim.AccountScript{
		Name: name, Kind: sim.KindChatGPT, Credential: codexAccess(name+"-id", epoch.Add(10*24*time.Hour)),
		RefreshToken: codexRefresh(), FiveHourUtilization: 0.25, SevenDayUtilization: 0.625,
	}
}

// addCodex creates the weir account for a from its auth.json, its access
// token expiring at expires (the JWT's exp is the simulator's; weir reads
// the one it is told).
func (c *codexEnv) addCodex(a sim.AccountScript) *weirv1.Account {
	c.t.Helper()
	c.secrets.add(a.Credential)
	c.secrets.add(a.RefreshToken)
	resp, err := c.admin.accounts.CreateAccount(c.t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider: weirv1.Provider_PROVIDER_CODEX, AuthKind: weirv1.AuthKind_AUTH_KIND_OAUTH, Label: a.Name,
		Credential: codexAuthJSON("", a.Credential, a.RefreshToken, ""), BaseUrl: c.simURL + "/backend-api",
	}))
	if err != nil {
		c.t.Fatalf("CreateAccount %s: %v", a.Name, err)
	}
	return resp.Msg.Account
}

// A Codex credential near its expiry is refreshed at the OpenAI token
// endpoint (the simulator's /oauth/token under the base URL's host); the
// new access token's exp is the expiry, and the simulator accepts it.
func TestCodexTokenRefresh(t *testing.T) {
	t.Parallel()
	sa := chatgptAccount("codex")
	sa.Credential = codexAccess("codex-id", epoch.Add(5*time.Minute))
	c := newCodexEnv(t, sa)
	a := c.addCodex(sa)
	if n := c.refreshDue(); n != 1 {
		t.Fatalf("RefreshDue refreshed %d, want 1", n)
	}
	if n := c.sim.TokenRefreshes("codex"); n != 1 {
		t.Fatalf("%d refreshes reached the simulator, want 1", n)
	}
	row := c.accountRow(a.Id)
	access, err := c.srv.seal.Open(row.ID, 2, row.CredentialSealed)
	if err != nil || access == sa.Credential {
		t.Fatalf("revision %d: new access token stored: %v", row.CredentialRevision, err)
	}
	claims, ok := parseJWTClaims(access)
	if !ok || claims.expiresAt == nil || !sameTime(row.AccessExpiresAt, claims.expiresAt) || !row.AccessExpiresAt.After(epoch) {
		t.Errorf("access_expires_at %v, want the new token's exp %v", row.AccessExpiresAt, claims.expiresAt)
	}
	if refresh, err := c.srv.seal.OpenRefresh(row.ID, 2, row.RefreshSealed); err != nil || refresh == sa.RefreshToken {
		t.Errorf("the rotated refresh token was not stored: %v", err)
	}
	// The new token reads the account's usage (the simulator checks it and
	// the chatgpt-account-id).
	c.clock.Advance(time.Minute)
	if res := c.refreshUsage(a.Id); !res.Read || res.Error != "" {
		t.Fatalf("usage read with the refreshed token: %+v", res)
	}
	// Nothing more is due.
	if n := c.refreshDue(); n != 0 {
		t.Errorf("a second run refreshed %d", n)
	}
}

// The Codex refresh request is Codex CLI's: JSON with its client id,
// grant, refresh token and scope, at {scheme://host}/oauth/token; an
// answer without expires_in takes the expiry from the access token.
func TestCodexTokenRefreshRequest(t *testing.T) {
	t.Parallel()
	exp := epoch.Add(3 * time.Hour)
	next, nextRefresh := codexAccess("codex-id", exp), codexRefresh()
	var got map[string]string
	var path, contentType string
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path, contentType = r.URL.Path, r.Header.Get("Content-Type")
		json.NewDecoder(r.Body).Decode(&got) //nolint:errcheck // checked through got
		w.Header().Set("content-type", "application/json")
		fmt.Fprintf(w, `{"id_token":%q,"access_token":%q,"refresh_token":%q}`, testJWT(map[string]any{"sub": "x"}), next, nextRefresh)
	}))
	t.Cleanup(endpoint.Close)
	e := setup(t)
	access, refresh := codexAccess("codex-id", epoch.Add(-time.Second)), codexRefresh()
	for _, s := range []string{next, nextRefresh, access, refresh} {
		e.secrets.add(s)
	}
	resp, err := e.admin.accounts.CreateAccount(t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider: weirv1.Provider_PROVIDER_CODEX, AuthKind: weirv1.AuthKind_AUTH_KIND_OAUTH, Label: "codex",
		Credential: codexAuthJSON("", access, refresh, ""), BaseUrl: endpoint.URL + "/backend-api",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := e.srv.acct.RefreshDue(t.Context()); n != 1 || err != nil {
		t.Fatalf("RefreshDue: %d, %v", n, err)
	}
	want := map[string]string{"client_id": upstream.CodexClientID, "grant_type": "refresh_token", "refresh_token": refresh, "scope": "openid profile email"}
	if path != "/oauth/token" || contentType != "application/json" || len(got) != len(want) {
		t.Errorf("token request to %q (%s) with %d fields", path, contentType, len(got))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("token request %s: sent %v", k, got[k] == refresh)
		}
	}
	row := e.accountRow(resp.Msg.Account.Id)
	if !sameTime(row.AccessExpiresAt, &exp) {
		t.Errorf("expires %v, want the JWT's %v", row.AccessExpiresAt, exp)
	}
	if r, err := e.srv.seal.OpenRefresh(row.ID, 2, row.RefreshSealed); err != nil || r != nextRefresh {
		t.Errorf("rotated refresh token not stored: %v", err)
	}
	refresher := &AccountJobs{cfg: Config{OAuthTokenURL: upstream.AnthropicTokenURL, CodexTokenURL: upstream.CodexTokenURL}}
	if u := refresher.tokenURL(row); u != endpoint.URL+"/oauth/token" {
		t.Errorf("token URL %q for a codex account with a base URL", u)
	}
	if row.BaseUrl = ""; refresher.tokenURL(row) != "https://auth.openai.com/oauth/token" {
		t.Errorf("default codex token URL %q", refresher.tokenURL(row))
	}
}

func TestCodexConfig(t *testing.T) {
	t.Parallel()
	cfg := testConfig(newClock())
	cfg.CodexTokenURL = "ftp://auth.example/token"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "WEIR_CODEX_TOKEN_URL") {
		t.Errorf("Validate with a bad codex token URL: %v", err)
	}
	cfg = testConfig(newClock())
	cfg.setDefaults()
	if cfg.CodexTokenURL != "https://auth.openai.com/oauth/token" || cfg.CodexClientID != "app_EMoamEEZ73f0CkXaXp7hrann" {
		t.Errorf("defaults: %q %q", cfg.CodexTokenURL, cfg.CodexClientID)
	}
	for p, want := range map[string]string{
		"anthropic": "https://api.anthropic.com", "openai": "https://api.openai.com/v1",
		"codex": "https://chatgpt.com/backend-api", "gemini": "",
	} {
		if got := defaultBaseURL(p); got != want {
			t.Errorf("defaultBaseURL(%q) = %q, want %q", p, got, want)
		}
	}
}

func (c *codexEnv) refreshUsage(ref string) *weirv1.RefreshUsageResponse {
	c.t.Helper()
	resp, err := c.admin.accounts.RefreshUsage(c.t.Context(), connect.NewRequest(&weirv1.RefreshUsageRequest{Id: ref}))
	if err != nil {
		c.t.Fatalf("RefreshUsage %s: %v", ref, err)
	}
	return resp.Msg
}

// The poller reads a Codex account's windows from /wham/usage with its
// bearer and chatgpt-account-id; OpenAI API-key accounts are never read.
func TestCodexUsagePoll(t *testing.T) {
	t.Parallel()
	sa := chatgptAccount("codex")
	c := newCodexEnv(t, sa)
	a := c.addCodex(sa)
	key := "sk-proj-" + randid.Hex(24)
	c.secrets.add(key)
	resp, err := c.admin.accounts.CreateAccount(t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider: weirv1.Provider_PROVIDER_OPENAI, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY, Label: "openai",
		Credential: key, BaseUrl: c.simURL + "/v1",
	}))
	if err != nil {
		t.Fatal(err)
	}
	oa := resp.Msg.Account

	// A lone unscheduled account is scheduled now, and read.
	if n, err := c.srv.acct.ReadDue(t.Context()); n != 1 || err != nil {
		t.Fatalf("ReadDue: %d, %v (want the codex account alone)", n, err)
	}
	var reads int
	for _, at := range c.sim.Attempts() {
		if at.Path == "/backend-api/wham/usage" && at.Account == "codex" && at.Status == http.StatusOK {
			reads++
		}
	}
	if reads != 1 {
		t.Fatalf("%d good reads of /backend-api/wham/usage, want 1: %+v", reads, c.sim.Attempts())
	}
	got := c.getAccount(a.Id)
	five, seven := window(got, windowFiveHour), window(got, windowSevenDay)
	if five == nil || seven == nil || five.GetUtilization() != 0.25 || seven.GetUtilization() != 0.62 || five.Source != sourcePoll {
		t.Fatalf("windows %v", got.Usage)
	}
	if !five.ResetsAt.AsTime().After(c.clock.Now()) || !seven.ResetsAt.AsTime().After(five.ResetsAt.AsTime()) {
		t.Errorf("resets %v %v", five.ResetsAt.AsTime(), seven.ResetsAt.AsTime())
	}
	if p, err := c.q.GetUsagePoll(t.Context(), uuidOf(t, oa.Id)); err != nil || p.NextReadAt != nil || p.LastReadAt != nil {
		t.Errorf("the openai account was scheduled or read: %+v %v", p, err)
	}
	_, err = c.admin.accounts.RefreshUsage(t.Context(), connect.NewRequest(&weirv1.RefreshUsageRequest{Id: "openai"}))
	wantCode(t, err, connect.CodeInvalidArgument)

	// Codex's response headers merge into the same windows.
	reset := c.clock.Now().Add(4 * time.Hour).Truncate(time.Second)
	if err := c.srv.acct.mergeUsageHeaders(t.Context(), c.q, []answeredUsage{{account: uuidOf(t, a.Id), revision: 1, headers: map[string]string{
		"x-codex-primary-used-percent": "50", "x-codex-primary-window-minutes": "300",
		"x-codex-primary-reset-at": strconv.FormatInt(reset.Unix(), 10),
	}}}, c.clock.Now()); err != nil {
		t.Fatal(err)
	}
	if w := window(c.getAccount(a.Id), windowFiveHour); w.GetUtilization() != 0.5 || w.Source != sourceHeader {
		t.Errorf("after the headers: %v", w)
	}
}
