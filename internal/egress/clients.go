package egress

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// Transport is base going through the proxy u: a clone, so every timeout,
// buffer and HTTP/2 setting of base holds, with its Proxy fixed to u (net/http
// speaks HTTP forwarding and CONNECT to an http:// or https:// proxy, and
// SOCKS5 to a socks5:// one; socks5h:// resolves the upstream's name at
// the proxy, and so does socks5:// in net/http). A CONNECT the proxy
// answers other than 200 fails as Failure knows it.
func Transport(base *http.Transport, u *url.URL) *http.Transport {
	t := base.Clone()
	t.Proxy = http.ProxyURL(u)
	t.OnProxyConnectResponse = func(_ context.Context, _ *url.URL, _ *http.Request, resp *http.Response) error {
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		return &refusedError{status: resp.StatusCode}
	}
	return t
}

// ErrNotProxiable is a client whose transport is not an *http.Transport:
// a proxy cannot be set on it, and its requests must not go out direct
// instead.
var ErrNotProxiable = errors.New("the HTTP client's transport cannot go through a proxy (not an *http.Transport)")

// Clients keeps one client per proxy URL, each base with its transport
// through that proxy (Transport): requests through one proxy share its
// connections. It holds at most Max clients that no request uses (the
// least recently used goes first), and lets a client go once no request
// has used it for Idle. A client a request holds is never dropped.
type Clients struct {
	base *http.Client
	now  func() time.Time
	max  int
	idle time.Duration

	mu sync.Mutex
	m  map[string]*entry
	// swept is when the idle clients were last looked for.
	swept time.Time
}

type entry struct {
	client *http.Client
	t      *http.Transport
	// users is how many requests hold the client; last when the latest
	// of them let it go.
	users int
	last  time.Time
}

// NewClients keeps clients made from base (its Transport must be an
// *http.Transport, or nil for http.DefaultTransport), at most max unused
// ones, each dropped idle after not being used. now is the clock.
func NewClients(base *http.Client, now func() time.Time, max int, idle time.Duration) *Clients {
	return &Clients{base: base, now: now, max: max, idle: idle, m: map[string]*entry{}}
}

// Get is the client for requests through raw (a proxy URL; "" is base
// itself, direct), and the release the caller calls once its request is
// over (its answer read or abandoned). raw is parsed (Parse) on first use.
func (c *Clients) Get(raw string) (*http.Client, func(), error) {
	if raw == "" {
		return c.base, func() {}, nil
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if now.Sub(c.swept) >= c.idle/4 {
		c.sweepLocked(now, 0)
	}
	e, ok := c.m[raw]
	if !ok {
		u, err := Parse(raw)
		if err != nil {
			return nil, nil, err
		}
		base, err := c.baseTransport()
		if err != nil {
			return nil, nil, err
		}
		c.sweepLocked(now, 1)
		t := Transport(base, u)
		cl := *c.base
		cl.Transport = proxied{t: t, shown: Display(u), forwards: u.Scheme == "http" || u.Scheme == "https"}
		e = &entry{client: &cl, t: t}
		c.m[raw] = e
	}
	e.users++
	e.last = now
	var once sync.Once
	return e.client, func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			e.users--
			e.last = c.now()
		})
	}, nil
}

// Error is a request's failure at its proxy (Failure): the proxy could not
// be reached, or refused. Its text names the proxy by scheme://host:port.
type Error struct {
	// Proxy is the proxy as Display shows it; Text what went wrong there.
	Proxy, Text string
	err         error
}

func (e *Error) Error() string { return "egress proxy " + e.Proxy + " " + e.Text }

// Unwrap is the transport's own error (nil for a refusal by status).
func (e *Error) Unwrap() error { return e.err }

// proxied is a transport through one proxy whose failures at the proxy
// are *Error: a request that got no answer because of the proxy, and a
// plain http:// request an HTTP proxy refused to forward (407: its
// credentials), which net/http hands back as the proxy's answer.
type proxied struct {
	t        *http.Transport
	shown    string
	forwards bool
}

func (p proxied) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := p.t.RoundTrip(r)
	if err != nil {
		if text, ok := Failure(err); ok {
			return nil, &Error{Proxy: p.shown, Text: text, err: err}
		}
		return nil, err
	}
	if p.forwards && r.URL.Scheme == "http" && resp.StatusCode == http.StatusProxyAuthRequired {
		resp.Body.Close() //nolint:errcheck // the answer is the proxy's, not the upstream's
		return nil, &Error{Proxy: p.shown, Text: RefusedStatus(resp.StatusCode)}
	}
	return resp, nil
}

func (c *Clients) baseTransport() (*http.Transport, error) {
	switch t := c.base.Transport.(type) {
	case nil:
		return http.DefaultTransport.(*http.Transport), nil
	case *http.Transport:
		return t, nil
	}
	return nil, ErrNotProxiable
}

// sweepLocked drops the clients idle past c.idle, then the least
// recently used unused ones until room more fit under c.max.
func (c *Clients) sweepLocked(now time.Time, room int) {
	c.swept = now
	for k, e := range c.m {
		if e.users == 0 && now.Sub(e.last) >= c.idle {
			c.dropLocked(k, e)
		}
	}
	for len(c.m)+room > c.max {
		var oldest string
		var oe *entry
		for k, e := range c.m {
			if e.users == 0 && (oe == nil || e.last.Before(oe.last)) {
				oldest, oe = k, e
			}
		}
		if oe == nil {
			return // every client is in use: none may go
		}
		c.dropLocked(oldest, oe)
	}
}

func (c *Clients) dropLocked(k string, e *entry) {
	delete(c.m, k)
	e.t.CloseIdleConnections()
}

// Sweep drops the clients idle past the idle time now (Get does too, now
// and then).
func (c *Clients) Sweep() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sweepLocked(c.now(), 0)
}

// Len is how many clients are kept.
func (c *Clients) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// Close drops every client's idle connections.
func (c *Clients) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.m {
		e.t.CloseIdleConnections()
	}
}
