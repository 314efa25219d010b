package dashboard

import (
	"strings"
	"testing"
	"time"
)

func TestSafeNext(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                          "/dashboard/",
		"/dashboard/requests?x=1":   "/dashboard/requests?x=1",
		"//evil.example/dashboard/": "/dashboard/",
		"https://evil.example/":     "/dashboard/",
		"/dashboard/login":          "/dashboard/",
		"/dashboard/\\evil":         "/dashboard/",
		"/metrics":                  "/dashboard/",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSessionCookie(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	h := &Handler{cfg: Config{AdminToken: "admin-0123456789abcdef", Now: func() time.Time { return now }}}
	v := h.newSession(now.Add(sessionTTL))
	if !h.validSession(v) {
		t.Fatal("a fresh session is not valid")
	}
	if strings.Contains(v, h.cfg.AdminToken) {
		t.Error("the cookie holds the token")
	}
	exp, _, _ := strings.Cut(v, ".")
	for _, bad := range []string{"", v + "x", exp, exp + ".", "9" + v, h.newSession(now.Add(-time.Second))} {
		if h.validSession(bad) {
			t.Errorf("validSession(%q) = true", bad)
		}
	}
	other := &Handler{cfg: Config{AdminToken: "admin-rotated-0123456789", Now: h.cfg.Now}}
	if other.validSession(v) {
		t.Error("a session outlives a token rotation")
	}
	if h.csrfFor(v) == h.csrfFor(h.newSession(now.Add(time.Hour))) {
		t.Error("two sessions share a CSRF token")
	}
}
