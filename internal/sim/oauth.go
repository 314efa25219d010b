package sim

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

const (
	// defaultAccessLifetime is how long an access token issued by a
	// refresh works (expires_in 28800), unless access_expires_in says
	// otherwise.
	defaultAccessLifetime = 8 * time.Hour
	// refreshGrace is how long an access token keeps working after a
	// refresh replaced it.
	refreshGrace = 60 * time.Second
	// defaultUsageReadsPer10m and usageReadWindow are the usage endpoint's
	// per-account read limit.
	defaultUsageReadsPer10m = 4
	usageReadWindow         = 10 * time.Minute
)

// Reset grant claim results.
const (
	GrantReset       = "reset"
	GrantAlreadyUsed = "already_used"
	GrantNotLimited  = "not_limited"
	GrantIneligible  = "ineligible"
	GrantUnavailable = "unavailable" // the grant has expired
)

// grantState is a grant's running state. Guarded by Server.mu.
type grantState struct {
	id, program string
	expiresAt   time.Time // zero: never
	used        bool
}

func (g *grantState) status(now time.Time) string {
	switch {
	case g.used:
		return "used"
	case !g.expiresAt.IsZero() && !now.Before(g.expiresAt):
		return "expired"
	}
	return "available"
}

// authOAuth authenticates a request to an OAuth-only endpoint: a bearer
// with the oauth beta. When it returns false it has answered and logged.
func (x *exchange) authOAuth() bool {
	ar := x.s.authenticate(x.r.Header)
	x.acct = ar.acct
	switch {
	case ar.fail != "":
		x.fail(ar.outcome, http.StatusUnauthorized, "authentication_error", ar.fail)
		return false
	case x.acct.kind != KindOAuth:
		x.fail(outcomeAuthError, http.StatusUnauthorized, "authentication_error", "OAuth authentication is required for this endpoint")
		return false
	}
	return true
}

// usageWindowBody is one window of the usage endpoint.
type usageWindowBody struct {
	// Utilization is a percent, 0..100.
	Utilization float64 `json:"utilization"`
	ResetsAt    string  `json:"resets_at"`
}

type extraUsageBody struct {
	IsEnabled    bool     `json:"is_enabled"`
	MonthlyLimit *float64 `json:"monthly_limit"`
	UsedCredits  *float64 `json:"used_credits"`
	Utilization  *float64 `json:"utilization"`
}

type grantBody struct {
	ID        string  `json:"id"`
	Program   string  `json:"program"`
	ExpiresAt *string `json:"expires_at"`
	Status    string  `json:"status"`
}

// usageBody is the answer of GET /api/oauth/usage.
type usageBody struct {
	FiveHour          *usageWindowBody `json:"five_hour"`
	SevenDay          *usageWindowBody `json:"seven_day"`
	SevenDayOAuthApps *usageWindowBody `json:"seven_day_oauth_apps"`
	SevenDayOpus      *usageWindowBody `json:"seven_day_opus"`
	SevenDaySonnet    *usageWindowBody `json:"seven_day_sonnet"`
	ExtraUsage        extraUsageBody   `json:"extra_usage"`
	// ResetGrants is present with ?include_grants=true.
	ResetGrants *[]grantBody `json:"reset_grants,omitempty"`
}

func isoTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// handleUsage serves GET /api/oauth/usage: the account's windows in
// percent, within the account's read limit.
func (s *Server) handleUsage(w http.ResponseWriter, r *http.Request) {
	x := &exchange{s: s, w: w, r: r}
	if !x.readBody() || !x.authOAuth() {
		return
	}
	now := s.now()
	withGrants := r.URL.Query().Get("include_grants") == "true"
	s.mu.Lock()
	wait, limited := x.acct.takeUsageRead(now)
	var body usageBody
	if !limited {
		body = x.acct.usage(now, withGrants)
	}
	s.mu.Unlock()
	if limited {
		w.Header().Set("retry-after", strconv.FormatInt(secondsUntil(now, now.Add(wait)), 10))
		x.fail(outcomeRateLimited, http.StatusTooManyRequests, "rate_limit_error", "Rate limited. Please try again later.")
		return
	}
	x.record(outcomeOK, http.StatusOK)
	writeJSON(w, http.StatusOK, body)
}

// takeUsageRead counts a read of the usage endpoint, or reports how long
// until one frees up when the account has had its reads for the rolling
// window. Refused reads do not count. Called with Server.mu held.
func (a *account) takeUsageRead(now time.Time) (time.Duration, bool) {
	kept := a.usageReads[:0]
	for _, t := range a.usageReads {
		if now.Before(t.Add(usageReadWindow)) {
			kept = append(kept, t)
		}
	}
	a.usageReads = kept
	if a.usageReadLimit >= 0 && len(a.usageReads) >= a.usageReadLimit {
		if len(a.usageReads) == 0 {
			return usageReadWindow, true
		}
		return a.usageReads[0].Add(usageReadWindow).Sub(now), true
	}
	a.usageReads = append(a.usageReads, now)
	return 0, false
}

// usage is the usage endpoint's view of the account. An account without
// scripted windows reports its static utilizations with the regular
// resets, as its unified headers do. Called with Server.mu held.
func (a *account) usage(now time.Time, withGrants bool) usageBody {
	var b usageBody
	win := func(lw *liveWindow) *usageWindowBody {
		if lw == nil {
			return nil
		}
		return &usageWindowBody{Utilization: lw.percent(), ResetsAt: isoTime(lw.reset)}
	}
	if lws := a.windows; lws != nil {
		lws.roll(now)
		b.FiveHour, b.SevenDay = win(lws.fiveHour), win(lws.sevenDay)
		b.SevenDayOpus, b.SevenDaySonnet = win(lws.families[FamilyOpus]), win(lws.families[FamilySonnet])
		b.ExtraUsage.IsEnabled = lws.overage != nil && lws.overage.Status != "rejected"
	} else {
		b.FiveHour = &usageWindowBody{Utilization: staticPercent(a.fiveHour), ResetsAt: isoTime(fiveHourReset(now))}
		b.SevenDay = &usageWindowBody{Utilization: staticPercent(a.sevenDay), ResetsAt: isoTime(sevenDayReset(now))}
	}
	if withGrants {
		grants := []grantBody{}
		for _, g := range a.grants {
			gb := grantBody{ID: g.id, Program: g.program, Status: g.status(now)}
			if !g.expiresAt.IsZero() {
				at := isoTime(g.expiresAt)
				gb.ExpiresAt = &at
			}
			grants = append(grants, gb)
		}
		b.ResetGrants = &grants
	}
	return b
}

// staticPercent writes a scripted fraction as a percent with one decimal.
func staticPercent(u float64) float64 {
	p, _ := strconv.ParseFloat(strconv.FormatFloat(u*100, 'f', 1, 64), 64)
	return p
}

// tokenRequest is the body of POST /v1/oauth/token and POST /oauth/token.
type tokenRequest struct {
	GrantType    string `json:"grant_type"`
	RefreshToken string `json:"refresh_token"`
	ClientID     string `json:"client_id"`
	Scope        string `json:"scope"`
	// An authorization_code grant's (login.go).
	Code         string `json:"code"`
	RedirectURI  string `json:"redirect_uri"`
	CodeVerifier string `json:"code_verifier"`
	State        string `json:"state"`
}

// tokenResponse is a successful refresh. IDToken is sent to chatgpt
// accounts only.
type tokenResponse struct {
	IDToken      string `json:"id_token,omitempty"`
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token"`
	ExpiresIn    int64  `json:"expires_in"`
	TokenType    string `json:"token_type"`
}

// oauthError is the OAuth 2.0 error body of the token endpoint.
type oauthError struct {
	Error       string `json:"error"`
	Description string `json:"error_description"`
}

// handleToken serves POST /v1/oauth/token: a refresh_token grant rotates
// the account's tokens. The old refresh token is spent at once; the old
// access token works for refreshGrace more.
func (s *Server) handleToken(w http.ResponseWriter, r *http.Request) {
	s.serveToken(w, r, KindOAuth)
}

// serveToken serves a token endpoint for accounts of kind (oauth on
// /v1/oauth/token, chatgpt on /oauth/token). A refresh token of another
// kind is unknown there. A spent or unknown refresh token gets 400
// invalid_grant from the Anthropic endpoint and 401 from OpenAI's.
func (s *Server) serveToken(w http.ResponseWriter, r *http.Request, kind string) {
	x := &exchange{s: s, w: w, r: r}
	if !x.readBody() {
		return
	}
	fail := func(status int, outcome, code, desc string) {
		x.record(outcome, status)
		writeJSON(w, status, oauthError{Error: code, Description: desc})
	}
	bad := func(outcome, code, desc string) { fail(http.StatusBadRequest, outcome, code, desc) }
	var req tokenRequest
	if kind == KindChatGPT && strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		form, err := url.ParseQuery(string(x.body))
		if err != nil {
			bad(outcomeInvalidRequest, "invalid_request", "The request body is not a valid form: "+err.Error())
			return
		}
		req = tokenRequest{GrantType: form.Get("grant_type"), RefreshToken: form.Get("refresh_token"), ClientID: form.Get("client_id"), Scope: form.Get("scope"),
			Code: form.Get("code"), RedirectURI: form.Get("redirect_uri"), CodeVerifier: form.Get("code_verifier"), State: form.Get("state")}
	} else if err := json.Unmarshal(x.body, &req); err != nil {
		bad(outcomeInvalidRequest, "invalid_request", "The request body must be a JSON object: "+err.Error())
		return
	}
	if req.GrantType == "authorization_code" {
		s.exchangeCode(x, req, kind)
		return
	}
	switch {
	case req.GrantType != "refresh_token":
		bad(outcomeInvalidRequest, "unsupported_grant_type", fmt.Sprintf("Grant type %q is not supported", req.GrantType))
		return
	case req.RefreshToken == "":
		bad(outcomeInvalidRequest, "invalid_request", "refresh_token is required")
		return
	case req.ClientID == "":
		bad(outcomeInvalidRequest, "invalid_request", "client_id is required")
		return
	}

	now := s.now()
	var resp tokenResponse
	s.mu.Lock()
	a := s.reg.byRefresh[req.RefreshToken]
	spent := false
	if a == nil {
		a = s.reg.usedRefresh[req.RefreshToken]
		spent = a != nil
	}
	if a != nil && a.kind != kind {
		a = nil
	}
	x.acct = a
	if a != nil {
		a.refreshCalls++
	}
	ok := a != nil && !spent && !a.revoked
	if ok {
		resp = s.reg.rotate(a, now, req.ClientID)
	}
	s.mu.Unlock()

	if !ok {
		status := http.StatusBadRequest
		if kind == KindChatGPT {
			status = http.StatusUnauthorized
		}
		fail(status, outcomeInvalidGrant, "invalid_grant", "Refresh token not found or invalid")
		return
	}
	x.record(outcomeOK, http.StatusOK)
	writeJSON(w, http.StatusOK, resp)
	s.log.Info("sim token refreshed", "account", a.name)
}

// rotate gives a a new access and refresh token: for a chatgpt account
// JWT-shaped access and id tokens carrying its account id. Called with
// Server.mu held.
func (reg *registry) rotate(a *account, now time.Time, clientID string) tokenResponse {
	var resp tokenResponse
	if a.kind == KindChatGPT {
		resp.AccessToken, resp.IDToken = chatGPTTokens(a, now, clientID)
		resp.RefreshToken = "rt_" + rand.Text() + rand.Text()
	} else {
		resp.AccessToken = "sk-ant-oat01-" + rand.Text() + rand.Text()
		resp.RefreshToken = "sk-ant-ort01-" + rand.Text() + rand.Text()
	}
	access, refresh := resp.AccessToken, resp.RefreshToken

	old := a.credential
	if exp, ok := a.expires[old]; !ok || now.Add(refreshGrace).Before(exp) {
		a.expires[old] = now.Add(refreshGrace)
	}
	a.credential = access
	a.expires[access] = now.Add(a.accessLifetime)
	reg.byCred[access] = a

	delete(reg.byRefresh, a.refreshToken)
	reg.usedRefresh[a.refreshToken] = a
	a.refreshToken = refresh
	reg.byRefresh[refresh] = a

	resp.ExpiresIn = int64(a.accessLifetime / time.Second)
	resp.TokenType = "Bearer"
	return resp
}

// TokenRefreshes is how many requests to the token endpoint of the
// account's kind (POST /v1/oauth/token for oauth, POST /oauth/token for
// chatgpt) named a refresh token of the account (its current one or one already used),
// successful or not, since the script was loaded or the last Reset.
func (s *Server) TokenRefreshes(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a, ok := s.reg.byName[name]; ok {
		return a.refreshCalls
	}
	return 0
}

// resetRequest is the body of POST /api/organizations/{org}/reset_rate_limits.
type resetRequest struct {
	Program   string `json:"program"`
	GrantID   string `json:"grant_id"`
	RequestID string `json:"request_id"`
}

// handleResetRateLimits serves POST /api/organizations/{org}/reset_rate_limits:
// claiming a banked reset. Any org is accepted. A request_id seen before
// gets its first result again and spends nothing.
func (s *Server) handleResetRateLimits(w http.ResponseWriter, r *http.Request) {
	x := &exchange{s: s, w: w, r: r}
	if !x.readBody() || !x.authOAuth() {
		return
	}
	var req resetRequest
	if err := json.Unmarshal(x.body, &req); err != nil {
		x.fail(outcomeInvalidRequest, http.StatusBadRequest, "invalid_request_error", "The request body must be a JSON object: "+err.Error())
		return
	}
	if req.GrantID == "" || req.RequestID == "" {
		x.fail(outcomeInvalidRequest, http.StatusBadRequest, "invalid_request_error", "grant_id and request_id are required")
		return
	}
	now := s.now()
	s.mu.Lock()
	result := x.acct.claimGrant(req, now)
	s.mu.Unlock()
	x.record(result, http.StatusOK)
	writeJSON(w, http.StatusOK, map[string]string{"result": result})
	s.log.Info("sim reset grant claimed", "account", x.acct.name, "grant", req.GrantID, "result", result)
}

// claimGrant claims a grant for req and returns the result. Called with
// Server.mu held.
func (a *account) claimGrant(req resetRequest, now time.Time) string {
	if res, seen := a.grantResults[req.RequestID]; seen {
		return res
	}
	res := a.claim(req, now)
	a.grantResults[req.RequestID] = res
	return res
}

func (a *account) claim(req resetRequest, now time.Time) string {
	var g *grantState
	for _, c := range a.grants {
		if c.id == req.GrantID {
			g = c
		}
	}
	if g == nil || (req.Program != "" && req.Program != g.program) {
		return GrantIneligible
	}
	switch g.status(now) {
	case "used":
		return GrantAlreadyUsed
	case "expired":
		return GrantUnavailable
	}
	if a.windows == nil {
		return GrantNotLimited
	}
	a.windows.roll(now)
	if !a.windows.weeklyLimited() {
		return GrantNotLimited
	}
	g.used = true
	if a.windows.sevenDay != nil {
		a.windows.sevenDay.used = 0
	}
	for _, lw := range a.windows.families {
		lw.used = 0
	}
	return GrantReset
}
