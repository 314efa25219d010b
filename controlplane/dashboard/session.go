package dashboard

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Sessions are stateless: the cookie holds an expiry and an HMAC of it
// keyed by the admin token, so any replica with the same token accepts it
// and rotating the token ends every session. CSRF tokens are an HMAC of
// the session cookie under the same key: a form carries one, and a POST
// without the right one is refused.

const (
	sessionCookie = "weir_dashboard"
	sessionTTL    = 12 * time.Hour
)

// session is how a request was authenticated.
type session struct {
	// actor names the session in the audit log.
	actor string
	// cookie is true for a browser session (CSRF applies), false for a
	// bearer token (scripts: no ambient credential, no CSRF).
	cookie bool
	// csrf is the token forms must carry; empty for a bearer.
	csrf string
}

func (h *Handler) mac(parts ...string) string {
	m := hmac.New(sha256.New, []byte(h.cfg.AdminToken))
	m.Write([]byte(strings.Join(parts, "\x00")))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// newSession is a cookie value valid until exp.
func (h *Handler) newSession(exp time.Time) string {
	e := strconv.FormatInt(exp.Unix(), 10)
	return e + "." + h.mac("weir-dashboard-session", e)
}

// validSession checks a cookie value's MAC and expiry.
func (h *Handler) validSession(v string) bool {
	e, sig, ok := strings.Cut(v, ".")
	if !ok {
		return false
	}
	exp, err := strconv.ParseInt(e, 10, 64)
	if err != nil || !h.cfg.Now().Before(time.Unix(exp, 0)) {
		return false
	}
	return hmac.Equal([]byte(sig), []byte(h.mac("weir-dashboard-session", e)))
}

func (h *Handler) csrfFor(cookie string) string { return h.mac("weir-dashboard-csrf", cookie) }

// authenticate finds the request's session, if any.
func (h *Handler) authenticate(r *http.Request) (session, bool) {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return session{actor: "dashboard (bearer token)"}, subtle.ConstantTimeCompare([]byte(tok), []byte(h.cfg.AdminToken)) == 1
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil || !h.validSession(c.Value) {
		return session{}, false
	}
	// A login's fingerprint, the same for every action of that login and
	// useless as a credential: a MAC of the cookie under its own label.
	fp := h.mac("weir-dashboard-audit", c.Value)[:10]
	return session{actor: "dashboard (session " + fp + ")", cookie: true, csrf: h.csrfFor(c.Value)}, true
}

type callerKey struct{}

type caller struct{ actor, peer string }

// CallerOf is who a dashboard request's service calls act for: the
// session's actor and the browser's address. ok is false outside a
// dashboard request.
func CallerOf(ctx context.Context) (actor, peer string, ok bool) {
	c, ok := ctx.Value(callerKey{}).(caller)
	return c.actor, c.peer, ok
}

// authed wraps a handler that needs a session. Without one, pages redirect
// to the login (and back after it); fragments answer 401 so the page's
// script reloads into that redirect. A browser's POST must carry the CSRF
// token of its session.
func (h *Handler) authed(next func(http.ResponseWriter, *http.Request, session)) http.HandlerFunc {
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
		if s.cookie && r.Method == http.MethodPost && !strings.HasPrefix(r.URL.Path, JobsPrefix+"/") {
			if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(s.csrf)) != 1 {
				http.Error(w, "missing or invalid CSRF token; reload the page and try again", http.StatusForbidden)
				return
			}
		}
		next(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, caller{actor: s.actor, peer: r.RemoteAddr})), s)
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
}

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	if _, ok := h.authenticate(r); ok {
		http.Redirect(w, r, safeNext(r.URL.Query().Get("next")), http.StatusSeeOther)
		return
	}
	h.render(w, r, http.StatusOK, "login", view{Title: "Sign in", Data: loginData{Next: safeNext(r.URL.Query().Get("next"))}})
}

func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.PostFormValue("next"))
	token := strings.TrimSpace(r.PostFormValue("token"))
	if token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(h.cfg.AdminToken)) != 1 {
		h.cfg.Logger.WarnContext(r.Context(), "dashboard login refused", "remote", r.RemoteAddr)
		h.render(w, r, http.StatusUnauthorized, "login", view{Title: "Sign in",
			Data: loginData{Next: next, Error: "That is not the admin token."}})
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name:     sessionCookie,
		Value:    h.newSession(h.cfg.Now().Add(sessionTTL)),
		Path:     Prefix,
		MaxAge:   int(sessionTTL / time.Second),
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteStrictMode,
	})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request, _ session) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}

// safeNext keeps a post-login redirect inside the dashboard.
func safeNext(next string) string {
	if !strings.HasPrefix(next, Prefix) || strings.HasPrefix(next, Prefix+"login") || strings.ContainsAny(next, "\\\r\n") {
		return Prefix
	}
	return next
}
