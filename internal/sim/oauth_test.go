package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	refreshR  = "sk-ant-ort01-rrrrrrrrrrrrrrrrrrrrrrrr"
	clientID  = "9d1c250a-e61b-44d9-88ed-5944d1962f5e"
	usagePath = "/api/oauth/usage"
	tokenPath = "/v1/oauth/token"
)

// usage reads the usage endpoint, which must answer 200.
func (b *bundle) usage(t *testing.T, tok, query string) usageBody {
	t.Helper()
	resp, data := b.call(t, "GET", usagePath+query, oauthHeaders(tok), "")
	if resp.StatusCode != 200 {
		t.Fatalf("usage: %d %s", resp.StatusCode, data)
	}
	return decode[usageBody](t, data)
}

func (b *bundle) advance(t *testing.T, d time.Duration) {
	t.Helper()
	if err := b.sim.Advance(d); err != nil {
		t.Fatal(err)
	}
}

func TestUsageEndpointShape(t *testing.T) {
	t.Parallel()
	sc := windowed(&Windows{
		FiveHour: &Window{Limit: 1000, Used: 452, ResetIn: Duration(2 * time.Hour)},
		SevenDay: &Window{Limit: 1000, Used: 1500, ResetsAt: testNow.Add(51811 * time.Second)},
		Families: map[string]FamilyWindow{FamilySonnet: {Window: Window{Limit: 3, Used: 1, ResetIn: Duration(time.Hour)}}},
	})
	sc.Accounts[len(sc.Accounts)-1].UsageReadsPer10m = -1
	b := setup(t, Config{ManualClock: true, Script: sc})

	resp, data := b.call(t, "GET", usagePath, oauthHeaders(tokW), "")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, Content-Type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), data)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"five_hour":            fmt.Sprintf(`{"utilization":45.2,"resets_at":%q}`, testNow.Add(2*time.Hour).Format(time.RFC3339)),
		"seven_day":            `{"utilization":100,"resets_at":"2026-03-05T00:53:46Z"}`,
		"seven_day_oauth_apps": "null",
		"seven_day_opus":       "null",
		"seven_day_sonnet":     fmt.Sprintf(`{"utilization":33.3,"resets_at":%q}`, testNow.Add(time.Hour).Format(time.RFC3339)),
		"extra_usage":          `{"is_enabled":false,"monthly_limit":null,"used_credits":null,"utilization":null}`,
	}
	for k, v := range want {
		if got := string(raw[k]); got != v {
			t.Errorf("%s = %s, want %s", k, got, v)
		}
	}
	if len(raw) != len(want) {
		t.Errorf("keys %d, want %d: %s", len(raw), len(want), data)
	}
	if a := b.nextAttempt(t); a.Path != usagePath || a.Account != "win" || a.Outcome != outcomeOK || a.Status != 200 || a.Time != testNow {
		t.Errorf("attempt %+v", a)
	}

	// An account without windows reports its scripted utilizations.
	u := b.usage(t, tokO, "?include_grants=true")
	if u.FiveHour == nil || u.FiveHour.Utilization != 30 || u.FiveHour.ResetsAt != "2026-03-04T12:00:00Z" ||
		u.SevenDay == nil || u.SevenDay.Utilization != 85 || u.SevenDayOpus != nil || u.ResetGrants == nil || len(*u.ResetGrants) != 0 {
		t.Errorf("sub-o usage %+v", u)
	}

	// Auth: an OAuth bearer with the beta.
	noBeta := oauthHeaders(tokW)
	noBeta.Del("anthropic-beta")
	for name, h := range map[string]http.Header{
		"no beta":   noBeta,
		"api key":   apiKeyHeaders(keyA),
		"unknown":   oauthHeaders("sk-ant-oat01-unknownunknownunknown"),
		"revoked":   oauthHeaders(tokGone),
		"no bearer": {},
	} {
		t.Run(name, func(t *testing.T) {
			resp, data := b.call(t, "GET", usagePath, h, "")
			wantError(t, resp, data, 401, "authentication_error", "")
		})
	}
}

func TestUsageReadLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{ManualClock: true, Script: windowed(&Windows{FiveHour: &Window{Limit: 100}})})

	// Reads a minute apart: the 5th within 10 minutes of the 1st is refused
	// until the 1st is 10 minutes old.
	for range 4 {
		b.usage(t, tokW, "")
		b.advance(t, time.Minute)
	}
	resp, data := b.call(t, "GET", usagePath, oauthHeaders(tokW), "")
	wantError(t, resp, data, 429, "rate_limit_error", "")
	if got := resp.Header.Get("retry-after"); got != "360" {
		t.Errorf("retry-after %q, want 360", got)
	}
	// Refused reads do not count; another minute still is not enough.
	b.advance(t, 5*time.Minute)
	resp, _ = b.call(t, "GET", usagePath, oauthHeaders(tokW), "")
	if resp.StatusCode != 429 || resp.Header.Get("retry-after") != "60" {
		t.Errorf("status %d retry-after %q, want 429 and 60", resp.StatusCode, resp.Header.Get("retry-after"))
	}
	b.advance(t, time.Minute)
	b.usage(t, tokW, "")
	// The limit is per account: sub-o has all its reads.
	for range 4 {
		b.usage(t, tokO, "")
	}

	var paths, outcomes []string
	for _, a := range b.sim.Attempts() {
		paths = append(paths, a.Path)
		if a.Account == "win" {
			outcomes = append(outcomes, a.Outcome)
		}
	}
	if want := "ok ok ok ok rate_limited rate_limited ok"; strings.Join(outcomes, " ") != want {
		t.Errorf("outcomes %v, want %s", outcomes, want)
	}
	for _, p := range paths {
		if p != usagePath {
			t.Errorf("path %q", p)
		}
	}

	// Reset forgets the reads.
	b.sim.Reset()
	for range 4 {
		b.usage(t, tokO, "")
	}
}

func TestUsageReadLimitScripted(t *testing.T) {
	t.Parallel()
	sc := windowed(nil)
	sc.Accounts[len(sc.Accounts)-1].UsageReadsPer10m = 2
	sc.Accounts = append(sc.Accounts, AccountScript{Name: "free", Credential: "sk-ant-oat01-freefreefreefree", UsageReadsPer10m: -1})
	b := setup(t, Config{ManualClock: true, Script: sc})
	b.usage(t, tokW, "")
	b.usage(t, tokW, "")
	resp, _ := b.call(t, "GET", usagePath, oauthHeaders(tokW), "")
	if resp.StatusCode != 429 || resp.Header.Get("retry-after") != "600" {
		t.Errorf("3rd read: %d retry-after %q", resp.StatusCode, resp.Header.Get("retry-after"))
	}
	for range 20 {
		b.usage(t, "sk-ant-oat01-freefreefreefree", "")
	}
	b.advance(t, 10*time.Minute)
	b.usage(t, tokW, "")
}

// refresh posts a refresh_token grant.
func (b *bundle) refresh(t *testing.T, rt string) (*http.Response, []byte) {
	t.Helper()
	h := http.Header{"Content-Type": {"application/json"}}
	return b.call(t, "POST", tokenPath, h, fmt.Sprintf(`{"grant_type":"refresh_token","refresh_token":%q,"client_id":%q}`, rt, clientID))
}

func refreshable() Script {
	sc := windowed(&Windows{SevenDay: &Window{Limit: 100_000}})
	sc.Accounts[len(sc.Accounts)-1].RefreshToken = refreshR
	return sc
}

func TestTokenRefreshRotates(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{ManualClock: true, Script: refreshable()})
	body := messagesBody(sonnet, false)
	n := tokensOf(b, body)
	if resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), body); resp.StatusCode != 200 {
		t.Fatalf("before: %d", resp.StatusCode)
	}
	b.nextAttempt(t)

	resp, data := b.refresh(t, refreshR)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("refresh: %d %s", resp.StatusCode, data)
	}
	tok := decode[tokenResponse](t, data)
	if !strings.HasPrefix(tok.AccessToken, "sk-ant-oat01-") || tok.AccessToken == tokW || tok.RefreshToken == "" || tok.RefreshToken == refreshR ||
		tok.ExpiresIn != 28800 || tok.TokenType != "Bearer" {
		t.Fatalf("token response %s", data)
	}
	if a := b.nextAttempt(t); a.Path != tokenPath || a.Account != "win" || a.Outcome != outcomeOK || a.Status != 200 {
		t.Errorf("attempt %+v", a)
	}

	// The used refresh token is spent.
	resp, data = b.refresh(t, refreshR)
	if resp.StatusCode != 400 || strings.TrimSpace(string(data)) != `{"error":"invalid_grant","error_description":"Refresh token not found or invalid"}` {
		t.Errorf("reused refresh token: %d %s", resp.StatusCode, data)
	}
	if a := b.nextAttempt(t); a.Account != "win" || a.Outcome != outcomeInvalidGrant || a.Status != 400 {
		t.Errorf("attempt %+v", a)
	}

	// The new access token is the same account, with its windows.
	if resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tok.AccessToken), body); resp.StatusCode != 200 {
		t.Fatalf("new token: %d", resp.StatusCode)
	}
	if a := b.nextAttempt(t); a.Account != "win" {
		t.Errorf("new token served by %q", a.Account)
	}
	if st := b.windows(t, "win"); st.SevenDay.Used != 2*n {
		t.Errorf("seven_day used %d, want %d", st.SevenDay.Used, 2*n)
	}

	// The old access token works for a grace of 60 s, then has expired.
	b.advance(t, 59*time.Second)
	if resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), body); resp.StatusCode != 200 {
		t.Fatalf("old token within the grace: %d", resp.StatusCode)
	}
	b.nextAttempt(t)
	b.advance(t, time.Second)
	resp, data = b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), body)
	wantError(t, resp, data, 401, "authentication_error", "OAuth token has expired")
	if a := b.nextAttempt(t); a.Account != "win" || a.Outcome != outcomeTokenExpired {
		t.Errorf("attempt %+v", a)
	}
	resp, data = b.call(t, "GET", usagePath, oauthHeaders(tokW), "")
	wantError(t, resp, data, 401, "authentication_error", "OAuth token has expired")
	b.nextAttempt(t)

	// The new refresh token rotates again; the issued access token lives
	// 8 hours.
	resp, data = b.refresh(t, tok.RefreshToken)
	if resp.StatusCode != 200 {
		t.Fatalf("second refresh: %d %s", resp.StatusCode, data)
	}
	tok2 := decode[tokenResponse](t, data)
	b.advance(t, 8*time.Hour)
	resp, data = b.call(t, "POST", "/v1/messages", oauthHeaders(tok2.AccessToken), body)
	wantError(t, resp, data, 401, "authentication_error", "OAuth token has expired")

	if got := b.sim.TokenRefreshes("win"); got != 3 {
		t.Errorf("TokenRefreshes %d, want 3 (two rotations and a reuse)", got)
	}
	if got := b.sim.TokenRefreshes("sub-o"); got != 0 {
		t.Errorf("sub-o TokenRefreshes %d", got)
	}

	// The script shows the current tokens masked.
	_, data = b.call(t, "GET", "/_sim/script", nil, "")
	if strings.Contains(string(data), tok2.AccessToken[13:]) || strings.Contains(string(data), tok2.RefreshToken[13:]) {
		t.Errorf("script leaks a token: %s", data)
	}
	win := decode[Script](t, data).Accounts[len(testScript().Accounts)]
	if win.Credential != maskCredential(tok2.AccessToken) || win.RefreshToken != maskCredential(tok2.RefreshToken) || win.Windows == nil || win.Windows.SevenDay.Used != 3*n {
		t.Errorf("script account %+v", win)
	}
}

func TestTokenRefreshConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{ManualClock: true, Script: refreshable()})
	const n = 8
	statuses := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			h := http.Header{"Content-Type": {"application/json"}}
			resp, err := b.send(t, "POST", tokenPath, h, fmt.Sprintf(`{"grant_type":"refresh_token","refresh_token":%q,"client_id":%q}`, refreshR, clientID))
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		})
	}
	wg.Wait()
	ok := 0
	for _, s := range statuses {
		switch s {
		case 200:
			ok++
		case 400:
		default:
			t.Errorf("status %d", s)
		}
	}
	if ok != 1 {
		t.Errorf("%d refreshes succeeded, want exactly 1: %v", ok, statuses)
	}
	if got := b.sim.TokenRefreshes("win"); got != n {
		t.Errorf("TokenRefreshes %d, want %d", got, n)
	}
}

func TestTokenRefreshErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{ManualClock: true, Script: refreshable()})
	tests := []struct {
		body, code string
	}{
		{`not json`, "invalid_request"},
		{`{"grant_type":"client_credentials","refresh_token":"x","client_id":"c"}`, "unsupported_grant_type"},
		{`{"grant_type":"refresh_token","client_id":"c"}`, "invalid_request"},
		{`{"grant_type":"refresh_token","refresh_token":"` + refreshR + `"}`, "invalid_request"},
		{`{"grant_type":"refresh_token","refresh_token":"sk-ant-ort01-nope","client_id":"c"}`, "invalid_grant"},
	}
	for _, tt := range tests {
		resp, data := b.call(t, "POST", tokenPath, http.Header{"Content-Type": {"application/json"}}, tt.body)
		if resp.StatusCode != 400 || decode[oauthError](t, data).Error != tt.code {
			t.Errorf("%s: %d %s, want 400 %s", tt.body, resp.StatusCode, data, tt.code)
		}
	}
	// None spent the refresh token; the unknown one is no account's.
	if got := b.sim.TokenRefreshes("win"); got != 0 {
		t.Errorf("TokenRefreshes %d", got)
	}
	if resp, data := b.refresh(t, refreshR); resp.StatusCode != 200 {
		t.Errorf("refresh: %d %s", resp.StatusCode, data)
	}
}

func TestAccessExpiresIn(t *testing.T) {
	t.Parallel()
	sc := refreshable()
	sc.Accounts[len(sc.Accounts)-1].AccessExpiresIn = Duration(time.Hour)
	b := setup(t, Config{ManualClock: true, Script: sc})
	body := messagesBody(sonnet, false)
	b.advance(t, time.Hour-time.Second)
	if resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), body); resp.StatusCode != 200 {
		t.Fatalf("before expiry: %d", resp.StatusCode)
	}
	b.advance(t, time.Second)
	resp, data := b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), body)
	wantError(t, resp, data, 401, "authentication_error", "OAuth token has expired")

	resp, data = b.refresh(t, refreshR)
	if resp.StatusCode != 200 {
		t.Fatalf("refresh: %d %s", resp.StatusCode, data)
	}
	tok := decode[tokenResponse](t, data)
	if tok.ExpiresIn != 3600 {
		t.Errorf("expires_in %d, want 3600", tok.ExpiresIn)
	}
	// The expired token stays expired (no grace extends it).
	if resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), body); resp.StatusCode != 401 {
		t.Errorf("old token: %d", resp.StatusCode)
	}
	if resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tok.AccessToken), body); resp.StatusCode != 200 {
		t.Errorf("new token: %d", resp.StatusCode)
	}
}

// claim posts a reset grant claim and returns the result.
func (b *bundle) claim(t *testing.T, tok, grant, requestID string) string {
	t.Helper()
	body := fmt.Sprintf(`{"program":"max-resets","grant_id":%q,"request_id":%q}`, grant, requestID)
	resp, data := b.call(t, "POST", "/api/organizations/org-123/reset_rate_limits", oauthHeaders(tok), body)
	if resp.StatusCode != 200 {
		t.Fatalf("claim: %d %s", resp.StatusCode, data)
	}
	return decode[map[string]string](t, data)["result"]
}

func TestResetGrants(t *testing.T) {
	t.Parallel()
	sc := windowed(&Windows{
		FiveHour: &Window{Limit: 1_000_000, Used: 400},
		SevenDay: &Window{Limit: 1000, Used: 1000, ResetIn: Duration(50 * time.Hour)},
		Families: map[string]FamilyWindow{FamilyOpus: {Window: Window{Limit: 100, Used: 60}}},
	})
	acct := &sc.Accounts[len(sc.Accounts)-1]
	acct.UsageReadsPer10m = -1
	acct.Grants = []Grant{
		{ID: "g1", Program: "max-resets", ExpiresIn: Duration(24 * time.Hour)},
		{ID: "g2", Program: "max-resets", ExpiresAt: testNow.Add(48 * time.Hour)},
		{ID: "g3", Program: "max-resets", ExpiresIn: Duration(time.Hour)},
		{ID: "g4", Program: "max-resets"},
	}
	b := setup(t, Config{ManualClock: true, Script: sc})
	grants := func() string {
		var parts []string
		for _, g := range *b.usage(t, tokW, "?include_grants=true").ResetGrants {
			exp := "never"
			if g.ExpiresAt != nil {
				exp = *g.ExpiresAt
			}
			parts = append(parts, g.ID+"/"+g.Program+"/"+g.Status+"/"+exp)
		}
		return strings.Join(parts, " ")
	}
	status := func(model string) int {
		resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), messagesBody(model, false))
		return resp.StatusCode
	}
	// fill sends requests for model until the account turns them away.
	fill := func(model string) {
		for i := 0; status(model) == 200; i++ {
			if i > 100 {
				t.Fatal("the window does not fill")
			}
		}
	}

	if got, want := grants(), "g1/max-resets/available/2026-03-05T10:30:15Z g2/max-resets/available/2026-03-06T10:30:15Z g3/max-resets/available/2026-03-04T11:30:15Z g4/max-resets/available/never"; got != want {
		t.Errorf("grants %s, want %s", got, want)
	}
	if b.usage(t, tokW, "").ResetGrants != nil {
		t.Error("reset_grants without include_grants")
	}
	if got := status(sonnet); got != 429 {
		t.Fatalf("limited account: %d", got)
	}

	// Limited: the grant empties the weekly and family windows, not the
	// five-hour one, and keeps the weekly schedule.
	if got := b.claim(t, tokW, "g1", "req-1"); got != GrantReset {
		t.Fatalf("claim g1: %s", got)
	}
	st := b.windows(t, "win")
	if st.SevenDay.Used != 0 || st.Families[FamilyOpus].Used != 0 || st.FiveHour.Used != 400 || !st.SevenDay.ResetsAt.Equal(testNow.Add(50*time.Hour)) {
		t.Errorf("windows after the reset: 5h %+v 7d %+v opus %+v", st.FiveHour, st.SevenDay, st.Families[FamilyOpus])
	}
	if got := status(sonnet); got != 200 {
		t.Fatalf("after the reset: %d", got)
	}
	if a := b.sim.Attempts(); a[len(a)-2].Path != "/api/organizations/org-123/reset_rate_limits" || a[len(a)-2].Outcome != GrantReset || a[len(a)-2].Account != "win" {
		t.Errorf("attempt %+v", a[len(a)-2])
	}

	// Not limited: the grant is not spent.
	if got := b.claim(t, tokW, "g2", "req-2"); got != GrantNotLimited {
		t.Errorf("claim g2 while not limited: %s", got)
	}
	if got := b.claim(t, tokW, "g1", "req-3"); got != GrantAlreadyUsed {
		t.Errorf("claim used g1: %s", got)
	}
	if got := b.claim(t, tokW, "nope", "req-4"); got != GrantIneligible {
		t.Errorf("claim unknown grant: %s", got)
	}
	if got := b.claim(t, tokO, "g2", "req-5"); got != GrantIneligible {
		t.Errorf("claim another account's grant: %s", got)
	}

	// Limited again: replayed request ids answer as they first did and
	// spend nothing.
	fill(sonnet)
	if got := b.claim(t, tokW, "g1", "req-1"); got != GrantReset {
		t.Errorf("replay req-1: %s", got)
	}
	if got := b.claim(t, tokW, "g2", "req-1"); got != GrantReset {
		t.Errorf("replay req-1 naming another grant: %s", got)
	}
	if got := b.claim(t, tokW, "g2", "req-2"); got != GrantNotLimited {
		t.Errorf("replay req-2: %s", got)
	}
	if got := status(sonnet); got != 429 {
		t.Errorf("a replay reset the windows: %d", got)
	}
	if got := grants(); !strings.HasPrefix(got, "g1/max-resets/used/2026-03-05T10:30:15Z g2/max-resets/available/") {
		t.Errorf("grants %s", got)
	}
	if got := b.claim(t, tokW, "g2", "req-6"); got != GrantReset {
		t.Errorf("claim g2 while limited: %s", got)
	}

	// A spent family window is a limit too.
	fill(opus)
	if st := b.windows(t, "win"); st.SevenDay.Used >= 1000 || st.Families[FamilyOpus].Used < 100 {
		t.Fatalf("want only opus limited: 7d %+v opus %+v", st.SevenDay, st.Families[FamilyOpus])
	}
	if got := b.claim(t, tokW, "g4", "req-7"); got != GrantReset {
		t.Errorf("claim g4 while opus is limited: %s", got)
	}
	if got := status(opus); got != 200 {
		t.Errorf("opus after the reset: %d", got)
	}

	// An expired grant is unavailable.
	b.advance(t, time.Hour)
	if got := b.claim(t, tokW, "g3", "req-8"); got != GrantUnavailable {
		t.Errorf("claim expired g3: %s", got)
	}
	if got := grants(); !strings.Contains(got, "g3/max-resets/expired/") || !strings.Contains(got, "g2/max-resets/used/") || !strings.Contains(got, "g4/max-resets/used/never") {
		t.Errorf("grants %s", got)
	}

	// Malformed claims.
	for _, body := range []string{`{"grant_id":"g4"}`, `{"request_id":"x"}`, `[]`} {
		resp, data := b.call(t, "POST", "/api/organizations/o/reset_rate_limits", oauthHeaders(tokW), body)
		wantError(t, resp, data, 400, "invalid_request_error", "")
	}
	resp, data := b.call(t, "POST", "/api/organizations/o/reset_rate_limits", apiKeyHeaders(keyA), `{"grant_id":"g4","request_id":"x"}`)
	wantError(t, resp, data, 401, "authentication_error", "")
}

func TestClockEndpoint(t *testing.T) {
	t.Parallel()
	fixed := setup(t, Config{})
	resp, data := fixed.call(t, "POST", "/_sim/clock", nil, `{"advance":"2h"}`)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(decode[controlErrorBody](t, data).Error, "ManualClock") {
		t.Errorf("without a manual clock: %d %s", resp.StatusCode, data)
	}
	if err := fixed.sim.Advance(time.Hour); err == nil {
		t.Error("Advance without a manual clock succeeded")
	}
	if c := decode[clockBody](t, mustCall(t, fixed, "GET", "/_sim/clock", "")); !c.Now.Equal(testNow) || c.Manual {
		t.Errorf("clock %+v", c)
	}

	b := setup(t, Config{ManualClock: true})
	resp, data = b.call(t, "POST", "/_sim/clock", nil, `{"advance":"2h"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("advance: %d %s", resp.StatusCode, data)
	}
	if c := decode[clockBody](t, data); !c.Now.Equal(testNow.Add(2*time.Hour)) || !c.Manual {
		t.Errorf("clock %+v", c)
	}
	if err := b.sim.Advance(30 * time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := b.sim.Now(); !got.Equal(testNow.Add(150 * time.Minute)) {
		t.Errorf("Now %v", got)
	}
	// The clock is the simulator's: attempts and headers use it.
	resp, _ = b.call(t, "POST", "/v1/messages", oauthHeaders(tokO), messagesBody(sonnet, false))
	if got, want := resp.Header.Get("anthropic-ratelimit-unified-5h-reset"), epochOf(fiveHourReset(testNow.Add(150*time.Minute))); got != want {
		t.Errorf("5h-reset %s, want %s", got, want)
	}
	if a := b.nextAttempt(t); !a.Time.Equal(testNow.Add(150 * time.Minute)) {
		t.Errorf("attempt time %v", a.Time)
	}
	for _, body := range []string{`{"advance":"-1h"}`, `{"advance":7200}`, `{"advance":"2h","set":"x"}`} {
		if resp, data := b.call(t, "POST", "/_sim/clock", nil, body); resp.StatusCode != 400 {
			t.Errorf("%s: %d %s", body, resp.StatusCode, data)
		}
	}
	if got := b.sim.Now(); !got.Equal(testNow.Add(150 * time.Minute)) {
		t.Errorf("refused advances moved the clock to %v", got)
	}
}

func mustCall(t *testing.T, b *bundle, method, path, body string) []byte {
	t.Helper()
	resp, data := b.call(t, method, path, nil, body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, data)
	}
	return data
}

// TestWindowsConcurrentUse hammers the new state for the race detector.
func TestWindowsConcurrentUse(t *testing.T) {
	t.Parallel()
	sc := refreshable()
	sc.Accounts[len(sc.Accounts)-1].Windows.FiveHour = &Window{Limit: 2000}
	sc.Accounts[len(sc.Accounts)-1].Grants = []Grant{{ID: "g"}}
	b := setup(t, Config{ManualClock: true, Script: sc})
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			for j := range 8 {
				var resp *http.Response
				var err error
				switch (i + j) % 4 {
				case 0:
					resp, err = b.send(t, "POST", "/v1/messages", oauthHeaders(tokW), messagesBody(opus, j%2 == 0))
				case 1:
					resp, err = b.send(t, "GET", usagePath+"?include_grants=true", oauthHeaders(tokW), "")
				case 2:
					resp, err = b.send(t, "POST", "/api/organizations/o/reset_rate_limits", oauthHeaders(tokW), fmt.Sprintf(`{"grant_id":"g","request_id":"r%d"}`, j))
				case 3:
					resp, err = b.send(t, "GET", "/_sim/script", nil, "")
				}
				if err == nil {
					resp.Body.Close()
				}
			}
		})
	}
	wg.Go(func() {
		for range 10 {
			b.sim.Advance(time.Hour) //nolint:errcheck // manual clock
			b.sim.Windows("win")     //nolint:errcheck // exists
		}
	})
	wg.Go(func() {
		body := fmt.Sprintf(`{"grant_type":"refresh_token","refresh_token":%q,"client_id":%q}`, refreshR, clientID)
		if resp, err := b.send(t, "POST", tokenPath, http.Header{"Content-Type": {"application/json"}}, body); err == nil {
			resp.Body.Close()
		}
	})
	wg.Wait()
}
