package dashboard

import (
	"bytes"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/weirhq/weir/internal/syncbuf"
)

func TestSafeNext(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                                "/dashboard/",
		"/dashboard/requests?x=1":         "/dashboard/requests?x=1",
		"//evil.example/dashboard/":       "/dashboard/",
		"https://evil.example/":           "/dashboard/",
		"https://evil.example/dashboard/": "/dashboard/",
		"/dashboard//evil.example":        "/dashboard/",
		"/dashboard/login":                "/dashboard/",
		"/dashboard/oidc/callback":        "/dashboard/",
		"/dashboard/\\evil":               "/dashboard/",
		"/dashboard/../metrics":           "/dashboard/",
		"/dashboard/%0d%0aX: y":           "/dashboard/%0d%0aX: y",
		"/dashboard/\r\nX: y":             "/dashboard/",
		"/metrics":                        "/dashboard/",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSessionCookie(t *testing.T) {
	t.Parallel()
	h := &Handler{cfg: Config{AdminToken: "admin-0123456789abcdef"}}
	v, idHash := h.newCookie()
	got, ok := h.cookieID(v)
	if !ok || !bytes.Equal(got, idHash) {
		t.Fatal("a fresh cookie is not valid")
	}
	if strings.Contains(v, h.cfg.AdminToken) {
		t.Error("the cookie holds the token")
	}
	id, _, _ := strings.Cut(v, ".")
	for _, bad := range []string{"", v + "x", id, id + ".", "A" + v, "." + h.mac("weir-dashboard-session", "")} {
		if _, ok := h.cookieID(bad); ok {
			t.Errorf("cookieID(%q) accepted", bad)
		}
	}
	other := &Handler{cfg: Config{AdminToken: "admin-rotated-0123456789"}}
	if _, ok := other.cookieID(v); ok {
		t.Error("a session outlives a token rotation")
	}
	v2, _ := h.newCookie()
	if h.csrfFor(v) == h.csrfFor(v2) {
		t.Error("two sessions share a CSRF token")
	}
}

func TestTrustedProxy(t *testing.T) {
	t.Parallel()
	h := &Handler{cfg: Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}}
	for _, c := range []struct {
		remote, proto, xff string
		secure             bool
		source             string
	}{
		{"10.1.2.3:5000", "https", "203.0.113.7", true, "203.0.113.7/32"},
		{"10.1.2.3:5000", "http", "198.51.100.1, 203.0.113.7", false, "203.0.113.7/32"},
		{"10.1.2.3:5000", "", "", false, "10.1.2.3/32"},
		{"192.0.2.9:5000", "https", "203.0.113.7", false, "192.0.2.9/32"},
		{"[2001:db8::1]:5000", "https", "", false, "2001:db8::/64"},
	} {
		r := httptest.NewRequest("GET", "/dashboard/", nil)
		r.RemoteAddr = c.remote
		if c.proto != "" {
			r.Header.Set("X-Forwarded-Proto", c.proto)
		}
		if c.xff != "" {
			r.Header.Set("X-Forwarded-For", c.xff)
		}
		if got := h.secure(r); got != c.secure {
			t.Errorf("%s %q: secure = %v, want %v", c.remote, c.proto, got, c.secure)
		}
		if got := h.source(r).String(); got != c.source {
			t.Errorf("%s %q: source = %s, want %s", c.remote, c.xff, got, c.source)
		}
	}
}

func TestFailedSignInLimit(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	var logs syncbuf.Buffer
	f := newFailures(func() time.Time { return now }, slog.New(slog.NewTextHandler(&logs, nil)))
	a, b := netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("192.0.2.2/32")
	for i := range 300 {
		if f.allow(a) {
			f.failed(a)
		} else if i < failBurst {
			t.Fatalf("attempt %d refused inside the burst", i)
		}
	}
	if f.allow(a) {
		t.Fatal("300 failures still allowed")
	}
	if !f.allow(b) {
		t.Fatal("another source is limited too")
	}
	if n := strings.Count(logs.String(), "dashboard sign-ins refused"); n != 1 {
		t.Fatalf("%d WARN lines for one source in one interval, want 1:\n%s", n, logs.String())
	}
	now = now.Add(failLogEvery)
	if !f.allow(a) {
		t.Fatal("still refused after a minute")
	}
	f.failed(a)
	if !strings.Contains(logs.String(), "count=301") {
		t.Errorf("the interval's line does not count every refusal (300 refused or failed, then 1):\n%s", logs.String())
	}
}
