package sim

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// authorize asks GET /oauth/authorize for a code, as JSON.
func (b *bundle) authorize(t *testing.T, params url.Values) (int, authorizeAnswer) {
	t.Helper()
	h := http.Header{}
	h.Set("Accept", "application/json")
	resp, body := b.call(t, http.MethodGet, "/oauth/authorize?"+params.Encode(), h, "")
	var a authorizeAnswer
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, &a); err != nil {
			t.Fatalf("authorize answer: %v: %s", err, body)
		}
	}
	return resp.StatusCode, a
}

func loginParams(clientID, redirect, verifier string) url.Values {
	return url.Values{
		"client_id": {clientID}, "response_type": {"code"}, "redirect_uri": {redirect},
		"code_challenge": {pkceChallenge(verifier)}, "code_challenge_method": {"S256"}, "state": {"st-123"},
	}
}

// TestLoginClaude: a Claude login's code is exchanged (JSON, with the
// state) for tokens that authenticate, and the profile names the account
// by a stable uuid. A wrong verifier or redirect_uri is refused, and a
// code is spent once.
func TestLoginClaude(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	const redirect, verifier = "https://console.anthropic.com/oauth/code/callback", "verifier-0123456789-0123456789-0123456789"
	status, a := b.authorize(t, loginParams(ClaudeClientID, redirect, verifier))
	if status != http.StatusOK || a.Code == "" || a.State != "st-123" || !strings.HasPrefix(a.RedirectURI, redirect+"?") {
		t.Fatalf("authorize: %d %+v", status, a)
	}
	exchange := func(code, verifier, redirect string) (*http.Response, []byte) {
		body, _ := json.Marshal(map[string]string{"grant_type": "authorization_code", "code": code, "state": "st-123",
			"client_id": ClaudeClientID, "redirect_uri": redirect, "code_verifier": verifier})
		return b.call(t, http.MethodPost, "/v1/oauth/token", http.Header{"Content-Type": {"application/json"}}, string(body))
	}
	if resp, body := exchange(a.Code, "another-verifier-0123456789-0123456789", redirect); resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "Invalid code verifier") {
		t.Fatalf("wrong verifier: %d %s", resp.StatusCode, body)
	}
	if resp, _ := exchange(a.Code, verifier, redirect); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a spent code: %d", resp.StatusCode)
	}
	_, a = b.authorize(t, loginParams(ClaudeClientID, redirect, verifier))
	if resp, body := exchange(a.Code, verifier, "https://elsewhere.example/cb"); resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "redirect_uri") {
		t.Fatalf("wrong redirect_uri: %d %s", resp.StatusCode, body)
	}
	_, a = b.authorize(t, loginParams(ClaudeClientID, redirect, verifier))
	resp, body := exchange(a.Code, verifier, redirect)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("exchange: %d %s", resp.StatusCode, body)
	}
	var tok codeTokenResponse
	if err := json.Unmarshal(body, &tok); err != nil || !strings.HasPrefix(tok.AccessToken, "sk-ant-oat01-") || tok.RefreshToken == "" || tok.Account == nil {
		t.Fatalf("token answer: %v: %s", err, body)
	}
	if resp, body := b.call(t, http.MethodPost, "/v1/messages", oauthHeaders(tok.AccessToken), messagesBody(sonnet, false)); resp.StatusCode != http.StatusOK {
		t.Fatalf("the login's token on /v1/messages: %d %s", resp.StatusCode, body)
	}
	for range 2 {
		resp, body := b.call(t, http.MethodGet, "/api/oauth/profile", oauthHeaders(tok.AccessToken), "")
		var p profileBody
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &p) != nil || p.Account.UUID != tok.Account.UUID || p.Organization.UUID == "" {
			t.Fatalf("profile: %d %s (want uuid %s)", resp.StatusCode, body, tok.Account.UUID)
		}
	}
	if resp, _ := b.call(t, http.MethodGet, "/api/oauth/profile", apiKeyHeaders(keyA), ""); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("profile with an API key: %d", resp.StatusCode)
	}

	// account=NAME logs in as a scripted account: its profile uuid.
	p := loginParams(ClaudeClientID, redirect, verifier)
	p.Set("account", "sub-o")
	_, a = b.authorize(t, p)
	_, body = exchange(a.Code, verifier, redirect)
	if err := json.Unmarshal(body, &tok); err != nil || tok.Account.UUID != b.sim.ProfileUUID("sub-o") {
		t.Fatalf("login as sub-o: %v %s", err, body)
	}
}

// TestLoginCodex: Codex's form-encoded exchange gives JWTs naming a
// ChatGPT account; the redirect without Accept: application/json is a 302.
func TestLoginCodex(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	const redirect, verifier = "http://localhost:1455/auth/callback", "codex-verifier-0123456789-0123456789-012"
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(b.ts.URL + "/oauth/authorize?" + loginParams(CodexClientID, redirect, verifier).Encode())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusFound || !strings.HasPrefix(loc, redirect+"?code=") || !strings.Contains(loc, "state=st-123") {
		t.Fatalf("authorize: %d to %q", resp.StatusCode, loc)
	}
	status, a := b.authorize(t, loginParams(CodexClientID, redirect, verifier))
	if status != http.StatusOK {
		t.Fatalf("authorize: %d", status)
	}
	form := url.Values{"grant_type": {"authorization_code"}, "code": {a.Code}, "redirect_uri": {redirect},
		"client_id": {CodexClientID}, "code_verifier": {verifier}}
	r, body := b.call(t, http.MethodPost, "/oauth/token", http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, form.Encode())
	if r.StatusCode != http.StatusOK {
		t.Fatalf("exchange: %d %s", r.StatusCode, body)
	}
	var tok tokenResponse
	if err := json.Unmarshal(body, &tok); err != nil || tok.IDToken == "" || jwtAccountID(tok.AccessToken) == "" {
		t.Fatalf("token answer: %v %s", err, body)
	}
	h := http.Header{}
	h.Set("Authorization", "Bearer "+tok.AccessToken)
	h.Set("chatgpt-account-id", jwtAccountID(tok.IDToken))
	if r, body := b.call(t, http.MethodGet, "/backend-api/wham/usage", h, ""); r.StatusCode != http.StatusOK {
		t.Fatalf("the login's token on wham/usage: %d %s", r.StatusCode, body)
	}
	// A Claude code is not a Codex code.
	_, a = b.authorize(t, loginParams(ClaudeClientID, "https://console.anthropic.com/oauth/code/callback", verifier))
	form.Set("code", a.Code)
	if r, _ := b.call(t, http.MethodPost, "/oauth/token", http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}, form.Encode()); r.StatusCode != http.StatusBadRequest {
		t.Fatalf("a Claude code at the Codex endpoint: %d", r.StatusCode)
	}
	if status, _ := b.authorize(t, url.Values{"client_id": {"someone-else"}}); status != http.StatusBadRequest {
		t.Fatalf("unknown client: %d", status)
	}
}
