package dashboard

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/weirhq/weir/controlplane/people"
)

// OIDC is the OpenID Connect provider people sign in with: the
// authorization-code flow with PKCE, state and nonce; the ID token's
// signature (against the provider's JWKS), issuer, audience, expiry and
// nonce verified by go-oidc.
type OIDC struct {
	// Name is shown on the login page's button ("Sign in with Name").
	Name string
	// Issuer is the provider's issuer URL; its
	// /.well-known/openid-configuration is read on the first sign-in (a
	// provider down at start does not stop the control plane).
	Issuer, ClientID, ClientSecret string
	// RedirectURL is this dashboard's /dashboard/oidc/callback as the
	// browser reaches it, registered with the provider.
	RedirectURL string
	// Client makes the discovery, JWKS and token calls.
	Client *http.Client

	mu       sync.Mutex
	provider *oidc.Provider
}

// discover reads the provider's configuration once it answers.
func (o *OIDC) discover(ctx context.Context) (*oidc.Provider, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.provider == nil {
		p, err := oidc.NewProvider(oidc.ClientContext(ctx, o.Client), o.Issuer)
		if err != nil {
			return nil, err
		}
		o.provider = p
	}
	return o.provider, nil
}

func (o *OIDC) oauth2(p *oidc.Provider) *oauth2.Config {
	return &oauth2.Config{ClientID: o.ClientID, ClientSecret: o.ClientSecret, RedirectURL: o.RedirectURL,
		Endpoint: p.Endpoint(), Scopes: []string{oidc.ScopeOpenID, "email"}}
}

const (
	oidcCookie = "weir_oidc"
	// oidcFlowTTL bounds a sign-in at the provider.
	oidcFlowTTL = 10 * time.Minute
)

// oidcFlow is what the callback must match, kept in the browser between
// the redirect to the provider and the callback, under the dashboard's MAC.
type oidcFlow struct {
	State    string `json:"s"`
	Nonce    string `json:"n"`
	Verifier string `json:"v"`
	Next     string `json:"x"`
	Expires  int64  `json:"e"`
}

func (h *Handler) oidcStart(w http.ResponseWriter, r *http.Request) {
	p, err := h.cfg.OIDC.discover(r.Context())
	if err != nil {
		h.cfg.Logger.ErrorContext(r.Context(), "oidc discovery failed", "issuer", h.cfg.OIDC.Issuer, "err", err)
		h.render(w, r, http.StatusBadGateway, "login", view{Title: "Sign in",
			Data: h.loginData(safeNext(r.URL.Query().Get("next")), "The sign-in provider cannot be reached; try again, or use the admin token.")})
		return
	}
	f := oidcFlow{State: rand.Text(), Nonce: rand.Text(), Verifier: oauth2.GenerateVerifier(),
		Next: safeNext(r.URL.Query().Get("next")), Expires: h.cfg.Now().Add(oidcFlowTTL).Unix()}
	raw, _ := json.Marshal(f) // strings and a number
	payload := base64.RawURLEncoding.EncodeToString(raw)
	http.SetCookie(w, &http.Cookie{Name: oidcCookie, Value: payload + "." + h.mac("weir-dashboard-oidc", payload),
		Path: Prefix + "oidc/", MaxAge: int(oidcFlowTTL / time.Second), HttpOnly: true, Secure: h.secure(r),
		// Lax: the callback is a top-level navigation from the provider's
		// site, which a Strict cookie would not follow.
		SameSite: http.SameSiteLaxMode})
	http.Redirect(w, r, h.cfg.OIDC.oauth2(p).AuthCodeURL(f.State, oidc.Nonce(f.Nonce), oauth2.S256ChallengeOption(f.Verifier)), http.StatusFound)
}

// readFlow reads and checks the flow cookie.
func (h *Handler) readFlow(r *http.Request) (oidcFlow, error) {
	c, err := r.Cookie(oidcCookie)
	if err != nil {
		return oidcFlow{}, errors.New("no sign-in in progress (cookie missing)")
	}
	payload, sig, _ := strings.Cut(c.Value, ".")
	var f oidcFlow
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil || !hmacEqual(sig, h.mac("weir-dashboard-oidc", payload)) || json.Unmarshal(raw, &f) != nil {
		return oidcFlow{}, errors.New("sign-in cookie not ours")
	}
	if !h.cfg.Now().Before(time.Unix(f.Expires, 0)) {
		return oidcFlow{}, errors.New("sign-in took too long")
	}
	return f, nil
}

func hmacEqual(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// errNotMapped is a verified person the role mapping does not name.
var errNotMapped = errors.New("not in WEIR_OIDC_ROLES")

func (h *Handler) oidcCallback(w http.ResponseWriter, r *http.Request) {
	src := h.source(r)
	if !h.failures.allow(src) {
		h.tooMany(w, r)
		return
	}
	// The flow cookie is spent whatever happens next.
	http.SetCookie(w, &http.Cookie{Name: oidcCookie, Value: "", Path: Prefix + "oidc/", MaxAge: -1, HttpOnly: true,
		Secure: h.secure(r), SameSite: http.SameSiteLaxMode})
	f, email, err := h.verifyCallback(r)
	if err != nil {
		h.failures.failed(src)
		// The reason helps an operator configuring the provider; the
		// aggregate WARN line is what a guesser produces.
		h.cfg.Logger.DebugContext(r.Context(), "oidc sign-in refused", "err", err)
		status, text := http.StatusUnauthorized, "Sign-in with "+h.cfg.OIDC.Name+" failed; try again."
		if errors.Is(err, errNotMapped) {
			status, text = http.StatusForbidden, "You signed in, but weir gives your address no role; ask an admin."
		}
		h.render(w, r, status, "login", view{Title: "Sign in", Data: h.loginData(Prefix, text)})
		return
	}
	h.cfg.Logger.InfoContext(r.Context(), "dashboard sign-in", "person", email, "role", h.cfg.Roles.RoleOf(email).String())
	if h.startSession(w, r, email, people.CredentialOIDC) {
		// A page, not a redirect: the browser arrived from the provider's
		// site, and would not send the new Strict cookie along a redirect
		// of that navigation. Its refresh is a navigation of our own.
		h.execute(w, r, http.StatusOK, "continue", "continue.html", f.Next)
	}
}

// verifyCallback checks a callback against its flow, redeems the code
// (with the PKCE verifier) and verifies the ID token: signature, issuer,
// audience and expiry (go-oidc), then the nonce and a verified email the
// mapping names.
func (h *Handler) verifyCallback(r *http.Request) (oidcFlow, string, error) {
	f, err := h.readFlow(r)
	if err != nil {
		return f, "", err
	}
	q := r.URL.Query()
	if e := q.Get("error"); e != "" {
		return f, "", fmt.Errorf("provider answered %.64q", e)
	}
	if q.Get("state") == "" || !hmacEqual(q.Get("state"), f.State) {
		return f, "", errors.New("state does not match")
	}
	ctx := oidc.ClientContext(r.Context(), h.cfg.OIDC.Client)
	p, err := h.cfg.OIDC.discover(ctx)
	if err != nil {
		return f, "", fmt.Errorf("discovery: %w", err)
	}
	tok, err := h.cfg.OIDC.oauth2(p).Exchange(ctx, q.Get("code"), oauth2.VerifierOption(f.Verifier))
	if err != nil {
		return f, "", errors.New("code exchange refused") // its error may quote the provider's answer
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return f, "", errors.New("no id_token in the token response")
	}
	idt, err := p.Verifier(&oidc.Config{ClientID: h.cfg.OIDC.ClientID, Now: h.cfg.Now}).Verify(ctx, raw)
	if err != nil {
		return f, "", fmt.Errorf("id token: %w", err)
	}
	if !hmacEqual(idt.Nonce, f.Nonce) {
		return f, "", errors.New("id token: nonce does not match")
	}
	email, err := verifiedEmail(idt)
	if err != nil {
		return f, "", err
	}
	if h.cfg.Roles.RoleOf(email) == people.None {
		return f, "", errNotMapped
	}
	return f, email, nil
}

// VerifyBearer checks an ID token sent as a bearer token to the admin
// API (as Kubernetes takes them): signature, issuer, audience (this
// client id) and expiry, then a verified email. There is no nonce: the
// token was not asked for by this flow. It returns the email.
func (o *OIDC) VerifyBearer(ctx context.Context, raw string, now func() time.Time) (string, error) {
	ctx = oidc.ClientContext(ctx, o.Client)
	p, err := o.discover(ctx)
	if err != nil {
		return "", fmt.Errorf("discovery: %w", err)
	}
	idt, err := p.Verifier(&oidc.Config{ClientID: o.ClientID, Now: now}).Verify(ctx, raw)
	if err != nil {
		return "", err
	}
	return verifiedEmail(idt)
}

// verifiedEmail is an ID token's email, when the provider did not say it
// is unverified.
func verifiedEmail(idt *oidc.IDToken) (string, error) {
	var claims struct {
		Email    string `json:"email"`
		Verified *bool  `json:"email_verified"`
	}
	if err := idt.Claims(&claims); err != nil {
		return "", fmt.Errorf("id token claims: %w", err)
	}
	// An email the provider says it has not verified names nobody.
	if claims.Email == "" || (claims.Verified != nil && !*claims.Verified) {
		return "", errors.New("id token: no verified email")
	}
	return strings.ToLower(claims.Email), nil
}
