package dashboard

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/weirhq/weir/controlplane/people"
)

// Sessions live in the control plane's database (Config.Sessions), so
// signing out revokes one on every replica and a copied cookie stops
// working. The cookie is a random id and an HMAC of it keyed by the admin
// token: rotating the token still ends every session, and a forged id is
// refused before any lookup. CSRF tokens are an HMAC of the cookie under
// the same key: a form carries one, and a POST without the right one is
// refused.

const (
	sessionCookie = "weir_dashboard"
	sessionTTL    = 12 * time.Hour
)

// SessionStore keeps the sessions; the control plane's is a table.
type SessionStore interface {
	CreateSession(ctx context.Context, s StoredSession) error
	// LookupSession finds a live session (not revoked, not expired at
	// now); ErrNoSession when there is none.
	LookupSession(ctx context.Context, idHash []byte, now time.Time) (StoredSession, error)
	RevokeSession(ctx context.Context, idHash []byte, now time.Time) error
}

// StoredSession is one sign-in: who (an email, or "" for the admin
// token), with which credential, until when.
type StoredSession struct {
	IDHash     []byte
	Person     string
	Credential string
	Created    time.Time
	Expires    time.Time
}

// ErrNoSession is a LookupSession that found no live session.
var ErrNoSession = errors.New("no such session")

// session is how a request was authenticated.
type session struct {
	// actor names the session in the audit log: the person's email, or
	// for the admin token a fingerprint of the login.
	actor string
	// credential is people.CredentialAdminToken or people.CredentialOIDC.
	credential string
	role       people.Role
	// cookie is true for a browser session (CSRF applies), false for a
	// bearer token (scripts: no ambient credential, no CSRF).
	cookie bool
	// csrf is the token forms must carry; empty for a bearer.
	csrf string
	// idHash is the stored session's key; nil for a bearer.
	idHash []byte
}

func (h *Handler) mac(parts ...string) string {
	m := hmac.New(sha256.New, []byte(h.cfg.AdminToken))
	m.Write([]byte(strings.Join(parts, "\x00")))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// newCookie is a fresh session id's cookie value and the id's hash.
func (h *Handler) newCookie() (value string, idHash []byte) {
	id := rand.Text()
	sum := sha256.Sum256([]byte(id))
	return id + "." + h.mac("weir-dashboard-session", id), sum[:]
}

// cookieID checks a cookie value's MAC and returns its id's hash.
func (h *Handler) cookieID(v string) ([]byte, bool) {
	id, sig, ok := strings.Cut(v, ".")
	if !ok || id == "" || !hmac.Equal([]byte(sig), []byte(h.mac("weir-dashboard-session", id))) {
		return nil, false
	}
	sum := sha256.Sum256([]byte(id))
	return sum[:], true
}

func (h *Handler) csrfFor(cookie string) string { return h.mac("weir-dashboard-csrf", cookie) }

// authenticate finds the request's session, if any. A person's role is
// read from the mapping now, not from when they signed in.
func (h *Handler) authenticate(r *http.Request) (session, bool) {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return session{actor: "dashboard (bearer token)", credential: people.CredentialAdminToken, role: people.Admin},
			subtle.ConstantTimeCompare([]byte(tok), []byte(h.cfg.AdminToken)) == 1
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return session{}, false
	}
	idHash, ok := h.cookieID(c.Value)
	if !ok {
		return session{}, false
	}
	st, err := h.cfg.Sessions.LookupSession(r.Context(), idHash, h.cfg.Now())
	if err != nil {
		if !errors.Is(err, ErrNoSession) {
			h.cfg.Logger.ErrorContext(r.Context(), "dashboard session lookup failed", "err", err)
		}
		return session{}, false
	}
	s := session{credential: st.Credential, cookie: true, csrf: h.csrfFor(c.Value), idHash: idHash}
	switch st.Credential {
	case people.CredentialAdminToken:
		// A login's fingerprint, the same for every action of that login
		// and useless as a credential: a MAC of the cookie under its own label.
		s.actor, s.role = "dashboard (session "+h.mac("weir-dashboard-audit", c.Value)[:10]+")", people.Admin
	case people.CredentialOIDC:
		s.actor, s.role = st.Person, h.cfg.Roles.RoleOf(st.Person)
	}
	return s, s.role != people.None
}

type callerKey struct{}

// Caller is who a dashboard request's service calls act for.
type Caller struct {
	// Actor names them in the audit log; Credential is how they signed in.
	Actor, Credential string
	Role              people.Role
	// Peer is the browser's address.
	Peer string
}

// CallerOf is who a dashboard request's service calls act for; ok is
// false outside a dashboard request.
func CallerOf(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// authed wraps a handler that needs a session whose role reaches need.
// Without a session, pages redirect to the login (and back after it);
// fragments answer 401 so the page's script reloads into that redirect. A
// role too low is a 403. A browser's POST must carry the CSRF token of its
// session.
func (h *Handler) authed(need people.Role, next func(http.ResponseWriter, *http.Request, session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, ok := h.authenticate(r)
		if !ok {
			if strings.HasPrefix(r.URL.Path, Prefix+"fragment/") || strings.HasPrefix(r.URL.Path, JobsPrefix+"/api/") {
				http.Error(w, "session expired", http.StatusUnauthorized)
				return
			}
			next := r.URL.Path
			if !safeMethod(r.Method) {
				next = Prefix
			}
			http.Redirect(w, r, Prefix+"login?next="+url.QueryEscape(next), http.StatusSeeOther)
			return
		}
		if s.role < need {
			http.Error(w, "your role ("+s.role.String()+") may not do this; it needs "+need.String(), http.StatusForbidden)
			return
		}
		if s.cookie && r.Method == http.MethodPost && !strings.HasPrefix(r.URL.Path, JobsPrefix+"/") {
			if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(s.csrf)) != 1 {
				http.Error(w, "missing or invalid CSRF token; reload the page and try again", http.StatusForbidden)
				return
			}
		}
		c := Caller{Actor: s.actor, Credential: s.credential, Role: s.role, Peer: r.RemoteAddr}
		next(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, c)), s)
	}
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// sameOrigin says a browser sent r from this origin: Sec-Fetch-Site where
// the browser sends it, else an Origin naming this host.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" {
		return site == "same-origin"
	}
	o, err := url.Parse(r.Header.Get("Origin"))
	return err == nil && o.Host != "" && o.Host == r.Host
}

type loginData struct {
	Next  string
	Error string
	// Provider names the OpenID provider to offer; "" when off.
	Provider string
}

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.authenticate(r); ok {
		http.Redirect(w, r, safeNext(r.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	h.render(w, r, http.StatusOK, "login", view{Title: "Sign in", Data: h.loginData(safeNext(r.URL.Query().Get("next")), "")})
}

func (h *Handler) loginData(next, errText string) loginData {
	d := loginData{Next: next, Error: errText}
	if h.cfg.OIDC != nil {
		d.Provider = h.cfg.OIDC.Name
	}
	return d
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.PostFormValue("next"))
	if !h.failures.allow(h.source(r)) {
		h.tooMany(w, r)
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	if token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(h.cfg.AdminToken)) != 1 {
		h.failures.failed(h.source(r))
		h.render(w, r, http.StatusUnauthorized, "login", view{Title: "Sign in", Data: h.loginData(next, "That is not the admin token.")})
		return
	}
	if h.startSession(w, r, "", people.CredentialAdminToken) {
		http.Redirect(w, r, next, http.StatusSeeOther)
	}
}

// startSession stores a new session and sets its cookie; false when it
// answered the request with the failure.
func (h *Handler) startSession(w http.ResponseWriter, r *http.Request, person, credential string) bool {
	now := h.cfg.Now()
	value, idHash := h.newCookie()
	err := h.cfg.Sessions.CreateSession(r.Context(), StoredSession{IDHash: idHash, Person: person, Credential: credential,
		Created: now, Expires: now.Add(sessionTTL)})
	if err != nil {
		h.cfg.Logger.ErrorContext(r.Context(), "dashboard session not stored", "err", err)
		http.Error(w, "could not start a session; see the control plane's log", http.StatusInternalServerError)
		return false
	}
	http.SetCookie(w, &http.Cookie{
		Name:     sessionCookie,
		Value:    value,
		Path:     Prefix,
		MaxAge:   int(sessionTTL / time.Second),
		HttpOnly: true,
		Secure:   h.secure(r),
		SameSite: http.SameSiteStrictMode,
	})
	return true
}

// logout revokes the session: its cookie, copied or not, is refused from
// now on.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request, s session) {
	if s.idHash != nil {
		if err := h.cfg.Sessions.RevokeSession(r.Context(), s.idHash, h.cfg.Now()); err != nil {
			h.cfg.Logger.ErrorContext(r.Context(), "dashboard session not revoked", "err", err)
			http.Error(w, "could not sign out; see the control plane's log", http.StatusInternalServerError)
			return
		}
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true,
		Secure: h.secure(r), SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}

// safeNext keeps a post-login redirect inside the dashboard: a path under
// Prefix, with no scheme, no host, no "//" or "\" a browser could read as
// one, no dot segment and no control character.
func safeNext(next string) string {
	u, err := url.Parse(next)
	switch {
	case err != nil, u.Scheme != "", u.Host != "", u.User != nil,
		!strings.HasPrefix(next, Prefix), strings.HasPrefix(next, Prefix+"login"), strings.HasPrefix(next, Prefix+"oidc/"),
		strings.Contains(next, "//"), strings.ContainsAny(next, "\\"),
		strings.Contains(u.Path, "/../"), strings.Contains(u.Path, "/./"), strings.HasSuffix(u.Path, "/.."),
		strings.ContainsFunc(next, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return Prefix
	}
	return next
}
