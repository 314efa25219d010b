package egress

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/weirhq/weir/internal/clock"
	"github.com/weirhq/weir/internal/proxytest"
)

const secret = "pr0xy-s3cret-pw"

func TestParse(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		raw, display, err string
	}{
		{raw: "socks5://127.0.0.1:1080", display: "socks5://127.0.0.1:1080"},
		{raw: "socks5h://u:" + secret + "@proxy.example:9050", display: "socks5h://proxy.example:9050"},
		{raw: "http://u:" + secret + "@10.0.0.1", display: "http://10.0.0.1:80"},
		{raw: "https://proxy.example/", display: "https://proxy.example:443"},
		{raw: "socks5://[::1]", display: "socks5://[::1]:1080"},
		{raw: "ftp://u:" + secret + "@host:21", err: "the scheme must be http, https, socks5 or socks5h"},
		{raw: "proxy.example:8080", err: "the scheme must be"},
		{raw: "http://u:" + secret + "@host:8080/path", err: "no path, query or fragment"},
		{raw: "http://host:8080?x=" + secret, err: "no path, query or fragment"},
		{raw: "socks5://:" + secret + "@host:1", err: "a user name"},
		{raw: "socks5://host:99999", err: "the port must be"},
		{raw: "socks5://host:", err: "the port must be"},
		{raw: "socks5://", err: "a host is required"},
		{raw: "http://u:" + secret + "@ho st:1", err: "not a URL"},
		{raw: "socks5://u:" + strings.Repeat("p", 256) + "@host:1", err: "at most 255 bytes"},
	} {
		u, err := Parse(tc.raw)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Parse(%q) = %v, want an error with %q", tc.raw, err, tc.err)
			}
			if err != nil && strings.Contains(err.Error(), secret) {
				t.Errorf("Parse(%q): the error quotes the password: %v", tc.raw, err)
			}
		case err != nil:
			t.Errorf("Parse(%q): %v", tc.raw, err)
		case Display(u) != tc.display:
			t.Errorf("Display(Parse(%q)) = %q, want %q", tc.raw, Display(u), tc.display)
		}
	}
	for raw, want := range map[string]string{"": "", "direct": "direct", "socks5://u:" + secret + "@h:1": "socks5://h:1", "nonsense": "(invalid)"} {
		if got := Redact(raw); got != want {
			t.Errorf("Redact(%q) = %q, want %q", raw, got, want)
		}
	}
}

// upstream is a plain HTTP server answering "ok".
func upstream(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, c *Clients, proxy, target string) (string, error) {
	t.Helper()
	cl, release, err := c.Get(proxy)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	defer release()
	resp, err := cl.Get(target)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status + " " + string(b), nil
}

// TestThroughProxies: a request goes through each kind of proxy, with and
// without credentials, and reaches the upstream from the proxy's own
// connection; an https:// upstream goes through an HTTP proxy's CONNECT.
func TestThroughProxies(t *testing.T) {
	t.Parallel()
	up := upstream(t)
	tlsUp := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(tlsUp.Close)
	base := &http.Client{Transport: tlsUp.Client().Transport.(*http.Transport).Clone(), Timeout: 10 * time.Second}
	c := NewClients(base, time.Now, 8, time.Minute)
	for _, tc := range []struct {
		name   string
		proxy  *proxytest.Proxy
		target string
		passed string
	}{
		{"socks5", proxytest.NewSOCKS5(t, "", ""), up.URL, "CONNECT " + up.Listener.Addr().String()},
		{"socks5 with a password", proxytest.NewSOCKS5(t, "u", secret), up.URL, "CONNECT " + up.Listener.Addr().String()},
		{"http forwarding", proxytest.NewHTTP(t, "u", secret), up.URL, "GET " + up.URL + "/x"},
		{"http CONNECT", proxytest.NewHTTP(t, "", ""), tlsUp.URL, "CONNECT " + tlsUp.Listener.Addr().String()},
	} {
		got, err := get(t, c, tc.proxy.URL, tc.target+"/x")
		if err != nil || got != "200 OK ok" {
			t.Errorf("%s: %q, %v", tc.name, got, err)
			continue
		}
		if p := tc.proxy.Passed(); len(p) != 1 || p[0] != tc.passed {
			t.Errorf("%s: the proxy passed %q, want [%q]", tc.name, p, tc.passed)
		}
	}
}

// TestFailureNamesTheProxy: a proxy that cannot be reached, or refuses
// the credentials or the tunnel, is the proxy's failure; an upstream that
// cannot be reached behind a working proxy is not its failure to reach,
// but its refusal of the tunnel.
func TestFailureNamesTheProxy(t *testing.T) {
	t.Parallel()
	up := upstream(t)
	tlsUp := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(tlsUp.Close)
	c := NewClients(&http.Client{Timeout: 10 * time.Second}, time.Now, 8, time.Minute)
	socks := proxytest.NewSOCKS5(t, "u", secret)
	httpProxy := proxytest.NewHTTP(t, "u", secret)
	deadUpstream := proxytest.ClosedURL(t, "http")
	for _, tc := range []struct {
		name, proxy, target, want string
	}{
		{"closed port, socks5", proxytest.ClosedURL(t, "socks5"), up.URL, "could not be reached (connection refused)"},
		{"closed port, http", proxytest.ClosedURL(t, "http"), up.URL, "could not be reached (connection refused)"},
		{"wrong password, socks5", strings.Replace(socks.URL, secret, "wrong", 1), up.URL, "refused the SOCKS5 handshake (its credentials were refused or missing)"},
		{"no password, socks5", "socks5://" + socks.Addr, up.URL, "refused the SOCKS5 handshake (its credentials were refused or missing)"},
		{"upstream refused behind socks5", socks.URL, deadUpstream, "refused the SOCKS5 handshake (it could not open the tunnel: connection refused)"},
		{"wrong password, http CONNECT", strings.Replace(httpProxy.URL, secret, "wrong", 1), tlsUp.URL, "refused: it answered CONNECT 407 Proxy Authentication Required"},
		{"wrong password, http forwarding", strings.Replace(httpProxy.URL, secret, "wrong", 1), up.URL, "refused: it answered 407 Proxy Authentication Required"},
	} {
		_, err := get(t, c, tc.proxy, tc.target)
		var pe *Error
		if !errors.As(err, &pe) {
			t.Errorf("%s: %v, want the proxy's failure", tc.name, err)
			continue
		}
		if pe.Text != tc.want || pe.Proxy != Redact(tc.proxy) {
			t.Errorf("%s: %q at %q; want %q at %q", tc.name, pe.Text, pe.Proxy, tc.want, Redact(tc.proxy))
		}
		if want := "egress proxy " + Redact(tc.proxy) + " " + tc.want; pe.Error() != want {
			t.Errorf("%s: %q, want %q", tc.name, pe.Error(), want)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error holds the password", tc.name)
		}
	}
	if got := httpProxy.Passed(); len(got) != 0 {
		t.Errorf("the HTTP proxy passed %q with wrong credentials", got)
	}
	// Direct, a refused upstream is not a proxy's failure.
	if _, err := get(t, c, "", deadUpstream); err == nil {
		t.Error("a closed port answered")
	} else if text, ok := Failure(err); ok {
		t.Errorf("a direct dial's failure is the proxy's: %q", text)
	}
	if got := RefusedStatus(http.StatusProxyAuthRequired); got != "refused: it answered 407 Proxy Authentication Required" {
		t.Errorf("RefusedStatus = %q", got)
	}
}

// TestClientsBounded: one client per proxy, shared; at most max unused
// ones are kept (the least recently used goes), one in use is never
// dropped, and one unused for the idle time goes on the next sweep.
func TestClientsBounded(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	base := &http.Client{Transport: &http.Transport{}, Timeout: 7 * time.Second}
	c := NewClients(base, clk.Now, 2, time.Minute)
	direct, release, err := c.Get("")
	release()
	if err != nil || direct != base || c.Len() != 0 {
		t.Fatalf("direct: %v, %v, %d kept", direct == base, err, c.Len())
	}
	a1, releaseA, _ := c.Get("socks5://a:1")
	a2, releaseA2, _ := c.Get("socks5://a:1")
	if a1 != a2 || a1.Timeout != base.Timeout || a1.Transport == base.Transport {
		t.Fatal("the same proxy's clients differ, or do not keep base's timeout")
	}
	tr := a1.Transport.(proxied).t
	if u, err := tr.Proxy(&http.Request{}); err != nil || u.String() != "socks5://a:1" {
		t.Fatalf("proxy %v, %v", u, err)
	}
	clk.Advance(time.Second)
	_, releaseB, _ := c.Get("socks5://b:1")
	releaseB()
	clk.Advance(time.Second)
	_, releaseC, _ := c.Get("socks5://c:1")
	releaseC()
	// a is in use, b the least recently used: b went for c.
	if c.Len() != 2 {
		t.Fatalf("%d clients kept, want 2", c.Len())
	}
	if _, ok := c.m["socks5://b:1"]; ok {
		t.Error("b, the least recently used, is still kept")
	}
	releaseA()
	releaseA()  // a release runs once
	releaseA2() // the last user lets a go
	clk.Advance(30 * time.Second)
	c.Sweep()
	if c.Len() != 2 {
		t.Fatalf("%d kept after 30 s, want 2 (idle for less than a minute)", c.Len())
	}
	clk.Advance(31 * time.Second)
	c.Sweep()
	if c.Len() != 0 {
		t.Fatalf("%d kept after a minute unused, want none", c.Len())
	}
	if _, _, err := c.Get("ftp://x:1"); err == nil {
		t.Error("an ftp:// proxy was taken")
	}
	odd := NewClients(&http.Client{Transport: roundTripper{}}, clk.Now, 2, time.Minute)
	if _, _, err := odd.Get("socks5://a:1"); err != ErrNotProxiable {
		t.Errorf("a transport that cannot take a proxy: %v, want ErrNotProxiable", err)
	}
}

type roundTripper struct{}

func (roundTripper) RoundTrip(*http.Request) (*http.Response, error) { return nil, io.EOF }
