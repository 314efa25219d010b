package controlplane

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/weirhq/weir/controlplane/people"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/randid"
)

// TestProcedureRoles fails while an admin procedure that can change
// something has no role decided, or the table names one that is not.
func TestProcedureRoles(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	protoregistry.GlobalFiles.RangeFilesByPackage("weir.v1", func(f protoreflect.FileDescriptor) bool {
		for i := range f.Services().Len() {
			svc := f.Services().Get(i)
			for j := range svc.Methods().Len() {
				m := svc.Methods().Get(j)
				proc := "/" + string(svc.FullName()) + "/" + string(m.Name())
				if isLeaseProcedure(proc) {
					continue
				}
				role, ok := procedureRoles[proc]
				seen[proc] = ok
				switch {
				case idempotency(m) == connect.IdempotencyNoSideEffects && ok:
					t.Errorf("%s reads: its role is the viewer's, not the table's %s", proc, role)
				case idempotency(m) != connect.IdempotencyNoSideEffects && !ok:
					t.Errorf("%s can change something and has no role in procedureRoles", proc)
				case ok && role < people.Operator:
					t.Errorf("%s changes something with role %s", proc, role)
				}
			}
		}
		return true
	})
	for proc := range procedureRoles {
		if !seen[proc] {
			t.Errorf("procedureRoles names %s, no admin procedure that changes something", proc)
		}
	}
}

// testIdP is an OpenID provider in the test: discovery, JWKS, an
// authorize endpoint that signs in whoever the test says at once, and a
// token endpoint that checks the code, the client and the PKCE verifier
// and returns an ID token signed with a test RSA key, which the test may
// spoil.
type testIdP struct {
	t      *testing.T
	srv    *httptest.Server
	key    *rsa.PrivateKey
	now    func() time.Time
	client string

	mu sync.Mutex
	// email is who the next authorization signs in.
	email string
	// spoil changes the next ID token's claims; tamper breaks its signature.
	spoil  func(claims map[string]any)
	tamper bool
	codes  map[string]grant
}

type grant struct{ nonce, challenge, email string }

func newTestIdP(t *testing.T, now func() time.Time, client string) *testIdP {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p := &testIdP{t: t, key: key, now: now, client: client, codes: map[string]grant{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"issuer": p.srv.URL, "authorization_endpoint": p.srv.URL + "/authorize",
			"token_endpoint": p.srv.URL + "/token", "jwks_uri": p.srv.URL + "/jwks",
			"id_token_signing_alg_values_supported": []string{"RS256"}})
	})
	mux.HandleFunc("GET /jwks", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"keys": []map[string]string{{"kty": "RSA", "kid": "k1", "use": "sig", "alg": "RS256",
			"n": b64(key.N.Bytes()), "e": b64(big.NewInt(int64(key.E)).Bytes())}}})
	})
	mux.HandleFunc("GET /authorize", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("client_id") != client || q.Get("response_type") != "code" || q.Get("code_challenge_method") != "S256" ||
			q.Get("nonce") == "" || q.Get("state") == "" || !strings.Contains(q.Get("scope"), "openid") {
			http.Error(w, "bad authorization request", http.StatusBadRequest)
			return
		}
		p.mu.Lock()
		code := rand.Text()
		p.codes[code] = grant{nonce: q.Get("nonce"), challenge: q.Get("code_challenge"), email: p.email}
		p.mu.Unlock()
		http.Redirect(w, r, q.Get("redirect_uri")+"?"+url.Values{"code": {code}, "state": {q.Get("state")}}.Encode(), http.StatusFound)
	})
	mux.HandleFunc("POST /token", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		defer p.mu.Unlock()
		g, ok := p.codes[r.PostFormValue("code")]
		delete(p.codes, r.PostFormValue("code"))
		sum := sha256.Sum256([]byte(r.PostFormValue("code_verifier")))
		id, _, _ := r.BasicAuth()
		if r.PostFormValue("client_id") != "" {
			id = r.PostFormValue("client_id")
		}
		if !ok || id != client || b64(sum[:]) != g.challenge {
			w.WriteHeader(http.StatusBadRequest)
			writeJSON(w, map[string]string{"error": "invalid_grant"})
			return
		}
		now := p.now()
		claims := map[string]any{"iss": p.srv.URL, "sub": "sub-" + g.email, "aud": client, "iat": now.Unix(),
			"exp": now.Add(5 * time.Minute).Unix(), "nonce": g.nonce, "email": g.email, "email_verified": true}
		if p.spoil != nil {
			p.spoil(claims)
		}
		writeJSON(w, map[string]any{"access_token": "at-" + rand.Text(), "token_type": "Bearer", "expires_in": 300,
			"id_token": p.sign(claims)})
	})
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
	return p
}

func (p *testIdP) sign(claims map[string]any) string {
	head, _ := json.Marshal(map[string]string{"alg": "RS256", "kid": "k1", "typ": "JWT"})
	body, _ := json.Marshal(claims)
	signing := b64(head) + "." + b64(body)
	sum := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(rand.Reader, p.key, crypto.SHA256, sum[:])
	if err != nil {
		p.t.Fatal(err)
	}
	if p.tamper {
		sig[len(sig)/2] ^= 1
	}
	return signing + "." + b64(sig)
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v) //nolint:errcheck // a test server
}

// callbackURL is the redirect URL weir is configured with; the test's
// browser takes it to the test server.
const callbackURL = "http://weir.test/dashboard/oidc/callback"

const testRoles = "admin=alice@example.com;operator=olga@example.com;viewer=*@example.com"

// setupOIDC is a replica with OIDC sign-in through a test provider.
func setupOIDC(t *testing.T) (*env, *testIdP) {
	t.Helper()
	pool := pgtest.NewPool(t)
	clock := newClock()
	cfg := testConfig(clock)
	idp := newTestIdP(t, clock.Now, "weir-dashboard")
	cfg.OIDCIssuer, cfg.OIDCName, cfg.OIDCClientID, cfg.OIDCRedirectURL = idp.srv.URL, "TestIdP", "weir-dashboard", callbackURL
	cfg.OIDCClientSecret = "client-secret-" + randid.Hex(8)
	cfg.OIDCRoles = testRoles
	e := newEnv(t, pool, cfg, clock)
	e.secrets.add(cfg.OIDCClientSecret)
	return e, idp
}

var refreshTo = regexp.MustCompile(`http-equiv="refresh" content="0;url=([^"]+)"`)

// oidcSignIn takes b through the provider as email, from the login page
// with next, and returns the callback's page (the session cookie kept).
func (b *browser) oidcSignIn(idp *testIdP, email, next string) page {
	b.t.Helper()
	login := b.get("/dashboard/login?next=" + url.QueryEscape(next))
	if !strings.Contains(login.body, "Sign in with TestIdP") {
		b.t.Fatalf("the login page offers no provider:\n%s", login.body)
	}
	start := b.get("/dashboard/oidc/start?next=" + url.QueryEscape(next))
	wantStatus(b.t, "oidc start", start, http.StatusFound)
	var flow *http.Cookie
	for _, c := range (&http.Response{Header: start.header}).Cookies() {
		if c.Name == "weir_oidc" {
			flow = c
		}
	}
	if flow == nil || !flow.HttpOnly || flow.SameSite != http.SameSiteLaxMode {
		b.t.Fatalf("oidc start: flow cookie %+v", flow)
	}
	idp.mu.Lock()
	idp.email = email
	idp.mu.Unlock()
	res, err := b.hc.Get(start.header.Get("Location"))
	if err != nil {
		b.t.Fatal(err)
	}
	res.Body.Close()
	back, err := url.Parse(res.Header.Get("Location"))
	if err != nil || back.Host != "weir.test" {
		b.t.Fatalf("the provider did not send the browser back to the callback: %d %q", res.StatusCode, res.Header.Get("Location"))
	}
	p := b.do(http.MethodGet, back.RequestURI(), nil, func(r *http.Request) { r.AddCookie(flow) })
	for _, c := range (&http.Response{Header: p.header}).Cookies() {
		if c.Name == "weir_dashboard" && c.Value != "" {
			b.cookie = c
		}
	}
	return p
}

func TestOIDCSignInRoles(t *testing.T) {
	t.Parallel()
	e, idp := setupOIDC(t)
	a, _ := e.createAccount(acct{label: "oidc-acct"})

	for _, c := range []struct {
		email           string
		role            people.Role
		pause, settings int
	}{
		{"vera@example.com", people.Viewer, http.StatusForbidden, http.StatusForbidden},
		{"olga@example.com", people.Operator, http.StatusSeeOther, http.StatusForbidden},
		{"Alice@Example.com", people.Admin, http.StatusSeeOther, http.StatusSeeOther},
	} {
		b := e.browser()
		p := b.oidcSignIn(idp, c.email, "/dashboard/requests")
		wantStatus(t, c.email+" callback", p, http.StatusOK)
		if m := refreshTo.FindStringSubmatch(p.body); m == nil || m[1] != "/dashboard/requests" {
			t.Errorf("%s: the callback does not continue to next: %q", c.email, p.body)
		}
		if b.cookie == nil || b.cookie.SameSite != http.SameSiteStrictMode || !b.cookie.HttpOnly {
			t.Fatalf("%s: session cookie %+v", c.email, b.cookie)
		}
		home := b.get("/dashboard/")
		wantStatus(t, c.email+" accounts page", home, http.StatusOK)
		if got := strings.Contains(home.body, "/pause\""); got != (c.role >= people.Operator) {
			t.Errorf("%s (%s): pause button shown = %v", c.email, c.role, got)
		}
		settings := b.get("/dashboard/settings")
		wantStatus(t, c.email+" settings page", settings, http.StatusOK)
		if got := strings.Contains(settings.body, ">Save</button>"); got != (c.role == people.Admin) {
			t.Errorf("%s (%s): save buttons shown = %v", c.email, c.role, got)
		}
		csrf := b.csrf()
		wantStatus(t, c.email+" pause", b.post("/dashboard/accounts/"+a.Id+"/pause", url.Values{"csrf": {csrf}}), c.pause)
		if c.pause == http.StatusSeeOther {
			wantStatus(t, c.email+" resume", b.post("/dashboard/accounts/"+a.Id+"/resume", url.Values{"csrf": {csrf}}), http.StatusSeeOther)
		}
		wantStatus(t, c.email+" setting", b.post("/dashboard/settings", url.Values{"csrf": {csrf}, "name": {"request_deadline"}, "value": {"30m"}}), c.settings)
	}

	// The audit log names the person and the credential.
	rows := e.auditRows(e.adminAPI(e.cfg.AdminToken, "test"), &weirv1.ListAuditEventsRequest{})
	var olga, alice bool
	for _, r := range rows {
		switch {
		case r.Actor == "olga@example.com" && r.Credential == "oidc" && strings.HasSuffix(r.Procedure, "/PauseAccount"):
			olga = true
		case r.Actor == "alice@example.com" && r.Credential == "oidc" && strings.HasSuffix(r.Procedure, "/UpdateSettings"):
			alice = true
		case r.Credential != "oidc" && !strings.HasSuffix(r.Procedure, "/CreateAccount"): // the test's own, with the token
			t.Errorf("audit row %s by %q with %q: every change after the setup was a person's", r.Procedure, r.Actor, r.Credential)
		}
	}
	if !olga || !alice {
		t.Errorf("audit rows do not name the people (olga paused: %v, alice set: %v): %v", olga, alice, rows)
	}

	// Not in the mapping: signed in at the provider, no role here.
	b := e.browser()
	p := b.oidcSignIn(idp, "eve@elsewhere.org", "/dashboard/")
	wantStatus(t, "unmapped person", p, http.StatusForbidden)
	if b.cookie != nil {
		t.Error("an unmapped person got a session")
	}
}

// TestRoleInterceptor calls the services as each role, in process, as
// the dashboard does.
func TestRoleInterceptor(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, _ := e.createAccount(acct{label: "role-acct"})
	rpc, _ := e.srv.rpcHandler()
	for _, c := range []struct {
		role                   people.Role
		read, operate, changes connect.Code
	}{
		{people.Viewer, 0, connect.CodePermissionDenied, connect.CodePermissionDenied},
		{people.Operator, 0, 0, connect.CodePermissionDenied},
		{people.Admin, 0, 0, 0},
	} {
		hc := &http.Client{Transport: asPrincipal{h: rpc, p: principal{name: c.role.String() + "@example.com", credential: people.CredentialOIDC, role: c.role}}}
		accounts := weirv1connect.NewAccountServiceClient(hc, "http://in-process")
		settings := weirv1connect.NewSettingsServiceClient(hc, "http://in-process")
		_, err := accounts.ListAccounts(t.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
		wantRoleCode(t, c.role.String()+" ListAccounts", err, c.read)
		_, err = accounts.PauseAccount(t.Context(), connect.NewRequest(&weirv1.PauseAccountRequest{Id: a.Id}))
		wantRoleCode(t, c.role.String()+" PauseAccount", err, c.operate)
		_, err = settings.UpdateSettings(t.Context(), connect.NewRequest(&weirv1.UpdateSettingsRequest{
			Settings:   &weirv1.Settings{RequestDeadline: durationpb.New(30 * time.Minute)},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"request_deadline"}}}))
		wantRoleCode(t, c.role.String()+" UpdateSettings", err, c.changes)
	}
	// Without a principal, in process is no credential at all.
	hc := &http.Client{Transport: inProcess{h: rpc}}
	_, err := weirv1connect.NewAccountServiceClient(hc, "http://in-process").ListAccounts(t.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
	wantRoleCode(t, "no principal", err, connect.CodeUnauthenticated)
}

type asPrincipal struct {
	h http.Handler
	p principal
}

func (a asPrincipal) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	a.h.ServeHTTP(rec, r.WithContext(withPrincipal(r.Context(), a.p)))
	return rec.Result(), nil
}

func wantRoleCode(t *testing.T, what string, err error, want connect.Code) {
	t.Helper()
	if got := connect.CodeOf(err); (err == nil && want != 0) || (err != nil && got != want) {
		t.Errorf("%s: %v, want code %v", what, err, want)
	}
}

func TestOIDCRefusesBadTokens(t *testing.T) {
	t.Parallel()
	e, idp := setupOIDC(t)
	for _, c := range []struct {
		name   string
		spoil  func(map[string]any)
		tamper bool
	}{
		{name: "tampered", tamper: true},
		{name: "expired", spoil: func(c map[string]any) { c["exp"] = e.clock.Now().Add(-time.Minute).Unix() }},
		{name: "wrong audience", spoil: func(c map[string]any) { c["aud"] = "someone-else" }},
		{name: "wrong nonce", spoil: func(c map[string]any) { c["nonce"] = "not-the-nonce" }},
		{name: "unverified email", spoil: func(c map[string]any) { c["email_verified"] = false }},
	} {
		idp.mu.Lock()
		idp.spoil, idp.tamper = c.spoil, c.tamper
		idp.mu.Unlock()
		b := e.browser()
		p := b.oidcSignIn(idp, "alice@example.com", "/dashboard/")
		wantStatus(t, c.name, p, http.StatusUnauthorized)
		if b.cookie != nil {
			t.Errorf("%s: a session cookie was set", c.name)
		}
	}
}

func TestDashboardSignOutRevokes(t *testing.T) {
	t.Parallel()
	e, idp := setupOIDC(t)
	b := e.browser()
	b.oidcSignIn(idp, "olga@example.com", "//evil.example/")
	copied := *b.cookie
	wantStatus(t, "signed in", b.get("/dashboard/"), http.StatusOK)
	wantStatus(t, "sign out", b.post("/dashboard/logout", url.Values{"csrf": {b.csrf()}}), http.StatusSeeOther)
	b.cookie = &copied
	p := b.get("/dashboard/")
	wantStatus(t, "the copied cookie after sign-out", p, http.StatusSeeOther)

	// next is confined to the dashboard, through the provider too.
	p = b.oidcSignIn(idp, "olga@example.com", "https://evil.example/dashboard/")
	if m := refreshTo.FindStringSubmatch(p.body); m == nil || m[1] != "/dashboard/" {
		t.Errorf("next left the dashboard: %q", p.body)
	}
}

func TestDashboardFailedSignInLimit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	b := e.browser()
	for range 5 {
		wantStatus(t, "wrong token", b.login("wrong-token-"+randid.Hex(8)), http.StatusUnauthorized)
	}
	for range 20 {
		wantStatus(t, "past the limit", b.login("wrong-token-"+randid.Hex(8)), http.StatusTooManyRequests)
	}
	// Past the limit, even the right token waits: the limit is checked first.
	wantStatus(t, "right token past the limit", b.login(e.cfg.AdminToken), http.StatusTooManyRequests)
	if n := strings.Count(e.logs.String(), "dashboard sign-ins refused"); n != 1 {
		t.Errorf("%d WARN lines for 26 refusals in a minute, want 1", n)
	}
	e.clock.Advance(time.Minute)
	wantStatus(t, "a minute on", b.login(e.cfg.AdminToken), http.StatusSeeOther)
	wantStatus(t, "a wrong token a minute on", e.browser().login("wrong-"+randid.Hex(8)), http.StatusUnauthorized)
	if !strings.Contains(e.logs.String(), "count=26") {
		t.Errorf("the next line does not count the interval's 25 refusals and the new failure:\n%s", e.logs.String())
	}
}

func TestDashboardSecureBehindTrustedProxy(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cfg := e.cfg
	cfg.Registry, cfg.Logger = nil, nil
	cfg.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	behind := newEnv(t, e.pool, cfg, e.clock)
	https := func(r *http.Request) { r.Header.Set("X-Forwarded-Proto", "https") }
	form := url.Values{"token": {e.cfg.AdminToken}, "next": {"/dashboard/"}}
	for _, c := range []struct {
		name   string
		e      *env
		secure bool
	}{{"trusted proxy", behind, true}, {"untrusted", e, false}} {
		p := c.e.browser().do(http.MethodPost, "/dashboard/login", form, func(r *http.Request) {
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			https(r)
		})
		wantStatus(t, c.name, p, http.StatusSeeOther)
		cookies := (&http.Response{Header: p.header}).Cookies()
		if len(cookies) != 1 || cookies[0].Secure != c.secure {
			t.Errorf("%s: cookies %+v, want one, Secure %v", c.name, cookies, c.secure)
		}
		if got := p.header.Get("Strict-Transport-Security") != ""; got != c.secure {
			t.Errorf("%s: HSTS sent = %v, want %v", c.name, got, c.secure)
		}
	}
}

// TestOIDCBearerOnAdminAPI: a person's ID token is a bearer token on the
// admin API, with their role; a spoiled one is no credential.
func TestOIDCBearerOnAdminAPI(t *testing.T) {
	t.Parallel()
	e, idp := setupOIDC(t)
	a, _ := e.createAccount(acct{label: "bearer-acct"})
	claims := func(email string) map[string]any {
		now := e.clock.Now()
		return map[string]any{"iss": idp.srv.URL, "sub": "sub-" + email, "aud": "weir-dashboard", "iat": now.Unix(),
			"exp": now.Add(5 * time.Minute).Unix(), "email": email, "email_verified": true}
	}
	olga := e.adminAPI(idp.sign(claims("olga@example.com")), "claimed-name")
	if _, err := olga.accounts.ListAccounts(t.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{})); err != nil {
		t.Fatalf("operator reads: %v", err)
	}
	if _, err := olga.accounts.PauseAccount(t.Context(), connect.NewRequest(&weirv1.PauseAccountRequest{Id: a.Id})); err != nil {
		t.Fatalf("operator pauses: %v", err)
	}
	_, err := olga.settings.UpdateSettings(t.Context(), connect.NewRequest(&weirv1.UpdateSettingsRequest{
		Settings:   &weirv1.Settings{RequestDeadline: durationpb.New(30 * time.Minute)},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"request_deadline"}}}))
	wantRoleCode(t, "operator changes settings", err, connect.CodePermissionDenied)

	rows := e.auditRows(e.adminAPI(e.cfg.AdminToken, "test"), &weirv1.ListAuditEventsRequest{})
	var paused, refused bool
	for _, r := range rows {
		if r.Actor == "olga@example.com" && r.Credential == "oidc" {
			paused = paused || (strings.HasSuffix(r.Procedure, "/PauseAccount") && r.Outcome == "ok")
			refused = refused || (strings.HasSuffix(r.Procedure, "/UpdateSettings") && r.Outcome == connect.CodePermissionDenied.String())
		}
	}
	if !paused || !refused {
		t.Errorf("the audit does not name olga's pause (%v) and refused change (%v): %v", paused, refused, rows)
	}

	for name, spoil := range map[string]func(map[string]any){
		"expired":        func(c map[string]any) { c["exp"] = e.clock.Now().Add(-time.Minute).Unix() },
		"wrong audience": func(c map[string]any) { c["aud"] = "someone-else" },
		"wrong issuer":   func(c map[string]any) { c["iss"] = "https://evil.example" },
		"unmapped":       func(c map[string]any) { c["email"] = "eve@elsewhere.org" },
	} {
		c := claims("alice@example.com")
		spoil(c)
		_, err := e.adminAPI(idp.sign(c), "").accounts.ListAccounts(t.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
		wantRoleCode(t, name, err, connect.CodeUnauthenticated)
	}
	idp.tamper = true
	_, err = e.adminAPI(idp.sign(claims("alice@example.com")), "").accounts.ListAccounts(t.Context(), connect.NewRequest(&weirv1.ListAccountsRequest{}))
	wantRoleCode(t, "tampered", err, connect.CodeUnauthenticated)
}
