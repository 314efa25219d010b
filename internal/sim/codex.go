package sim

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/weirhq/weir/internal/jwtclaims"
)

// openAIAuthClaim is the JWT claim holding a ChatGPT login's account
// details.
const openAIAuthClaim = "https://api.openai.com/auth"

// defaultChatGPTAccessLifetime is how long an access token issued to a
// chatgpt account by POST /oauth/token works (its exp), unless
// access_expires_in says otherwise.
const defaultChatGPTAccessLifetime = time.Hour

// codexPlanType is the plan every chatgpt account reports.
const codexPlanType = "plus"

// chatGPTAccountID is the account's chatgpt account id: the scripted one,
// else the claim of a JWT-shaped credential, else one derived from the
// name.
func (as AccountScript) chatGPTAccountID() string {
	if as.ChatGPTAccountID != "" {
		return as.ChatGPTAccountID
	}
	if id := jwtAccountID(as.Credential); id != "" && wellFormedCredential(id) {
		return id
	}
	return derivedChatGPTAccountID(as.Name)
}

// derivedChatGPTAccountID is a stable UUID-shaped id for the account name.
func derivedChatGPTAccountID(name string) string {
	sum := sha256.Sum256([]byte("chatgpt-account:" + name))
	return fmt.Sprintf("%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
}

// openAIAuth is the content of the openAIAuthClaim claim.
type openAIAuth struct {
	ChatGPTAccountID string `json:"chatgpt_account_id"`
	ChatGPTPlanType  string `json:"chatgpt_plan_type,omitempty"`
}

// jwtAccountID reads the chatgpt_account_id claim of a JWT-shaped token
// without checking anything else; "" when there is none.
func jwtAccountID(tok string) string {
	var claims struct {
		Auth openAIAuth `json:"https://api.openai.com/auth"`
	}
	if !jwtclaims.Decode(tok, &claims) {
		return ""
	}
	return claims.Auth.ChatGPTAccountID
}

// fakeJWT is a JWT-shaped token with claims and a random signature. No one
// can verify it; clients only decode it.
func fakeJWT(claims map[string]any) string {
	enc := base64.RawURLEncoding
	header := enc.EncodeToString([]byte(`{"alg":"RS256","typ":"JWT","kid":"sim"}`))
	payload, _ := json.Marshal(claims)
	return header + "." + enc.EncodeToString(payload) + "." + enc.EncodeToString([]byte(rand.Text()+rand.Text()))
}

// chatGPTTokens makes the access and id token of a refresh for a chatgpt
// account: both carry the account id claim; the access token expires with
// the account's access lifetime.
func chatGPTTokens(a *account, now time.Time, clientID string) (access, id string) {
	auth := openAIAuth{ChatGPTAccountID: a.chatgptID, ChatGPTPlanType: codexPlanType}
	access = fakeJWT(map[string]any{
		"iss":           "https://auth.openai.com",
		"aud":           []string{"https://api.openai.com/v1"},
		"iat":           now.Unix(),
		"exp":           now.Add(a.accessLifetime).Unix(),
		"jti":           rand.Text(),
		"scp":           []string{"openid", "profile", "email", "offline_access"},
		openAIAuthClaim: auth,
	})
	id = fakeJWT(map[string]any{
		"iss":           "https://auth.openai.com",
		"aud":           []string{clientID},
		"iat":           now.Unix(),
		"exp":           now.Add(time.Hour).Unix(),
		"email":         a.name + "@sim.invalid",
		openAIAuthClaim: auth,
	})
	return access, id
}

// ChatGPTAccountID is the account id the named chatgpt account expects in
// the chatgpt-account-id header. ok is false for an unknown name, another
// kind, or a discovered chatgpt account (which accepts any id).
func (s *Server) ChatGPTAccountID(name string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.reg.byName[name]
	if !ok || a.kind != KindChatGPT || a.chatgptID == "" {
		return "", false
	}
	return a.chatgptID, true
}

// handleOpenAIToken serves POST /oauth/token (auth.openai.com): a
// refresh_token grant rotates a chatgpt account's tokens like
// POST /v1/oauth/token does an oauth account's.
func (s *Server) handleOpenAIToken(w http.ResponseWriter, r *http.Request) {
	s.serveToken(w, r, KindChatGPT)
}

// Codex usage (GET /backend-api/wham/usage) shapes.
type (
	whamUsageBody struct {
		PlanType  string        `json:"plan_type"`
		RateLimit whamRateLimit `json:"rate_limit"`
		Credits   *struct{}     `json:"credits"` // always null
	}
	whamRateLimit struct {
		Allowed         bool        `json:"allowed"`
		LimitReached    bool        `json:"limit_reached"`
		PrimaryWindow   *whamWindow `json:"primary_window"`
		SecondaryWindow *whamWindow `json:"secondary_window"`
	}
	whamWindow struct {
		// UsedPercent is a whole percent, 0..100; only a full window says
		// 100.
		UsedPercent        int   `json:"used_percent"`
		LimitWindowSeconds int64 `json:"limit_window_seconds"`
		ResetAfterSeconds  int64 `json:"reset_after_seconds"`
		ResetAt            int64 `json:"reset_at"`
	}
)

// codexWindow is one Codex window as the headers and usage endpoint report
// it.
type codexWindow struct {
	percent float64 // 0..100
	full    bool
	reset   time.Time
	period  time.Duration
}

// codexWindows is the account's primary (five-hour) and secondary (weekly)
// window, live or static; nil where a scripted account lacks the window.
// Called with Server.mu held.
func (a *account) codexWindows(now time.Time) (primary, secondary *codexWindow) {
	if lws := a.windows; lws != nil {
		lws.roll(now)
		conv := func(lw *liveWindow) *codexWindow {
			if lw == nil {
				return nil
			}
			return &codexWindow{percent: lw.percent(), full: lw.full(), reset: lw.reset, period: lw.period}
		}
		return conv(lws.fiveHour), conv(lws.sevenDay)
	}
	return &codexWindow{percent: a.fiveHour * 100, full: a.fiveHour >= 1, reset: fiveHourReset(now), period: fiveHourPeriod},
		&codexWindow{percent: a.sevenDay * 100, full: a.sevenDay >= 1, reset: sevenDayReset(now), period: sevenDayPeriod}
}

// wham is the usage endpoint's view of the account. Called with
// Server.mu held.
func (a *account) wham(now time.Time) whamUsageBody {
	b := whamUsageBody{PlanType: codexPlanType, RateLimit: whamRateLimit{Allowed: true}}
	conv := func(cw *codexWindow) *whamWindow {
		if cw == nil {
			return nil
		}
		pct := int(math.Floor(cw.percent + 1e-9))
		if cw.full {
			pct = 100
			b.RateLimit.LimitReached, b.RateLimit.Allowed = true, false
		} else {
			pct = min(pct, 99)
		}
		return &whamWindow{
			UsedPercent:        pct,
			LimitWindowSeconds: int64(cw.period / time.Second),
			ResetAfterSeconds:  secondsUntil(now, cw.reset),
			ResetAt:            cw.reset.Unix(),
		}
	}
	p, sw := a.codexWindows(now)
	b.RateLimit.PrimaryWindow, b.RateLimit.SecondaryWindow = conv(p), conv(sw)
	return b
}

// handleWhamUsage serves GET /backend-api/wham/usage: a chatgpt account's
// Codex windows, within the account's read limit.
func (s *Server) handleWhamUsage(w http.ResponseWriter, r *http.Request) {
	x := &exchange{s: s, w: w, r: r}
	if !x.readBody() {
		return
	}
	acct, outcome, code, message := s.authenticateOpenAI(r.Header, surfaceCodex)
	x.acct = acct
	if outcome != "" {
		x.failOpenAI(outcome, http.StatusUnauthorized, "invalid_request_error", code, message)
		return
	}
	now := s.now()
	s.mu.Lock()
	wait, limited := acct.takeUsageRead(now)
	var body whamUsageBody
	if !limited {
		body = acct.wham(now)
	}
	s.mu.Unlock()
	if limited {
		w.Header().Set("retry-after", strconv.FormatInt(secondsUntil(now, now.Add(wait)), 10))
		x.failOpenAI(outcomeRateLimited, http.StatusTooManyRequests, "requests", "rate_limit_exceeded", "Rate limit reached. Please try again later.")
		return
	}
	x.record(outcomeOK, http.StatusOK)
	writeJSON(w, http.StatusOK, body)
}

// codexUsageLimited answers 429 usage_limit_reached when the account's
// live five-hour or weekly window is full, with resets_at and
// resets_in_seconds of the full window that resets last. Static
// utilizations never reject. It reports whether it answered.
func (x *exchange) codexUsageLimited() bool {
	now := x.s.now()
	var reset time.Time
	x.s.mu.Lock()
	if lws := x.acct.windows; lws != nil && x.acct.kind == KindChatGPT {
		lws.roll(now)
		for _, lw := range []*liveWindow{lws.fiveHour, lws.sevenDay} {
			if lw != nil && lw.full() && lw.reset.After(reset) {
				reset = lw.reset
			}
		}
	}
	x.s.mu.Unlock()
	if reset.IsZero() {
		return false
	}
	x.writeUsageLimit(outcomeUsageLimit, reset.Unix(), int(secondsUntil(now, reset)))
	return true
}

// writeUsageLimit logs the attempt and answers the Codex quota 429.
func (x *exchange) writeUsageLimit(outcome string, resetsAt int64, resetsIn int) {
	x.record(outcome, http.StatusTooManyRequests)
	writeJSON(x.w, http.StatusTooManyRequests, usageLimitBody{Error: usageLimitDetail{
		Type:            FaultUsageLimitReached,
		Message:         usageLimitReachedMessage,
		PlanType:        codexPlanType,
		ResetsAt:        resetsAt,
		ResetsInSeconds: resetsIn,
	}})
}
