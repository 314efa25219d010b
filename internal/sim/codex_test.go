package sim

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	whamPath        = "/backend-api/wham/usage"
	openAITokenPath = "/oauth/token"
	refreshCodex    = "rt_codexrefreshcodexrefresh0001"
	codexClientID   = "app_EMoamEEZ73f0CkXaXp7hrann"
	// tokClaimed is a JWT whose payload is
	// {"https://api.openai.com/auth":{"chatgpt_account_id":"acct-from-jwt"}}.
	tokClaimed = "eyJhbGciOiJSUzI1NiJ9.eyJodHRwczovL2FwaS5vcGVuYWkuY29tL2F1dGgiOnsiY2hhdGdwdF9hY2NvdW50X2lkIjoiYWNjdC1mcm9tLWp3dCJ9fQ.c2ln"
)

// codexScript is openAIScript with a refreshable ChatGPT login that has
// live windows, one whose id comes from its JWT and one with a scripted id.
func codexScript() Script {
	sc := openAIScript()
	sc.Accounts = append(sc.Accounts,
		AccountScript{Name: "live", Credential: "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJsaXZlIn0.c2ln", Kind: KindChatGPT,
			RefreshToken: refreshCodex, UsageReadsPer10m: -1,
			Windows: &Windows{
				FiveHour: &Window{Limit: 1000, Used: 125, ResetIn: Duration(2 * time.Hour)},
				SevenDay: &Window{Limit: 100000, Used: 25000, ResetIn: Duration(72 * time.Hour)},
			}},
		AccountScript{Name: "claimed", Credential: tokClaimed, Kind: KindChatGPT},
		AccountScript{Name: "named", Credential: "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJuIn0.c2ln", Kind: KindChatGPT, ChatGPTAccountID: "acct-scripted"},
		AccountScript{Name: "sub-o", Credential: tokO, Kind: KindOAuth, RefreshToken: refreshR},
	)
	return sc
}

func codexSetup(t *testing.T) *bundle {
	t.Helper()
	return setup(t, Config{ManualClock: true, Script: codexScript(), Deltas: 3})
}

// liveHeaders authenticates as the "live" account with credential tok.
func (b *bundle) liveHeaders(t *testing.T, tok string) http.Header {
	t.Helper()
	id, ok := b.sim.ChatGPTAccountID("live")
	if !ok {
		t.Fatal("live has no account id")
	}
	return chatgptHeadersFor(tok, id)
}

func TestChatGPTAccountID(t *testing.T) {
	t.Parallel()
	b := codexSetup(t)
	for _, tc := range []struct {
		name, want string
		ok         bool
	}{
		{"codex", derivedChatGPTAccountID("codex"), true},
		{"claimed", "acct-from-jwt", true},
		{"named", "acct-scripted", true},
		{"oai", "", false},
		{"sub-o", "", false},
		{"nobody", "", false},
	} {
		if got, ok := b.sim.ChatGPTAccountID(tc.name); got != tc.want || ok != tc.ok {
			t.Errorf("ChatGPTAccountID(%q) = %q, %v; want %q, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
	if id := derivedChatGPTAccountID("codex"); len(id) != 36 || strings.Count(id, "-") != 4 || id == derivedChatGPTAccountID("codex2") {
		t.Errorf("derived id %q", id)
	}

	for _, tc := range []struct {
		name, tok, id string
		status        int
		message       string
	}{
		{"derived", tokChatGPT, derivedChatGPTAccountID("codex"), 200, ""},
		{"from the jwt", tokClaimed, "acct-from-jwt", 200, ""},
		{"scripted", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJuIn0.c2ln", "acct-scripted", 200, ""},
		{"other account's id", tokChatGPT, "acct-scripted", 401, "chatgpt-account-id does not match"},
		{"empty id", tokChatGPT, " ", 401, "Missing chatgpt-account-id header."},
	} {
		for _, path := range []string{codexPath, whamPath} {
			method, body := "POST", responsesBody(false)
			if path == whamPath {
				method, body = "GET", ""
			}
			resp, data := b.call(t, method, path, chatgptHeadersFor(tc.tok, tc.id), body)
			if tc.status == 200 {
				if resp.StatusCode != 200 {
					t.Errorf("%s %s: %d %s", tc.name, path, resp.StatusCode, data)
				}
			} else {
				wantOpenAIError(t, resp, data, tc.status, "invalid_request_error", "", tc.message)
			}
			if a := b.nextAttempt(t); a.Status != tc.status || a.Path != path {
				t.Errorf("%s %s: attempt %+v", tc.name, path, a)
			}
		}
	}

	// A discovered ChatGPT login accepts any account id.
	sc := openAIScript()
	sc.AcceptUnknown = true
	d := setup(t, Config{Script: sc})
	for _, id := range []string{"a", "b"} {
		if resp, data := d.call(t, "POST", codexPath, chatgptHeadersFor("eyJnew.token.sig", id), responsesBody(false)); resp.StatusCode != 200 {
			t.Errorf("discovered, id %q: %d %s", id, resp.StatusCode, data)
		}
		a := d.nextAttempt(t)
		if _, ok := d.sim.ChatGPTAccountID(a.Account); ok || !strings.HasPrefix(a.Account, "key-") {
			t.Errorf("discovered account %q has an id", a.Account)
		}
	}
}

func TestWhamUsage(t *testing.T) {
	t.Parallel()
	resetIn := func(d time.Duration) string {
		return fmt.Sprintf(`"reset_after_seconds":%d,"reset_at":%d`, int64(d/time.Second), testNow.Add(d).Unix())
	}
	fiveHour := func(at time.Time) time.Duration { return fiveHourReset(at).Sub(at) }
	sevenDay := func(at time.Time) time.Duration { return sevenDayReset(at).Sub(at) }
	for _, tc := range []struct {
		name string
		acct AccountScript
		want string
	}{
		{"static", AccountScript{FiveHourUtilization: 0.25, SevenDayUtilization: 0.625},
			`{"plan_type":"plus","rate_limit":{"allowed":true,"limit_reached":false,` +
				`"primary_window":{"used_percent":25,"limit_window_seconds":18000,` + resetIn(fiveHour(testNow)) + `},` +
				`"secondary_window":{"used_percent":62,"limit_window_seconds":604800,` + resetIn(sevenDay(testNow)) + `}},"credits":null}`},
		{"static full", AccountScript{SevenDayUtilization: 1},
			`{"plan_type":"plus","rate_limit":{"allowed":false,"limit_reached":true,` +
				`"primary_window":{"used_percent":0,"limit_window_seconds":18000,` + resetIn(fiveHour(testNow)) + `},` +
				`"secondary_window":{"used_percent":100,"limit_window_seconds":604800,` + resetIn(sevenDay(testNow)) + `}},"credits":null}`},
		{"live", AccountScript{Windows: &Windows{
			FiveHour: &Window{Limit: 1000, Used: 999, ResetIn: Duration(time.Hour)},
			SevenDay: &Window{Limit: 1000, Used: 125, ResetIn: Duration(100 * time.Hour)},
		}},
			`{"plan_type":"plus","rate_limit":{"allowed":true,"limit_reached":false,` +
				`"primary_window":{"used_percent":99,"limit_window_seconds":18000,` + resetIn(time.Hour) + `},` +
				`"secondary_window":{"used_percent":12,"limit_window_seconds":604800,` + resetIn(100*time.Hour) + `}},"credits":null}`},
		{"live full, no weekly", AccountScript{Windows: &Windows{FiveHour: &Window{Limit: 10, Used: 10, ResetIn: Duration(time.Hour)}}},
			`{"plan_type":"plus","rate_limit":{"allowed":false,"limit_reached":true,` +
				`"primary_window":{"used_percent":100,"limit_window_seconds":18000,` + resetIn(time.Hour) + `},` +
				`"secondary_window":null},"credits":null}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			as := tc.acct
			as.Name, as.Credential, as.Kind = "codex", tokChatGPT, KindChatGPT
			b := setup(t, Config{ManualClock: true, Script: Script{Accounts: []AccountScript{as}}})
			resp, data := b.call(t, "GET", whamPath, chatgptHeaders(tokChatGPT), "")
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("%d %s", resp.StatusCode, data)
			}
			if got := strings.TrimSpace(string(data)); got != tc.want {
				t.Errorf("body\n%s\nwant\n%s", got, tc.want)
			}
			want := Attempt{Time: testNow, Account: "codex", Path: whamPath, BodySHA256: bodyHash(""), Outcome: outcomeOK, Status: 200}
			if a := b.nextAttempt(t); a != want {
				t.Errorf("attempt %+v, want %+v", a, want)
			}
		})
	}
}

func TestWhamUsageRefusals(t *testing.T) {
	t.Parallel()
	b := codexSetup(t)
	for _, tc := range []struct {
		name    string
		h       http.Header
		account string
	}{
		{"no bearer", http.Header{"Chatgpt-Account-Id": {"x"}}, ""},
		{"openai key", chatgptHeaders(keyOpenAI), ""},
		{"oauth token", oauthHeaders(tokO), ""},
		{"no account id", chatgptHeadersFor(tokChatGPT, ""), "codex"},
		{"revoked", chatgptHeaders(tokChatGone), "codex-gone"},
	} {
		resp, data := b.call(t, "GET", whamPath, tc.h, "")
		if resp.StatusCode != 401 || decode[openAIError](t, data).Error.Message == "" {
			t.Errorf("%s: %d %s", tc.name, resp.StatusCode, data)
		}
		if a := b.nextAttempt(t); a.Account != tc.account || a.Status != 401 || a.Path != whamPath {
			t.Errorf("%s: attempt %+v", tc.name, a)
		}
	}
	if resp, _ := b.call(t, "POST", whamPath, chatgptHeaders(tokChatGPT), ""); resp.StatusCode != 404 {
		t.Errorf("POST: %d", resp.StatusCode)
	}
	b.nextAttempt(t)

	// Four reads in ten minutes, then 429 until the oldest frees up.
	for i := range 4 {
		if resp, data := b.call(t, "GET", whamPath, chatgptHeaders(tokChatGPT), ""); resp.StatusCode != 200 {
			t.Fatalf("read %d: %d %s", i, resp.StatusCode, data)
		}
		b.nextAttempt(t)
		b.advance(t, time.Minute)
	}
	resp, data := b.call(t, "GET", whamPath, chatgptHeaders(tokChatGPT), "")
	wantOpenAIError(t, resp, data, 429, "requests", "rate_limit_exceeded", "")
	if got := resp.Header.Get("retry-after"); got != "360" {
		t.Errorf("retry-after %q, want 360", got)
	}
	if a := b.nextAttempt(t); a.Outcome != outcomeRateLimited || a.Status != 429 {
		t.Errorf("attempt %+v", a)
	}
	b.advance(t, 6*time.Minute)
	if resp, _ := b.call(t, "GET", whamPath, chatgptHeaders(tokChatGPT), ""); resp.StatusCode != 200 {
		t.Errorf("after the wait: %d", resp.StatusCode)
	}
}

// jwtClaims decodes the payload of a JWT-shaped token.
func jwtClaims(t *testing.T, tok string) map[string]any {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || !wellFormedCredential(tok) {
		t.Fatalf("not a JWT: %q", tok)
	}
	for _, p := range parts[:2] {
		raw, err := base64.RawURLEncoding.DecodeString(p)
		if err != nil || !json.Valid(raw) {
			t.Fatalf("JWT part %q: %v", p, err)
		}
	}
	raw, _ := base64.RawURLEncoding.DecodeString(parts[1])
	return decode[map[string]any](t, raw)
}

func (b *bundle) openAIRefresh(t *testing.T, refresh string) (*http.Response, []byte) {
	t.Helper()
	body := fmt.Sprintf(`{"client_id":%q,"grant_type":"refresh_token","refresh_token":%q,"scope":"openid profile email"}`, codexClientID, refresh)
	return b.call(t, "POST", openAITokenPath, http.Header{"Content-Type": {"application/json"}}, body)
}

func TestOpenAITokenRefresh(t *testing.T) {
	t.Parallel()
	b := codexSetup(t)
	oldTok := codexScript().Accounts[4].Credential
	id, _ := b.sim.ChatGPTAccountID("live")

	resp, data := b.openAIRefresh(t, refreshCodex)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("refresh: %d %s", resp.StatusCode, data)
	}
	tok := decode[tokenResponse](t, data)
	if tok.RefreshToken == "" || tok.RefreshToken == refreshCodex || !wellFormedCredential(tok.RefreshToken) || tok.ExpiresIn != 3600 {
		t.Fatalf("token response %s", data)
	}
	for _, jwt := range []string{tok.AccessToken, tok.IDToken} {
		c := jwtClaims(t, jwt)
		auth, _ := c[openAIAuthClaim].(map[string]any)
		if auth["chatgpt_account_id"] != id || c["exp"] != float64(testNow.Add(time.Hour).Unix()) {
			t.Errorf("claims %v, want account %q and exp now+1h", c, id)
		}
	}
	if a := b.nextAttempt(t); a.Path != openAITokenPath || a.Account != "live" || a.Outcome != outcomeOK || a.Status != 200 {
		t.Errorf("attempt %+v", a)
	}

	// The spent refresh token is refused.
	resp, data = b.openAIRefresh(t, refreshCodex)
	if resp.StatusCode != 401 || strings.TrimSpace(string(data)) != `{"error":"invalid_grant","error_description":"Refresh token not found or invalid"}` {
		t.Errorf("reused refresh token: %d %s", resp.StatusCode, data)
	}
	if a := b.nextAttempt(t); a.Account != "live" || a.Outcome != outcomeInvalidGrant || a.Status != 401 {
		t.Errorf("attempt %+v", a)
	}

	// The new access token serves the account on the backend and the
	// usage endpoint, with the same account id.
	for _, path := range []string{codexPath, whamPath} {
		method, body := "POST", responsesBody(false)
		if path == whamPath {
			method, body = "GET", ""
		}
		if resp, data := b.call(t, method, path, b.liveHeaders(t, tok.AccessToken), body); resp.StatusCode != 200 {
			t.Errorf("%s with the new token: %d %s", path, resp.StatusCode, data)
		}
		if a := b.nextAttempt(t); a.Account != "live" {
			t.Errorf("%s served by %q", path, a.Account)
		}
	}

	// The old access token works for 60 s, then has expired; the new one
	// expires at its exp.
	b.advance(t, 59*time.Second)
	if resp, _ := b.call(t, "POST", codexPath, b.liveHeaders(t, oldTok), responsesBody(false)); resp.StatusCode != 200 {
		t.Errorf("old token within the grace: %d", resp.StatusCode)
	}
	b.nextAttempt(t)
	b.advance(t, time.Second)
	expired := "Provided authentication token is expired. Please try signing in again."
	resp, data = b.call(t, "POST", codexPath, b.liveHeaders(t, oldTok), responsesBody(false))
	wantOpenAIError(t, resp, data, 401, "invalid_request_error", "token_expired", expired)
	if a := b.nextAttempt(t); a.Account != "live" || a.Outcome != outcomeTokenExpired {
		t.Errorf("attempt %+v", a)
	}
	b.advance(t, time.Hour-time.Minute)
	resp, data = b.call(t, "GET", whamPath, b.liveHeaders(t, tok.AccessToken), "")
	wantOpenAIError(t, resp, data, 401, "invalid_request_error", "token_expired", expired)
	b.nextAttempt(t)

	// A form-encoded refresh works too.
	form := "grant_type=refresh_token&client_id=" + codexClientID + "&refresh_token=" + tok.RefreshToken
	resp, data = b.call(t, "POST", openAITokenPath, http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, form)
	if resp.StatusCode != 200 {
		t.Errorf("form refresh: %d %s", resp.StatusCode, data)
	}
	b.nextAttempt(t)
	if got := b.sim.TokenRefreshes("live"); got != 3 {
		t.Errorf("TokenRefreshes %d, want 3 (two rotations and a reuse)", got)
	}
}

func TestOpenAITokenErrors(t *testing.T) {
	t.Parallel()
	b := codexSetup(t)
	json := http.Header{"Content-Type": {"application/json"}}
	for _, tc := range []struct {
		name, path, body string
		status           int
		code, account    string
	}{
		{"not json", openAITokenPath, `nope`, 400, "invalid_request", ""},
		{"grant type", openAITokenPath, `{"grant_type":"client_credentials","refresh_token":"x","client_id":"c"}`, 400, "unsupported_grant_type", ""},
		{"no client", openAITokenPath, `{"grant_type":"refresh_token","refresh_token":"` + refreshCodex + `"}`, 400, "invalid_request", ""},
		{"unknown", openAITokenPath, `{"grant_type":"refresh_token","refresh_token":"rt_nope","client_id":"c"}`, 401, "invalid_grant", ""},
		{"anthropic token at openai", openAITokenPath, `{"grant_type":"refresh_token","refresh_token":"` + refreshR + `","client_id":"c"}`, 401, "invalid_grant", ""},
		{"openai token at anthropic", tokenPath, `{"grant_type":"refresh_token","refresh_token":"` + refreshCodex + `","client_id":"c"}`, 400, "invalid_grant", ""},
	} {
		resp, data := b.call(t, "POST", tc.path, json, tc.body)
		if resp.StatusCode != tc.status || decode[oauthError](t, data).Error != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, resp.StatusCode, data, tc.status, tc.code)
		}
		if a := b.nextAttempt(t); a.Account != tc.account || a.Status != tc.status {
			t.Errorf("%s: attempt %+v", tc.name, a)
		}
	}
	// Nothing was spent.
	for _, name := range []string{"live", "sub-o"} {
		if got := b.sim.TokenRefreshes(name); got != 0 {
			t.Errorf("%s: TokenRefreshes %d", name, got)
		}
	}
	if resp, data := b.openAIRefresh(t, refreshCodex); resp.StatusCode != 200 {
		t.Errorf("refresh: %d %s", resp.StatusCode, data)
	}
	if resp, data := b.refresh(t, refreshR); resp.StatusCode != 200 || strings.Contains(string(data), "id_token") {
		t.Errorf("anthropic refresh: %d %s", resp.StatusCode, data)
	}
}

func TestGoogleFaults(t *testing.T) {
	t.Parallel()
	const info = `{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"%s","domain":"googleapis.com"}`
	const retry = `,{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"22s"}`
	body := func(reason, extra string) string {
		return `{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED","details":[` +
			fmt.Sprintf(info, reason) + extra + `]}}`
	}
	for _, tc := range []struct {
		name, path string
		f          Fault
		want       string
	}{
		{"quota on chat", chatURL, Fault{Kind: FaultGoogleQuotaExhausted, RetryAfter: 22}, body("QUOTA_EXHAUSTED", retry)},
		{"burst on chat", chatURL, Fault{Kind: FaultGoogleRateLimit, RetryAfter: 22}, body("RATE_LIMIT_EXCEEDED", retry)},
		{"quota without retry", responsesURL, Fault{Kind: FaultGoogleQuotaExhausted}, body("QUOTA_EXHAUSTED", "")},
		{"array", chatURL, Fault{Kind: FaultGoogleRateLimit, RetryAfter: 22, Array: true}, "[" + body("RATE_LIMIT_EXCEEDED", retry) + "]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := openAISetup(t)
			if err := b.sim.AddFaults("oai", tc.f); err != nil {
				t.Fatal(err)
			}
			req := chatBody(true)
			if tc.path == responsesURL {
				req = responsesBody(true)
			}
			resp, data := b.call(t, "POST", tc.path, openAIKeyHeaders(keyOpenAI), req)
			if resp.StatusCode != 429 || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("%d %s", resp.StatusCode, data)
			}
			if got := strings.TrimSpace(string(data)); got != tc.want {
				t.Errorf("body\n%s\nwant\n%s", got, tc.want)
			}
			if a := b.nextAttempt(t); a.Outcome != tc.f.Kind || a.Status != 429 || a.Account != "oai" {
				t.Errorf("attempt %+v", a)
			}
		})
	}
}

// chatLines reads a chat stream strictly as "data: X\n\n" blocks.
func chatLines(t *testing.T, data []byte) []string {
	t.Helper()
	var payloads []string
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || !sc.Scan() || sc.Text() != "" {
			t.Fatalf("bad chat stream %q", data)
		}
		payloads = append(payloads, line)
	}
	return payloads
}

func TestInStreamFaults(t *testing.T) {
	t.Parallel()
	resetsAt := testNow.Unix() + 1800
	usageFailed := fmt.Sprintf(`{"code":"usage_limit_reached","message":"The usage limit has been reached","resets_at":%d,"resets_in_seconds":1800}`, resetsAt)
	capacityFailed := `{"code":"server_is_overloaded","message":"Selected model is at capacity. Please try a different model."}`
	for _, tc := range []struct {
		name string
		f    Fault
		// events is the Responses stream's event names; last is the data
		// of its last event, with the response's error for response.failed.
		events []string
		last   string
		// chat is the chat stream's payload kinds ("role", "content",
		// "error"), chatErr its error line.
		chat    []string
		chatErr string
		// status and outcome without a stream.
		status int
	}{
		{"usage limit event", Fault{Kind: FaultUsageLimitEvent, RetryAfter: 1800},
			[]string{"response.created", "response.failed"}, usageFailed,
			[]string{"error"}, fmt.Sprintf(`{"error":{"message":"The usage limit has been reached","type":"usage_limit_reached","param":null,"code":"usage_limit_reached","resets_at":%d,"resets_in_seconds":1800}}`, resetsAt),
			429},
		{"at capacity after output", Fault{Kind: FaultAtCapacityAfterOutput},
			[]string{"response.created", "response.output_item.added", "response.output_text.delta", "response.output_text.delta", "response.failed"}, capacityFailed,
			[]string{"role", "content", "content", "error"}, `{"error":{"message":"Selected model is at capacity. Please try a different model.","type":"server_error","param":null,"code":"server_is_overloaded"}}`,
			503},
		{"at capacity error event", Fault{Kind: FaultAtCapacityErrorEvent},
			[]string{"response.created", "error"}, `{"code":"server_is_overloaded","message":"Selected model is at capacity. Please try a different model.","param":null,"sequence_number":1,"type":"error"}`,
			[]string{"error"}, `{"error":{"message":"Selected model is at capacity. Please try a different model.","type":"server_error","param":null,"code":"server_is_overloaded"}}`,
			503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := openAISetup(t)
			f := tc.f
			f.Times = 3
			if err := b.sim.AddFaults("codex", f); err != nil {
				t.Fatal(err)
			}
			f.Times = 2
			if err := b.sim.AddFaults("oai", f); err != nil {
				t.Fatal(err)
			}
			// The Responses stream, on the Codex backend and /v1/responses.
			for _, rq := range []struct {
				path string
				h    http.Header
			}{{codexPath, chatgptHeaders(tokChatGPT)}, {responsesURL, openAIKeyHeaders(keyOpenAI)}} {
				resp, data := b.call(t, "POST", rq.path, rq.h, responsesBody(true))
				events, err := readEvents(strings.NewReader(string(data)))
				if err != nil || resp.StatusCode != 200 {
					t.Fatalf("%s: %d %v", rq.path, resp.StatusCode, err)
				}
				if got := eventNames(events); !slices.Equal(got, tc.events) {
					t.Fatalf("%s: events %v, want %v", rq.path, got, tc.events)
				}
				checkSequence(t, events)
				last := events[len(events)-1].data
				if events[len(events)-1].name == "response.failed" {
					var ev struct {
						Response struct {
							Status string          `json:"status"`
							Error  json.RawMessage `json:"error"`
						} `json:"response"`
					}
					json.Unmarshal([]byte(last), &ev) //nolint:errcheck // checked by readEvents
					if ev.Response.Status != "failed" {
						t.Errorf("%s: status %q", rq.path, ev.Response.Status)
					}
					last = string(ev.Response.Error)
				}
				if last != tc.last {
					t.Errorf("%s: last event\n%s\nwant\n%s", rq.path, last, tc.last)
				}
				if a := b.nextAttempt(t); a.Outcome != tc.f.Kind || a.Status != 200 || !a.Stream || a.Path != rq.path {
					t.Errorf("attempt %+v", a)
				}
			}
			// The chat stream.
			resp, data := b.call(t, "POST", chatURL, openAIKeyHeaders(keyOpenAI), chatBody(true))
			if resp.StatusCode != 200 {
				t.Fatalf("chat: %d", resp.StatusCode)
			}
			var kinds []string
			payloads := chatLines(t, data)
			for _, p := range payloads {
				var ch struct {
					Error   json.RawMessage `json:"error"`
					Choices []struct {
						Delta struct {
							Role    string  `json:"role"`
							Content *string `json:"content"`
						} `json:"delta"`
					} `json:"choices"`
				}
				if err := json.Unmarshal([]byte(p), &ch); err != nil {
					t.Fatalf("chat payload %q: %v", p, err)
				}
				switch {
				case ch.Error != nil:
					kinds = append(kinds, "error")
				case len(ch.Choices) == 1 && ch.Choices[0].Delta.Role == "assistant":
					kinds = append(kinds, "role")
				default:
					kinds = append(kinds, "content")
				}
			}
			if !slices.Equal(kinds, tc.chat) || payloads[len(payloads)-1] != tc.chatErr {
				t.Errorf("chat stream %v, want %v; last %s\nwant %s", kinds, tc.chat, payloads[len(payloads)-1], tc.chatErr)
			}
			if a := b.nextAttempt(t); a.Outcome != tc.f.Kind || a.Status != 200 || a.Path != chatURL {
				t.Errorf("chat attempt %+v", a)
			}
			// Without a stream.
			resp, data = b.call(t, "POST", codexPath, chatgptHeaders(tokChatGPT), responsesBody(false))
			if tc.status == 429 {
				want := fmt.Sprintf(`{"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"plus","resets_at":%d,"resets_in_seconds":1800}}`, resetsAt)
				if resp.StatusCode != 429 || strings.TrimSpace(string(data)) != want {
					t.Errorf("without a stream: %d %s", resp.StatusCode, data)
				}
			} else {
				wantOpenAIError(t, resp, data, tc.status, "server_error", "server_is_overloaded", atCapacityMessage)
			}
			if a := b.nextAttempt(t); a.Outcome != tc.f.Kind || a.Status != tc.status {
				t.Errorf("attempt %+v", a)
			}
		})
	}
}

func TestNewFaultsOnMessages(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	for _, tc := range []struct {
		kind   string
		stream bool
		status int
		events []string
	}{
		{FaultUsageLimitEvent, true, 429, nil},
		{FaultGoogleQuotaExhausted, false, 429, nil},
		{FaultGoogleRateLimit, true, 429, nil},
		{FaultAtCapacityErrorEvent, true, 200, []string{"message_start", "error"}},
		{FaultAtCapacityAfterOutput, true, 200, []string{"message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta", "error"}},
		{FaultAtCapacityAfterOutput, false, 529, nil},
	} {
		if err := b.sim.AddFaults("key-a", Fault{Kind: tc.kind}); err != nil {
			t.Fatal(err)
		}
		resp, data := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, tc.stream))
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d %s", tc.kind, resp.StatusCode, data)
		}
		if tc.events != nil {
			events, err := readEvents(strings.NewReader(string(data)))
			if err != nil || !slices.Equal(eventNames(events), tc.events) {
				t.Errorf("%s: events %v %v", tc.kind, eventNames(events), err)
			}
		}
		if a := b.nextAttempt(t); a.Outcome != tc.kind || a.Status != tc.status {
			t.Errorf("%s: attempt %+v", tc.kind, a)
		}
	}
}

func TestCodexWindowsUsageLimit(t *testing.T) {
	t.Parallel()
	as := AccountScript{Name: "codex", Credential: tokChatGPT, Kind: KindChatGPT, Windows: &Windows{
		FiveHour: &Window{Limit: 10_000, Used: 9_990, ResetIn: Duration(2 * time.Hour)},
		SevenDay: &Window{Limit: 1_000_000, Used: 0, ResetIn: Duration(50 * time.Hour)},
	}}
	b := setup(t, Config{ManualClock: true, Deltas: 3, Script: Script{Accounts: []AccountScript{as}}})
	if err := b.sim.AddFaults("codex", Fault{Kind: FaultAtCapacityEvent}); err != nil {
		t.Fatal(err)
	}
	// The fault is used up first; it charges nothing.
	if resp, _ := b.call(t, "POST", codexPath, chatgptHeaders(tokChatGPT), responsesBody(false)); resp.StatusCode != 503 {
		t.Fatalf("fault: %d", resp.StatusCode)
	}
	b.nextAttempt(t)
	// The success fills the five-hour window; its headers show the state
	// before it.
	resp, _ := b.call(t, "POST", codexPath, chatgptHeaders(tokChatGPT), responsesBody(true))
	if resp.StatusCode != 200 || resp.Header.Get("x-codex-primary-used-percent") != "99.9" || resp.Header.Get("x-codex-secondary-used-percent") != "0" {
		t.Fatalf("success: %d %v", resp.StatusCode, resp.Header)
	}
	b.nextAttempt(t)
	st, _ := b.sim.Windows("codex")
	if st.FiveHour.Used <= 10_000 || st.SevenDay.Used != st.FiveHour.Used-9_990 {
		t.Fatalf("windows after the success %+v %+v", st.FiveHour, st.SevenDay)
	}
	// Now the window is full: 429 usage_limit_reached until its reset.
	if err := b.sim.AddFaults("codex", Fault{Kind: FaultOverloaded}); err != nil {
		t.Fatal(err)
	}
	reset := testNow.Add(2 * time.Hour)
	for _, stream := range []bool{false, true} {
		resp, data := b.call(t, "POST", codexPath, chatgptHeaders(tokChatGPT), responsesBody(stream))
		want := fmt.Sprintf(`{"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"plus","resets_at":%d,"resets_in_seconds":7200}}`, reset.Unix())
		if resp.StatusCode != 429 || strings.TrimSpace(string(data)) != want {
			t.Errorf("full window: %d %s", resp.StatusCode, data)
		}
		if got := resp.Header.Get("x-codex-primary-used-percent"); got != "100" {
			t.Errorf("primary used-percent %q", got)
		}
		if a := b.nextAttempt(t); a.Outcome != outcomeUsageLimit || a.Status != 429 {
			t.Errorf("attempt %+v", a)
		}
	}
	resp, data := b.call(t, "GET", whamPath, chatgptHeaders(tokChatGPT), "")
	if u := decode[whamUsageBody](t, data); resp.StatusCode != 200 || !u.RateLimit.LimitReached || u.RateLimit.PrimaryWindow.UsedPercent != 100 {
		t.Errorf("usage endpoint: %s", data)
	}
	b.nextAttempt(t)

	// The weekly window, when it is the one resetting last, names its reset.
	b.advance(t, 2*time.Hour)
	if resp, _ := b.call(t, "POST", codexPath, chatgptHeaders(tokChatGPT), responsesBody(false)); resp.StatusCode != 503 {
		t.Errorf("after the reset, the queued fault: %d", resp.StatusCode)
	}
	b.nextAttempt(t)
	resp, _ = b.call(t, "POST", codexPath, chatgptHeaders(tokChatGPT), responsesBody(false))
	if resp.StatusCode != 200 || resp.Header.Get("x-codex-primary-used-percent") != "0" {
		t.Errorf("after the reset: %d %q", resp.StatusCode, resp.Header.Get("x-codex-primary-used-percent"))
	}
	b.nextAttempt(t)
	at, _ := strconv.ParseInt(resp.Header.Get("x-codex-primary-reset-at"), 10, 64)
	if at != testNow.Add(7*time.Hour).Unix() {
		t.Errorf("next five-hour reset %d", at)
	}
}

func TestCodexScriptValidation(t *testing.T) {
	t.Parallel()
	valid := AccountScript{Name: "c", Credential: tokChatGPT, Kind: KindChatGPT, RefreshToken: refreshCodex,
		AccessExpiresIn: Duration(time.Hour), UsageReadsPer10m: 2, ChatGPTAccountID: "acct-1",
		Windows: &Windows{FiveHour: &Window{Limit: 1}, SevenDay: &Window{Limit: 1}},
		Faults: []Fault{{Kind: FaultUsageLimitEvent}, {Kind: FaultAtCapacityAfterOutput}, {Kind: FaultAtCapacityErrorEvent},
			{Kind: FaultGoogleQuotaExhausted, Array: true}, {Kind: FaultGoogleRateLimit, RetryAfter: 22}}}
	if err := (Script{Accounts: []AccountScript{valid}}).Validate(); err != nil {
		t.Fatal(err)
	}
	bad := valid
	bad.ChatGPTAccountID = "has space"
	bad.Windows = &Windows{Families: map[string]FamilyWindow{FamilyOpus: {Window: Window{Limit: 1}}}, Overage: &Overage{}}
	bad.Grants = []Grant{{ID: "g"}}
	bad.Faults = []Fault{{Kind: FaultRateLimit, Array: true}}
	key := AccountScript{Name: "k", Credential: keyOpenAI, Kind: KindOpenAIKey, ChatGPTAccountID: "acct-2", RefreshToken: "rt_x"}
	err := Script{Accounts: []AccountScript{bad, key}}.Validate()
	for _, want := range []string{
		`accounts[0].chatgpt_account_id: "has space"`, "accounts[0].windows.families: only valid for oauth",
		"accounts[0].windows.overage: only valid for oauth", "accounts[0].grants: only valid for oauth",
		"accounts[0].faults[0].array: only valid for kinds", "accounts[1].chatgpt_account_id: only valid for chatgpt",
		"accounts[1].refresh_token: only valid for oauth and chatgpt",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v\nwant %q", err, want)
		}
	}
}
