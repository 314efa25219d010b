package sim

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Logins: the OAuth authorization-code flow with PKCE as Claude Code and
// Codex CLI run it, and the profile endpoint that names a Claude login.
//
// GET /oauth/authorize approves at once (there is no one to ask): it
// redirects to redirect_uri with a code and the state, or, asked with
// Accept: application/json, answers {"code","state","redirect_uri"} so a
// test can read the code. The client_id says whose login it is: Claude
// Code's makes an oauth account, Codex CLI's a chatgpt account. The
// simulator-only parameter account=NAME logs in as that scripted account;
// without it each login is a new account. The code is spent by an
// authorization_code grant on the token endpoint of the login's kind
// (POST /v1/oauth/token, POST /oauth/token), which checks the redirect_uri,
// the client_id and the PKCE verifier against the S256 challenge.

// The public OAuth client ids of Claude Code and Codex CLI.
const (
	ClaudeClientID = "9d1c250a-e61b-44d9-88ed-5944d1962f5e"
	CodexClientID  = "app_EMoamEEZ73f0CkXaXp7hrann"
)

// codeLifetime is how long an authorization code can be exchanged.
const codeLifetime = 10 * time.Minute

// authCode is an issued, unspent authorization code. Guarded by Server.mu.
type authCode struct {
	kind, clientID, redirectURI, challenge, state string
	account                                       string // "" : a new account
	expires                                       time.Time
}

// authorizeAnswer is GET /oauth/authorize's JSON answer.
type authorizeAnswer struct {
	Code        string `json:"code"`
	State       string `json:"state"`
	RedirectURI string `json:"redirect_uri"`
}

// handleAuthorize serves GET /oauth/authorize.
func (s *Server) handleAuthorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	bad := func(code, desc string) {
		writeJSON(w, http.StatusBadRequest, oauthError{Error: code, Description: desc})
	}
	var kind string
	switch q.Get("client_id") {
	case ClaudeClientID:
		kind = KindOAuth
	case CodexClientID:
		kind = KindChatGPT
	default:
		bad("invalid_client", "Unknown client_id")
		return
	}
	redirect, err := url.Parse(q.Get("redirect_uri"))
	switch {
	case q.Get("response_type") != "code":
		bad("unsupported_response_type", "response_type must be code")
		return
	case err != nil || !redirect.IsAbs():
		bad("invalid_request", "redirect_uri must be an absolute URL")
		return
	case q.Get("code_challenge") == "" || q.Get("code_challenge_method") != "S256":
		bad("invalid_request", "PKCE is required: code_challenge with code_challenge_method S256")
		return
	case q.Get("state") == "":
		bad("invalid_request", "state is required")
		return
	}
	name := q.Get("account")
	code := rand.Text() + rand.Text()
	s.mu.Lock()
	a, known := s.reg.byName[name]
	if name == "" || (known && a.kind == kind) {
		if s.reg.codes == nil {
			s.reg.codes = map[string]*authCode{}
		}
		s.reg.codes[code] = &authCode{
			kind: kind, clientID: q.Get("client_id"), redirectURI: q.Get("redirect_uri"),
			challenge: q.Get("code_challenge"), state: q.Get("state"), account: name,
			expires: s.now().Add(codeLifetime),
		}
	}
	s.mu.Unlock()
	if name != "" && (!known || a.kind != kind) {
		bad("invalid_request", fmt.Sprintf("no %s account %q in the script", kind, name))
		return
	}
	back := *redirect
	v := back.Query()
	v.Set("code", code)
	v.Set("state", q.Get("state"))
	back.RawQuery = v.Encode()
	if strings.Contains(r.Header.Get("Accept"), "application/json") {
		writeJSON(w, http.StatusOK, authorizeAnswer{Code: code, State: q.Get("state"), RedirectURI: back.String()})
		return
	}
	http.Redirect(w, r, back.String(), http.StatusFound)
}

// loginAccount is a Claude login's account and organization, as the token
// endpoint's answer to a code and the profile endpoint give them.
type loginAccount struct {
	UUID         string `json:"uuid"`
	EmailAddress string `json:"email_address,omitempty"`
	Email        string `json:"email,omitempty"`
}

type loginOrganization struct {
	UUID string `json:"uuid"`
	Name string `json:"name"`
}

// codeTokenResponse is the answer to an authorization_code grant: Claude's
// carries the account and organization.
type codeTokenResponse struct {
	tokenResponse
	Scope        string             `json:"scope,omitempty"`
	Account      *loginAccount      `json:"account,omitempty"`
	Organization *loginOrganization `json:"organization,omitempty"`
}

// exchangeCode answers an authorization_code grant on the token endpoint
// of kind. The code is spent whatever the outcome, as real servers do.
func (s *Server) exchangeCode(x *exchange, req tokenRequest, kind string) {
	fail := func(code, desc string) {
		x.record(outcomeInvalidGrant, http.StatusBadRequest)
		writeJSON(x.w, http.StatusBadRequest, oauthError{Error: code, Description: desc})
	}
	if req.Code == "" || req.CodeVerifier == "" {
		fail("invalid_request", "code and code_verifier are required")
		return
	}
	now := s.now()
	s.mu.Lock()
	c := s.reg.codes[req.Code]
	delete(s.reg.codes, req.Code)
	var problem string
	switch {
	case c == nil || c.kind != kind || !now.Before(c.expires):
		problem = "Invalid authorization code"
	case req.ClientID != c.clientID:
		problem = "client_id does not match the authorization request"
	case req.RedirectURI != c.redirectURI:
		problem = "redirect_uri does not match the authorization request"
	case pkceChallenge(req.CodeVerifier) != c.challenge:
		problem = "Invalid code verifier"
	case req.State != "" && req.State != c.state:
		problem = "state does not match the authorization request"
	}
	var resp codeTokenResponse
	var a *account
	if problem == "" {
		a = s.reg.byName[c.account]
		if c.account == "" {
			a = s.reg.newLogin(kind)
		}
		resp.tokenResponse = s.reg.rotate(a, now, req.ClientID)
		if kind == KindOAuth {
			resp.Scope = "user:inference user:profile"
			p := a.profile()
			resp.Account = &loginAccount{UUID: p.Account.UUID, EmailAddress: p.Account.Email}
			resp.Organization = &p.Organization
		}
	}
	s.mu.Unlock()
	if problem != "" {
		fail("invalid_grant", problem)
		return
	}
	x.acct = a
	x.record(outcomeOK, http.StatusOK)
	writeJSON(x.w, http.StatusOK, resp)
	s.log.Info("sim login", "account", a.name, "kind", kind)
}

// pkceChallenge is the S256 challenge of a PKCE verifier.
func pkceChallenge(verifier string) string {
	sum := sha256.Sum256([]byte(verifier))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// newLogin registers a new account of kind for a login; rotate gives it
// its tokens. Called with Server.mu held.
func (reg *registry) newLogin(kind string) *account {
	name := "login-" + strings.ToLower(rand.Text()[:8])
	a := &account{
		name: name, kind: kind, credential: "unissued-" + rand.Text(),
		expires: map[string]time.Time{}, accessLifetime: defaultAccessLifetime,
		usageReadLimit: defaultUsageReadsPer10m, grantResults: map[string]string{},
	}
	if kind == KindChatGPT {
		a.chatgptID = derivedChatGPTAccountID(name)
		a.accessLifetime = defaultChatGPTAccessLifetime
	}
	reg.add(a)
	return a
}

// profileBody is the answer of GET /api/oauth/profile.
type profileBody struct {
	Account struct {
		UUID        string `json:"uuid"`
		Email       string `json:"email"`
		DisplayName string `json:"display_name"`
	} `json:"account"`
	Organization loginOrganization `json:"organization"`
}

// profile is the account's profile: a uuid and an organization derived
// from its name, so they are stable across runs and logins.
func (a *account) profile() profileBody {
	var p profileBody
	p.Account.UUID = derivedUUID("claude-account:" + a.name)
	p.Account.Email = a.name + "@sim.invalid"
	p.Account.DisplayName = a.name
	p.Organization = loginOrganization{UUID: derivedUUID("claude-org:" + a.name), Name: a.name + "'s Organization"}
	return p
}

func derivedUUID(seed string) string {
	sum := sha256.Sum256([]byte(seed))
	return fmt.Sprintf("%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}

// ProfileUUID is the account uuid the profile endpoint gives the named
// account; "" for an unknown name.
func (s *Server) ProfileUUID(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.reg.byName[name]
	if !ok {
		return ""
	}
	return a.profile().Account.UUID
}

// handleProfile serves GET /api/oauth/profile for OAuth logins. Profile
// reads are not attempts: they are not traffic a gateway routes, and
// leaving them out keeps attempt counts about requests.
func (s *Server) handleProfile(w http.ResponseWriter, r *http.Request) {
	ar := s.authenticate(r.Header)
	switch {
	case ar.fail != "":
		writeJSON(w, http.StatusUnauthorized, apiError{Type: "error", Error: apiErrorDetail{Type: "authentication_error", Message: ar.fail}, RequestID: w.Header().Get("request-id")})
		return
	case ar.acct.kind != KindOAuth:
		writeJSON(w, http.StatusUnauthorized, apiError{Type: "error", Error: apiErrorDetail{Type: "authentication_error", Message: "OAuth authentication is required for this endpoint"}, RequestID: w.Header().Get("request-id")})
		return
	}
	s.mu.Lock()
	p := ar.acct.profile()
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, p)
}
