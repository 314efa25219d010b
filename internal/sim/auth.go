package sim

import (
	"net/http"
	"strings"
)

// oauthBeta is the anthropic-beta value the real API requires next to an
// OAuth bearer token.
const oauthBeta = "oauth-2025-04-20"

// maxCredentialLen bounds what counts as a well-formed credential.
const maxCredentialLen = 1024

// Attempt outcomes other than "ok" and the fault kinds.
const (
	outcomeOK             = "ok"
	outcomeAuthError      = "auth_error"
	outcomeInvalidRequest = "invalid_request"
	outcomeTooLarge       = "request_too_large"
	outcomeNotFound       = "not_found"
	outcomeTokenExpired   = "token_expired"
	outcomeUsageLimit     = "usage_limit"
	outcomeRateLimited    = "rate_limited"
	outcomeInvalidGrant   = "invalid_grant"
)

// authResult is who a request authenticated as, or why it did not.
type authResult struct {
	acct    *account // set on success, and for a revoked account
	fail    string   // the 401 message; empty on success
	outcome string   // the attempt outcome when fail is set
}

// authenticate maps the request's credential to an account the way the
// real API checks it: x-api-key first, then an OAuth bearer that must come
// with the oauth beta.
func (s *Server) authenticate(h http.Header) authResult {
	cred, kind := h.Get("x-api-key"), KindAPIKey
	if cred == "" {
		if tok, ok := bearerToken(h.Get("Authorization")); ok {
			cred, kind = tok, KindOAuth
		}
	}
	if cred == "" {
		return authResult{fail: "x-api-key header is required", outcome: outcomeAuthError}
	}
	invalid := "invalid x-api-key"
	if kind == KindOAuth {
		if !hasBeta(h, oauthBeta) {
			return authResult{fail: "OAuth authentication is currently not supported.", outcome: outcomeAuthError}
		}
		invalid = "Invalid bearer token"
	}
	if !wellFormedCredential(cred) {
		return authResult{fail: invalid, outcome: outcomeAuthError}
	}

	now := s.now()
	s.mu.Lock()
	a := s.reg.byCred[cred]
	if a == nil && s.reg.acceptUnknown {
		a = s.reg.discover(cred, kind)
	}
	expired := false
	if a != nil {
		exp, ok := a.expires[cred]
		expired = ok && !now.Before(exp)
	}
	s.mu.Unlock()

	switch {
	case a == nil || a.kind != kind:
		return authResult{fail: invalid, outcome: outcomeAuthError}
	case a.revoked:
		return authResult{acct: a, fail: revokedMessage(a), outcome: FaultRevoked}
	case expired:
		return authResult{acct: a, fail: expiredMessage, outcome: outcomeTokenExpired}
	}
	return authResult{acct: a}
}

// expiredMessage is what the real API says about an expired OAuth token.
const expiredMessage = "OAuth token has expired"

// revokedMessage is what the real API says about a revoked credential.
func revokedMessage(a *account) string {
	if a.kind == KindOAuth {
		return "OAuth token has been revoked."
	}
	return "invalid x-api-key"
}

func bearerToken(header string) (string, bool) {
	scheme, tok, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// hasBeta reports whether the comma-separated anthropic-beta headers
// contain beta.
func hasBeta(h http.Header, beta string) bool {
	for _, v := range h.Values("anthropic-beta") {
		for part := range strings.SplitSeq(v, ",") {
			if strings.TrimSpace(part) == beta {
				return true
			}
		}
	}
	return false
}

func wellFormedCredential(c string) bool {
	if c == "" || len(c) > maxCredentialLen {
		return false
	}
	for _, r := range c {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case strings.ContainsRune("._~+/=-", r):
		default:
			return false
		}
	}
	return true
}
