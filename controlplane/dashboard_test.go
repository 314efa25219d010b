package controlplane

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"golang.org/x/net/html"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/rpcclient"
)

// browser is a dashboard client: a session cookie, no redirects followed.
type browser struct {
	t      *testing.T
	base   string
	hc     *http.Client
	cookie *http.Cookie
}

func (e *env) browser() *browser {
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	e.t.Cleanup(hc.CloseIdleConnections)
	return &browser{t: e.t, base: e.ts.URL, hc: hc}
}

type page struct {
	status int
	header http.Header
	body   string
}

func (b *browser) do(method, path string, form url.Values, edit func(*http.Request)) page {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(b.t.Context(), method, b.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if b.cookie != nil {
		req.AddCookie(b.cookie)
	}
	if edit != nil {
		edit(req)
	}
	res, err := b.hc.Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return page{status: res.StatusCode, header: res.Header, body: string(raw)}
}

func (b *browser) get(path string) page { b.t.Helper(); return b.do(http.MethodGet, path, nil, nil) }

// post sends a form; with csrf, the session's token from the page at from.
func (b *browser) post(path string, form url.Values) page {
	b.t.Helper()
	return b.do(http.MethodPost, path, form, nil)
}

// login signs in with token and keeps the cookie.
func (b *browser) login(token string) page {
	b.t.Helper()
	p := b.post("/dashboard/login", url.Values{"token": {token}, "next": {"/dashboard/"}})
	for _, c := range (&http.Response{Header: p.header}).Cookies() {
		if c.Name == "weir_dashboard" {
			b.cookie = c
		}
	}
	return p
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf reads the CSRF token from a page's forms.
func (b *browser) csrf() string {
	b.t.Helper()
	p := b.get("/dashboard/settings")
	m := csrfField.FindStringSubmatch(p.body)
	if m == nil {
		b.t.Fatalf("no CSRF field on the settings page (status %d)", p.status)
	}
	return m[1]
}

// voidElements are the HTML elements without an end tag.
var voidElements = map[string]bool{"area": true, "base": true, "br": true, "col": true, "embed": true, "hr": true,
	"img": true, "input": true, "link": true, "meta": true, "source": true, "track": true, "wbr": true}

// wellFormed checks that every element of a page the dashboard rendered
// is closed, in order: the templates close what they open, so a tag left
// open or closed twice is a broken template (or an escaped value that
// was not).
func wellFormed(body string) error {
	z := html.NewTokenizer(strings.NewReader(body))
	var open []string
	for {
		switch z.Next() {
		case html.ErrorToken:
			if z.Err() != io.EOF {
				return z.Err()
			}
			if len(open) > 0 {
				return fmt.Errorf("unclosed at the end: %v", open)
			}
			return nil
		case html.StartTagToken:
			name, _ := z.TagName()
			if !voidElements[string(name)] {
				open = append(open, string(name))
			}
		case html.EndTagToken:
			name, _ := z.TagName()
			if len(open) == 0 || open[len(open)-1] != string(name) {
				return fmt.Errorf("</%s> closes %v", name, open)
			}
			open = open[:len(open)-1]
		}
	}
}

func wantStatus(t *testing.T, what string, p page, status int) {
	t.Helper()
	if p.status != status {
		t.Fatalf("%s: status %d, want %d\n%s", what, p.status, status, p.body)
	}
}

func TestDashboardAuth(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.createAccount(acct{label: "auth-acct"})
	b := e.browser()

	p := b.get("/dashboard/")
	wantStatus(t, "no session", p, http.StatusSeeOther)
	if loc := p.header.Get("Location"); loc != "/dashboard/login?next=%2Fdashboard%2F" {
		t.Errorf("no session: Location = %q, want the login page", loc)
	}
	for _, path := range []string{"/dashboard/requests", "/dashboard/history", "/dashboard/settings", "/dashboard/jobs/",
		"/dashboard/usage", "/dashboard/usage.csv", "/dashboard/usage/cache", "/dashboard/usage/prices", "/dashboard/budgets"} {
		if p := b.get(path); p.status != http.StatusSeeOther || !strings.HasPrefix(p.header.Get("Location"), "/dashboard/login") {
			t.Errorf("%s without a session: %d %q, want a redirect to the login", path, p.status, p.header.Get("Location"))
		}
	}
	wantStatus(t, "fragment without a session", b.get("/dashboard/fragment/accounts"), http.StatusUnauthorized)

	wrong := "not-the-admin-token-" + randid.Hex(8)
	p = b.login(wrong)
	wantStatus(t, "wrong token", p, http.StatusUnauthorized)
	if !strings.Contains(p.body, "That is not the admin token.") || !strings.Contains(p.body, `role="alert"`) {
		t.Errorf("wrong token: no inline error on the login page:\n%s", p.body)
	}
	if strings.Contains(p.body, wrong) {
		t.Error("wrong token: the page echoes the token typed")
	}
	if b.cookie != nil {
		t.Fatal("wrong token: a session cookie was set")
	}

	p = b.login(e.cfg.AdminToken)
	wantStatus(t, "login", p, http.StatusSeeOther)
	c := b.cookie
	if c == nil {
		t.Fatal("login: no session cookie")
	}
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/dashboard/" || c.Secure || c.MaxAge != 12*3600 {
		t.Errorf("cookie = %+v, want HttpOnly, SameSite=Strict, Path=/dashboard/, not Secure over plain HTTP, 12 h", c)
	}
	if strings.Contains(c.Value, e.cfg.AdminToken) {
		t.Error("the cookie holds the admin token")
	}
	p = b.get("/dashboard/")
	wantStatus(t, "with a session", p, http.StatusOK)
	if !strings.Contains(p.body, "auth-acct") {
		t.Error("accounts page does not list the account")
	}

	// A tampered session is no session.
	good := *b.cookie
	b.cookie.Value = strings.Replace(good.Value, ".", "0.", 1)
	wantStatus(t, "tampered cookie", b.get("/dashboard/"), http.StatusSeeOther)
	b.cookie = &good

	// Bearer works without a cookie, and without CSRF (no ambient credential).
	bearer := func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+e.cfg.AdminToken) }
	anon := e.browser()
	wantStatus(t, "bearer", anon.do(http.MethodGet, "/dashboard/", nil, bearer), http.StatusOK)
	wantStatus(t, "wrong bearer", anon.do(http.MethodGet, "/dashboard/", nil, func(r *http.Request) {
		r.Header.Set("Authorization", "Bearer "+e.cfg.DataplaneToken)
	}), http.StatusSeeOther)

	// Twelve hours on, the session has expired.
	e.clock.Advance(12*time.Hour + time.Second)
	wantStatus(t, "expired session", b.get("/dashboard/"), http.StatusSeeOther)
}

func TestDashboardActions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, _ := e.createAccount(acct{label: "act-acct"})
	b := e.browser()
	b.login(e.cfg.AdminToken)
	csrf := b.csrf()

	// The no-JavaScript confirmation page.
	p := b.get("/dashboard/accounts/" + a.Id + "/pause")
	wantStatus(t, "confirm page", p, http.StatusOK)
	if !strings.Contains(p.body, "Pause act-acct?") || !strings.Contains(p.body, `action="/dashboard/accounts/`+a.Id+`/pause"`) {
		t.Errorf("confirm page lacks its question or form:\n%s", p.body)
	}

	// No CSRF token, or another session's: 403 and nothing changes.
	wantStatus(t, "pause without CSRF", b.post("/dashboard/accounts/"+a.Id+"/pause", url.Values{}), http.StatusForbidden)
	wantStatus(t, "pause with a bad CSRF", b.post("/dashboard/accounts/"+a.Id+"/pause", url.Values{"csrf": {"x" + csrf}}), http.StatusForbidden)
	if e.accountRow(a.Id).Paused {
		t.Fatal("a POST without a valid CSRF token paused the account")
	}

	p = b.post("/dashboard/accounts/"+a.Id+"/pause", url.Values{"csrf": {csrf}})
	wantStatus(t, "pause", p, http.StatusSeeOther)
	if !e.accountRow(a.Id).Paused {
		t.Fatal("pause: the account is not paused in the database")
	}
	if p = b.get(p.header.Get("Location")); !strings.Contains(p.body, "Paused act-acct.") {
		t.Errorf("no flash after the pause:\n%s", p.body)
	}

	// A cooldown and a family gate, then clear: both go, the pause stays.
	id := uuid.MustParse(a.Id)
	now := e.clock.Now()
	if _, err := e.q.WriteCooldown(t.Context(), db.WriteCooldownParams{AccountID: id, Reason: "rate_limited", Transient: true,
		Until: now.Add(10 * time.Minute), Now: now, Evidence: []byte(`{"class":"rate_limited","status":429}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.q.WriteFamilyGate(t.Context(), db.WriteFamilyGateParams{AccountID: id, Family: "opus",
		Until: now.Add(time.Hour), Now: now, Evidence: []byte(`{"class":"rate_limited"}`)}); err != nil {
		t.Fatal(err)
	}
	p = b.get("/dashboard/")
	for _, want := range []string{"rate limited", "gate <strong>opus</strong>", `data-deadline="` + now.Add(10*time.Minute).UTC().Format(time.RFC3339) + `"`, "Clear cooldown"} {
		if !strings.Contains(p.body, want) {
			t.Errorf("accounts page lacks %q", want)
		}
	}
	wantStatus(t, "clear without CSRF", b.post("/dashboard/accounts/"+a.Id+"/clear-cooldown", nil), http.StatusForbidden)
	wantStatus(t, "clear", b.post("/dashboard/accounts/"+a.Id+"/clear-cooldown", url.Values{"csrf": {csrf}}), http.StatusSeeOther)
	if e.cooldownRow(a.Id) != nil {
		t.Error("clear cooldown: the cooldown is still there")
	}
	if n := e.count(`SELECT count(*) FROM family_gates WHERE account_id = $1`, id); n != 0 {
		t.Errorf("clear cooldown: %d family gates left", n)
	}
	if !e.accountRow(a.Id).Paused {
		t.Error("clear cooldown unpaused the account")
	}

	wantStatus(t, "resume", b.post("/dashboard/accounts/"+a.Id+"/resume", url.Values{"csrf": {csrf}}), http.StatusSeeOther)
	if e.accountRow(a.Id).Paused {
		t.Error("resume: the account is still paused")
	}
	wantStatus(t, "unknown action", b.post("/dashboard/accounts/"+a.Id+"/delete", url.Values{"csrf": {csrf}}), http.StatusNotFound)
	wantStatus(t, "unknown account", b.post("/dashboard/accounts/nope/pause", url.Values{"csrf": {csrf}}), http.StatusNotFound)
}

func TestDashboardClearCooldownRPC(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, _ := e.createAccount(acct{label: "rpc-acct"})
	e.pause(a.Id)
	now := e.clock.Now()
	if _, err := e.q.WriteCooldown(t.Context(), db.WriteCooldownParams{AccountID: uuid.MustParse(a.Id), Reason: "overloaded",
		Transient: true, Until: now.Add(time.Minute), Now: now, Evidence: []byte(`{"class":"overloaded"}`)}); err != nil {
		t.Fatal(err)
	}
	dash := weirv1connect.NewDashboardServiceClient(rpcclient.HTTPClient(), e.ts.URL, connect.WithInterceptors(rpcclient.Token(e.cfg.AdminToken)))
	res, err := dash.ClearCooldown(t.Context(), connect.NewRequest(&weirv1.ClearCooldownRequest{Id: "rpc-acct"}))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Msg.ClearedCooldown || res.Msg.Account.Cooldown != nil || res.Msg.Account.State != weirv1.AccountState_ACCOUNT_STATE_PAUSED {
		t.Errorf("ClearCooldown = %v, want the cooldown cleared and the account still paused", res.Msg)
	}
	res, err = dash.ClearCooldown(t.Context(), connect.NewRequest(&weirv1.ClearCooldownRequest{Id: "rpc-acct"}))
	if err != nil || res.Msg.ClearedCooldown {
		t.Errorf("second ClearCooldown = %v, %v; want nothing to clear", res, err)
	}
	// The data-plane token does not open DashboardService.
	dp := weirv1connect.NewDashboardServiceClient(rpcclient.HTTPClient(), e.ts.URL, connect.WithInterceptors(rpcclient.Token(e.cfg.DataplaneToken)))
	_, err = dp.ClearCooldown(t.Context(), connect.NewRequest(&weirv1.ClearCooldownRequest{Id: "rpc-acct"}))
	wantCode(t, err, connect.CodeUnauthenticated)
}

func TestDashboardSettings(t *testing.T) {
	t.Parallel()
	e := setup(t)
	b := e.browser()
	b.login(e.cfg.AdminToken)
	csrf := b.csrf()

	wantStatus(t, "setting without CSRF", b.post("/dashboard/settings", url.Values{"name": {"request_deadline"}, "value": {"30m"}}), http.StatusForbidden)

	// The holds ask before they are saved as 0 (the dialog the page's
	// script opens), the deadline, which cannot be 0, does not.
	page := b.get("/dashboard/settings").body
	if !strings.Contains(page, `id="setting-capacity_hold" data-confirm-zero="With a capacity hold of 0`) ||
		!strings.Contains(page, `id="setting-unreachable_hold" data-confirm-zero=`) || strings.Contains(page, `id="setting-request_deadline" data-confirm-zero`) {
		t.Error("the hold settings do not ask before 0")
	}

	// The RPC's own validation message, next to the field, with the value
	// the operator typed kept in it.
	p := b.post("/dashboard/settings", url.Values{"csrf": {csrf}, "name": {"request_deadline"}, "value": {"10s"}})
	wantStatus(t, "bad deadline", p, http.StatusUnprocessableEntity)
	field := regexp.MustCompile(`(?s)id="setting-request_deadline".*?</form>`).FindString(p.body)
	if !strings.Contains(field, `value="10s"`) || !strings.Contains(field, `id="request_deadline-error"`) ||
		!strings.Contains(field, "settings.request_deadline: 10s is out of range; must be between 1m0s and 6h0m0s") {
		t.Errorf("the validation error is not inline next to request_deadline:\n%s", field)
	}
	p = b.post("/dashboard/settings", url.Values{"csrf": {csrf}, "name": {"capacity_hold"}, "value": {"soon"}})
	wantStatus(t, "unparsable hold", p, http.StatusUnprocessableEntity)
	if !strings.Contains(p.body, `id="capacity_hold-error"`) || !strings.Contains(p.body, "is not a duration") {
		t.Errorf("no inline error for an unparsable duration")
	}

	p = b.post("/dashboard/settings", url.Values{"csrf": {csrf}, "name": {"request_deadline"}, "value": {"30m"}})
	wantStatus(t, "good deadline", p, http.StatusSeeOther)
	p = b.post("/dashboard/settings", url.Values{"csrf": {csrf}, "name": {"quota_response_mode"}, "value": {"usage_limit"}})
	wantStatus(t, "quota mode", p, http.StatusSeeOther)
	st, err := e.srv.settingsService().GetSettings(t.Context(), connect.NewRequest(&weirv1.GetSettingsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if st.Msg.Settings.RequestDeadline.AsDuration() != 30*time.Minute || st.Msg.Settings.QuotaResponseMode != weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT {
		t.Errorf("settings = %v after saving", st.Msg.Settings)
	}
	p = b.get("/dashboard/settings?saved=request_deadline")
	if !regexp.MustCompile(`(?s)<td data-label="Setting">request_deadline</td>.*?<td data-label="To">30m0s</td>`).MatchString(p.body) {
		t.Errorf("the audit does not show the change")
	}

	// Aliases: an inline error, then set and remove.
	p = b.post("/dashboard/aliases", url.Values{"csrf": {csrf}, "alias": {"fast"}, "targets": {"fast"}})
	wantStatus(t, "bad alias", p, http.StatusUnprocessableEntity)
	if !strings.Contains(p.body, `id="alias-error"`) || !strings.Contains(p.body, "targets: an alias cannot name itself") {
		t.Errorf("no inline alias error")
	}
	wantStatus(t, "set alias", b.post("/dashboard/aliases", url.Values{"csrf": {csrf}, "alias": {"fast"}, "targets": {"claude-haiku-4-5, gpt-5-mini"}}), http.StatusSeeOther)
	if p = b.get("/dashboard/settings"); !strings.Contains(p.body, "<code>claude-haiku-4-5</code> → <code>gpt-5-mini</code>") {
		t.Errorf("the alias is not listed with its targets in order")
	}
	// A translating alias, and a key's own of the same name: listed
	// apart, and removing the key's leaves the one for every key.
	wantStatus(t, "set translating alias", b.post("/dashboard/aliases", url.Values{"csrf": {csrf}, "alias": {"fast"},
		"targets": {"claude-haiku-4-5, gpt-5-mini"}, "translate": {"1"}}), http.StatusSeeOther)
	key, _ := e.createKey("alias-key")
	if _, err := e.aliasClient(e.cfg.AdminToken).SetAlias(t.Context(), connect.NewRequest(&weirv1.SetAliasRequest{Alias: "fast", Targets: []string{"gpt-5-mini"}, Key: key.Id})); err != nil {
		t.Fatal(err)
	}
	p = b.get("/dashboard/settings")
	if !regexp.MustCompile(`(?s)<td data-label="For">every key</td>.*?<td data-label="Translates">yes</td>`).MatchString(p.body) ||
		!strings.Contains(p.body, `<td data-label="For">key alias-key</td>`) {
		t.Errorf("the aliases are not listed with whom they are for and whether they translate")
	}
	wantStatus(t, "remove the key's alias", b.post("/dashboard/aliases/delete", url.Values{"csrf": {csrf}, "alias": {"fast"}, "key": {key.Id}}), http.StatusSeeOther)
	if n, m := e.count(`SELECT count(*) FROM key_aliases`), e.count(`SELECT count(*) FROM model_aliases WHERE translate`); n != 0 || m != 1 {
		t.Errorf("after removing the key's alias: %d key aliases, %d translating global ones; want 0 and 1", n, m)
	}
	wantStatus(t, "remove alias", b.post("/dashboard/aliases/delete", url.Values{"csrf": {csrf}, "alias": {"fast"}}), http.StatusSeeOther)
	if n := e.count(`SELECT count(*) FROM model_aliases`); n != 0 {
		t.Errorf("%d aliases left after removing", n)
	}
}

// TestDashboardPagesKeepSecrets renders every page over real state and
// requires that no credential or token appears in any of them.
func TestDashboardPagesKeepSecrets(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, _ := e.createAccount(acct{label: "secret-api"})
	o, _ := e.createAccount(acct{label: "secret-oauth", credential: oauthToken(), kind: weirv1.AuthKind_AUTH_KIND_OAUTH})
	key, _ := e.createKey("agent")
	reqID := "req-" + randid.Hex(6)
	now := e.clock.Now()
	if _, err := reportOne(t.Context(), e.dp.leases, &weirv1.RouteEvent{
		RequestId: reqID, KeyId: key.Id, AccountId: a.Id, Model: "claude-sonnet-4-5", Status: 200, Attempts: 2,
		Duration: durationpb.New(1500 * time.Millisecond), StartedAt: timestamppb.New(now), HoldCount: 1, Held: durationpb.New(time.Second),
		AttemptRecords: []*weirv1.AttemptRecord{
			{At: durationpb.New(0), AccountId: o.Id, Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, Action: weirv1.Action_ACTION_FAILOVER},
			{At: durationpb.New(time.Millisecond), AccountId: a.Id, Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, Action: weirv1.Action_ACTION_FAILOVER,
				TransportCause: weirv1.TransportCause_TRANSPORT_CAUSE_DNS},
			{At: durationpb.New(10 * time.Millisecond), HoldReason: "all accounts cooling", Duration: durationpb.New(time.Second)},
			{At: durationpb.New(time.Second), AccountId: a.Id, Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200, Action: weirv1.Action_ACTION_RESPOND,
				Model: "gpt-5-codex", Translation: "messages>responses"},
		},
	}); err != nil {
		t.Fatal(err)
	}
	// Usage history: a sawtooth over the last hours, for the charts.
	for i := range 90 {
		at := now.Add(-3*time.Hour + time.Duration(i)*2*time.Minute)
		reset := now.Add(2 * time.Hour)
		util := float64(i%45) / 50
		if i >= 45 {
			reset = now.Add(4 * time.Hour)
		}
		if _, err := e.pool.Exec(t.Context(), `INSERT INTO usage_snapshots (account_id, window_name, utilization, resets_at, taken_at) VALUES ($1, 'five_hour', $2, $3, $4)`,
			uuid.MustParse(o.Id), util, reset, at); err != nil {
			t.Fatal(err)
		}
	}

	b := e.browser()
	b.login(e.cfg.AdminToken)
	pages := []string{
		"/dashboard/", "/dashboard/fragment/accounts", "/dashboard/accounts/" + a.Id + "/pause",
		"/dashboard/accounts/" + o.Id + "/clear-cooldown", "/dashboard/history", "/dashboard/history?range=6h",
		"/dashboard/history?range=7d", "/dashboard/history?range=1h", "/dashboard/requests", "/dashboard/requests?outcome=success&account=" + a.Id,
		"/dashboard/fragment/requests?key=" + key.Id, "/dashboard/requests/" + reqID, "/dashboard/settings", "/dashboard/jobs/",
		"/dashboard/usage", "/dashboard/usage?range=1h&by=session&per=hour", "/dashboard/usage?range=30d&by=account&per=day&tz=Asia/Kolkata",
		"/dashboard/usage.csv?by=key", "/dashboard/usage/cache", "/dashboard/usage/prices", "/dashboard/budgets", "/dashboard/audit",
		"/dashboard/login",
	}
	secrets := append(e.secrets.all(), e.cfg.AdminToken, e.cfg.DataplaneToken)
	if wellFormed("<main><p>an unclosed paragraph</main>") == nil || wellFormed("<main></main></div>") == nil {
		t.Fatal("wellFormed passes a page with a tag left open or closed twice")
	}
	for _, path := range pages {
		p := b.get(path)
		if path == "/dashboard/login" {
			wantStatus(t, path, p, http.StatusSeeOther) // signed in already
		} else {
			wantStatus(t, path, p, http.StatusOK)
		}
		for _, s := range secrets {
			if strings.Contains(p.body, s) {
				t.Errorf("%s: a secret (%d characters) appears in the page", path, len(s))
			}
		}
		if strings.HasPrefix(p.header.Get("Content-Type"), "text/html") && p.status == http.StatusOK {
			if err := wellFormed(p.body); err != nil {
				t.Errorf("%s: not well formed: %v", path, err)
			}
		}
	}

	p := b.get("/dashboard/requests/" + reqID)
	for _, want := range []string{"secret-oauth", "rate limited", "failover", "all accounts cooling", "respond", "1.0s in 1 hold(s)",
		`<td data-label="Outcome">transport error</td>`, `<td data-label="Error">dns</td>`, "translated messages → responses as gpt-5-codex"} {
		if !strings.Contains(p.body, want) {
			t.Errorf("explain page lacks %q", want)
		}
	}
	p = b.get("/dashboard/requests?outcome=error")
	if strings.Contains(p.body, reqID) {
		t.Error("the error filter lists a successful request")
	}
	p = b.get("/dashboard/requests?outcome=held")
	if !strings.Contains(p.body, reqID) {
		t.Error("the held filter misses a held request")
	}
	p = b.get("/dashboard/requests?status=abc")
	wantStatus(t, "bad status filter", p, http.StatusBadRequest)
	p = b.get("/dashboard/history?range=6h")
	if !strings.Contains(p.body, `<polyline class="line s0"`) || !strings.Contains(p.body, "secret-oauth") || !strings.Contains(p.body, "1 requests") {
		t.Errorf("history lacks the usage line or the pool totals")
	}
	if !strings.Contains(p.body, "Without usage windows: secret-api") {
		t.Errorf("history does not name the account without windows")
	}
	p = b.get("/dashboard/jobs/")
	if !strings.Contains(p.body, "runs no background jobs") {
		t.Errorf("jobs page on a replica without jobs does not say so")
	}
}

func TestDashboardHistoryRPCs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	o, _ := e.createAccount(acct{label: "hist", credential: oauthToken(), kind: weirv1.AuthKind_AUTH_KIND_OAUTH})
	now := e.clock.Now()
	for i, u := range []float64{0.1, 0.2, 0.3} {
		if _, err := e.pool.Exec(t.Context(), `INSERT INTO usage_snapshots (account_id, window_name, utilization, resets_at, taken_at) VALUES ($1, 'seven_day', $2, $3, $4)`,
			uuid.MustParse(o.Id), u, now.Add(48*time.Hour), now.Add(-time.Duration(3-i)*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	for i, st := range []int32{200, 529, 200} {
		if _, err := reportOne(t.Context(), e.dp.leases, &weirv1.RouteEvent{
			RequestId: "h" + string(rune('a'+i)), Status: st, HoldCount: int32(i), StartedAt: timestamppb.New(now)}); err != nil {
			t.Fatal(err)
		}
	}
	// Started before the range, recorded in it: the buckets count a
	// request when it started.
	if _, err := reportOne(t.Context(), e.dp.leases, &weirv1.RouteEvent{
		RequestId: "h-before", Status: 500, StartedAt: timestamppb.New(now.Add(-7 * time.Hour))}); err != nil {
		t.Fatal(err)
	}
	dash := e.srv.dashboardService()
	u, err := dash.UsageHistory(t.Context(), connect.NewRequest(&weirv1.UsageHistoryRequest{Range: durationpb.New(6 * time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Msg.Series) != 1 || len(u.Msg.Series[0].Points) != 3 || u.Msg.Series[0].Points[2].Utilization != 0.3 {
		t.Errorf("UsageHistory = %v, want one series of three points", u.Msg)
	}
	r, err := dash.RouteStats(t.Context(), connect.NewRequest(&weirv1.RouteStatsRequest{Range: durationpb.New(6 * time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	var req, errs, holds int64
	for _, k := range r.Msg.Buckets {
		req, errs, holds = req+k.Requests, errs+k.Errors, holds+k.Holds
	}
	if req != 3 || errs != 1 || holds != 3 {
		t.Errorf("RouteStats totals = %d requests, %d errors, %d holds; want 3, 1, 3", req, errs, holds)
	}
	_, err = dash.RouteStats(t.Context(), connect.NewRequest(&weirv1.RouteStatsRequest{Range: durationpb.New(time.Minute)}))
	wantCode(t, toConnect(err), connect.CodeInvalidArgument)
	s, err := dash.SearchRouteEvents(t.Context(), connect.NewRequest(&weirv1.SearchRouteEventsRequest{Status: 529}))
	if err != nil || len(s.Msg.Events) != 1 || s.Msg.Events[0].RequestId != "hb" {
		t.Errorf("SearchRouteEvents(status 529) = %v, %v", s, err)
	}
}

// TestDashboardJobsUI mounts River's UI on a replica that runs jobs.
func TestDashboardJobsUI(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t)
	clock := newClock()
	cfg := testConfig(clock)
	cfg.DisableJobs = false
	e := newEnv(t, pool, cfg, clock)
	b := e.browser()
	wantStatus(t, "jobs api without a session", b.get("/dashboard/jobs/api/states"), http.StatusUnauthorized)
	b.login(e.cfg.AdminToken)
	p := b.get("/dashboard/jobs/")
	wantStatus(t, "river ui", p, http.StatusOK)
	if !strings.Contains(p.body, "/dashboard/jobs") {
		t.Errorf("River's UI does not know its prefix:\n%.500s", p.body)
	}
	p = b.get("/dashboard/jobs/api/states")
	wantStatus(t, "river api", p, http.StatusOK)
	var states map[string]any
	if err := json.Unmarshal([]byte(p.body), &states); err != nil || states["available"] == nil {
		t.Errorf("jobs api: %v: %.300s", err, p.body)
	}
	// River's UI posts with its own script; a cross-site post is refused.
	cross := b.do(http.MethodPost, "/dashboard/jobs/api/jobs/cancel", nil, func(r *http.Request) {
		r.Header.Set("Sec-Fetch-Site", "cross-site")
	})
	wantStatus(t, "cross-site jobs post", cross, http.StatusForbidden)
}

// SearchRouteEvents pages by start time (newest first, a request recorded
// late in its start-time place), stable as new requests come; filters by
// session and start-time range. FailedAttempts counts every failed
// attempt of a range by account, status, class and error type, those a
// failover hid included, never holds or successes.
func TestDashboardRequestsPagesAndFailures(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, _ := e.createAccount(acct{label: "pages-a"})
	b, _ := e.createAccount(acct{label: "pages-b"})
	now := e.clock.Now()
	// Seven requests a minute apart, reported out of order; the oldest
	// two of session s-old.
	for _, i := range []int{3, 0, 6, 1, 5, 2, 4} {
		session := "s-new"
		if i < 2 {
			session = "s-old"
		}
		ev := &weirv1.RouteEvent{RequestId: fmt.Sprintf("p%d", i), Status: 200, SessionKey: session, AccountId: b.Id,
			StartedAt: timestamppb.New(now.Add(time.Duration(i-10) * time.Minute))}
		if i == 4 {
			// A 429 on a, failed over to b: hidden from the client.
			ev.AttemptRecords = []*weirv1.AttemptRecord{
				{At: durationpb.New(0), AccountId: a.Id, Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, ErrorType: "rate_limit_error"},
				{At: durationpb.New(0), HoldReason: "every attempt of the round failed", Duration: durationpb.New(time.Second)},
				{At: durationpb.New(time.Second), AccountId: b.Id, Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200},
			}
		}
		if i == 6 {
			ev.Status = 529
			ev.AttemptRecords = []*weirv1.AttemptRecord{{At: durationpb.New(0), AccountId: b.Id, Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, Status: 529, ErrorType: "overloaded_error"}}
		}
		e.report(ev)
	}
	dash := e.srv.dashboardService()
	page := func(req *weirv1.SearchRouteEventsRequest) ([]string, string) {
		t.Helper()
		res, err := dash.SearchRouteEvents(t.Context(), connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, ev := range res.Msg.Events {
			ids = append(ids, ev.RequestId)
		}
		return ids, res.Msg.NextPageToken
	}
	ids, next := page(&weirv1.SearchRouteEventsRequest{Limit: 3})
	if !slices.Equal(ids, []string{"p6", "p5", "p4"}) || next == "" {
		t.Fatalf("first page %v (next %q), want p6 p5 p4 and more", ids, next)
	}
	// A request that starts now comes on the first page, not the second.
	e.report(&weirv1.RouteEvent{RequestId: "p7", Status: 200, StartedAt: timestamppb.New(now)})
	if ids, next = page(&weirv1.SearchRouteEventsRequest{Limit: 3, PageToken: next}); !slices.Equal(ids, []string{"p3", "p2", "p1"}) {
		t.Fatalf("second page %v, want p3 p2 p1", ids)
	}
	if ids, next = page(&weirv1.SearchRouteEventsRequest{Limit: 3, PageToken: next}); !slices.Equal(ids, []string{"p0"}) || next != "" {
		t.Fatalf("last page %v (next %q), want p0 and no more", ids, next)
	}
	if ids, _ = page(&weirv1.SearchRouteEventsRequest{SessionKey: "s-old"}); !slices.Equal(ids, []string{"p1", "p0"}) {
		t.Errorf("session s-old: %v", ids)
	}
	if ids, _ = page(&weirv1.SearchRouteEventsRequest{Since: timestamppb.New(now.Add(-5 * time.Minute)), Until: timestamppb.New(now.Add(-3 * time.Minute))}); !slices.Equal(ids, []string{"p6", "p5"}) {
		t.Errorf("started in [-5m, -3m): %v", ids)
	}
	_, err := dash.SearchRouteEvents(t.Context(), connect.NewRequest(&weirv1.SearchRouteEventsRequest{PageToken: "x"}))
	wantCode(t, toConnect(err), connect.CodeInvalidArgument)

	f, err := dash.FailedAttempts(t.Context(), connect.NewRequest(&weirv1.FailedAttemptsRequest{Since: timestamppb.New(now.Add(-time.Hour))}))
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		account string
		status  int32
		class   weirv1.OutcomeClass
		errType string
		n       int64
	}
	var got []row
	for _, c := range f.Msg.Counts {
		got = append(got, row{c.AccountId, c.Status, c.Class, c.ErrorType, c.Attempts})
	}
	slices.SortFunc(got, func(x, y row) int { return int(x.status - y.status) })
	want := []row{{a.Id, 429, weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, "rate_limit_error", 1}, {b.Id, 529, weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, "overloaded_error", 1}}
	if !slices.Equal(got, want) {
		t.Errorf("failed attempts %+v, want %+v", got, want)
	}
	_, err = dash.FailedAttempts(t.Context(), connect.NewRequest(&weirv1.FailedAttemptsRequest{Since: timestamppb.New(now.Add(-8 * 24 * time.Hour))}))
	wantCode(t, toConnect(err), connect.CodeInvalidArgument)

	// The page: the session column links to the session's requests, the
	// failed attempts are listed, and a page past the first does not
	// refresh itself (its rows would move).
	br := e.browser()
	br.login(e.cfg.AdminToken)
	p := br.get("/dashboard/requests")
	for _, want := range []string{`<td data-label="Session"><a href="/dashboard/requests?session=s-new"`, `table class="cards failed"`, `id="live-pause"`} {
		if !strings.Contains(p.body, want) {
			i := strings.Index(p.body, `data-label="Session"`)
			t.Errorf("requests page lacks %q: %.300s", want, p.body[max(i, 0):])
		}
	}
	if p = br.get("/dashboard/requests?range=1h&page=" + url.QueryEscape(next0(t, dash))); strings.Contains(p.body, "data-fragment") || !strings.Contains(p.body, "Newest") {
		t.Errorf("a later page refreshes itself or has no way back to the newest")
	}
	wantStatus(t, "bad range", br.get("/dashboard/requests?range=2y"), http.StatusBadRequest)
}

// next0 is the token of the first page after a page of one.
func next0(t *testing.T, dash dashboardService) string {
	t.Helper()
	res, err := dash.SearchRouteEvents(t.Context(), connect.NewRequest(&weirv1.SearchRouteEventsRequest{Limit: 1}))
	if err != nil || res.Msg.NextPageToken == "" {
		t.Fatalf("no next page: %v", err)
	}
	return res.Msg.NextPageToken
}

// The account page: an account given a cooldown by a 429 shows it in its
// history with the evidence, its failed attempt, its request and the
// operator's call that named it (a pause); every account row links to it.
func TestDashboardAccountPage(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, _ := e.createAccount(acct{label: "page-acct"})
	_, keyHash := e.createKey("")
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: "claude-sonnet-4-5"})
	e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, ErrorType: "rate_limit_error",
		Headers: map[string]string{"retry-after": "600"}})
	e.report(&weirv1.RouteEvent{RequestId: "acct-req", Status: 429, AccountId: a.Id, StartedAt: timestamppb.New(e.clock.Now()),
		AttemptRecords: []*weirv1.AttemptRecord{{At: durationpb.New(0), AccountId: a.Id, Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, ErrorType: "rate_limit_error"}}})
	if _, err := e.admin.accounts.PauseAccount(t.Context(), connect.NewRequest(&weirv1.PauseAccountRequest{Id: a.Id})); err != nil {
		t.Fatal(err)
	}
	h, err := e.srv.dashboardService().AccountHistory(t.Context(), connect.NewRequest(&weirv1.AccountHistoryRequest{AccountId: "page-acct"}))
	if err != nil || len(h.Msg.Entries) != 1 || h.Msg.Entries[0].Kind != "cooldown" || h.Msg.Entries[0].Status != 429 ||
		h.Msg.Entries[0].Reason != "rate_limited" {
		t.Fatalf("history %v, %v; want the 429's cooldown", h, err)
	}
	b := e.browser()
	b.login(e.cfg.AdminToken)
	if p := b.get("/dashboard/"); !strings.Contains(p.body, `<a href="/dashboard/accounts/`+a.Id+`">page-acct</a>`) {
		t.Error("the account row does not link to its page")
	}
	p := b.get("/dashboard/accounts/" + a.Id)
	wantStatus(t, "account page", p, http.StatusOK)
	for _, want := range []string{"Account page-acct", "Cooldowns and gates", "rate limited", "429", "rate_limit_error",
		`href="/dashboard/requests/acct-req"`, "PauseAccount", "paused"} {
		if !strings.Contains(p.body, want) {
			t.Errorf("account page lacks %q", want)
		}
	}
	if err := wellFormed(p.body); err != nil {
		t.Errorf("account page not well formed: %v", err)
	}
	wantStatus(t, "no such account", b.get("/dashboard/accounts/no-such"), http.StatusNotFound)
}

// The accounts page opens on the pool as `weir status` sums it up: how
// many accounts of each provider can serve now, the next one back, what
// is wrong with a link to each account concerned; the live fragment
// carries it too.
func TestDashboardPoolHeader(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ok, _ := e.createAccount(acct{label: "hdr-ok"})
	cool, _ := e.createAccount(acct{label: "hdr-cool"})
	_, keyHash := e.createKey("")
	// hdr-cool meets a 429 while hdr-ok is paused, then hdr-ok comes back.
	e.pause(ok.Id)
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash, Model: "claude-sonnet-4-5"})
	e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429, Headers: map[string]string{"retry-after": "600"}})
	e.resume(ok.Id)
	b := e.browser()
	b.login(e.cfg.AdminToken)
	for _, path := range []string{"/dashboard/", "/dashboard/fragment/accounts"} {
		p := b.get(path)
		for _, want := range []string{`class="pool-header"`, "<strong>anthropic</strong>", "1 / 2</span> can serve now",
			"Next back: <strong>hdr-cool</strong>", `<a href="/dashboard/accounts/` + cool.Id + `">hdr-cool</a>`, "No request held now."} {
			if !strings.Contains(p.body, want) {
				i := strings.Index(p.body, "pool-header")
				t.Errorf("%s lacks %q: %.600s", path, want, p.body[max(i, 0):])
			}
		}
	}
}
