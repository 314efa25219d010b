// Package proxytest is small real proxies for tests: a SOCKS5 server
// (no authentication, or a user name and password) and an HTTP proxy
// that forwards plain http:// requests and answers CONNECT, each counting
// what passed through it and remembering the local addresses of the
// connections it opened, so that a test can tell the upstream's requests
// that came through it from those that did not.
package proxytest

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Proxy is one running proxy.
type Proxy struct {
	// URL is the proxy's URL, with user:pass@ when it wants credentials.
	URL string
	// Addr is its host:port.
	Addr string

	user, pass string
	ln         net.Listener

	mu       sync.Mutex
	passed   []string
	outbound map[string]bool
	refused  int
	conns    map[net.Conn]bool
	closed   bool
	wg       sync.WaitGroup
}

// dialTimeout bounds the proxy's own dial of a target.
const dialTimeout = 10 * time.Second

func newProxy(t testing.TB, scheme, user, pass string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxytest: listen: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), user: user, pass: pass, ln: ln,
		outbound: map[string]bool{}, conns: map[net.Conn]bool{}}
	u := url.URL{Scheme: scheme, Host: p.Addr}
	if user != "" {
		u.User = url.UserPassword(user, pass)
	}
	p.URL = u.String()
	t.Cleanup(p.Close)
	return p
}

// Count is how many requests and tunnels passed through the proxy: a
// forwarded request, a CONNECT, a SOCKS5 connect.
func (p *Proxy) Count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.passed)
}

// Passed lists them in order: "GET http://host/path" for a forwarded
// request, "CONNECT host:port" for a tunnel (HTTP or SOCKS5).
func (p *Proxy) Passed() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.passed...)
}

// Refused is how many handshakes it refused for their credentials.
func (p *Proxy) Refused() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// Opened says whether addr (as an upstream sees a client: host:port) is
// the local end of a connection the proxy opened to a target.
func (p *Proxy) Opened(addr string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.outbound[addr]
}

// Close stops the proxy and cuts every connection through it.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.ln.Close() //nolint:errcheck // closing
	for c := range p.conns {
		c.Close() //nolint:errcheck // closing
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) record(what string) {
	p.mu.Lock()
	p.passed = append(p.passed, what)
	p.mu.Unlock()
}

// track keeps c to be cut by Close; false when the proxy is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close() //nolint:errcheck // refused
		return false
	}
	p.conns[c] = true
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close() //nolint:errcheck // done
}

// dial opens a connection to a target and remembers its local end.
func (p *Proxy) dial(addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return nil, err
	}
	if !p.track(c) {
		return nil, net.ErrClosed
	}
	p.mu.Lock()
	p.outbound[c.LocalAddr().String()] = true
	p.mu.Unlock()
	return c, nil
}

// pipe copies both ways until either side ends.
func (p *Proxy) pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src) //nolint:errcheck // either end may go
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite() //nolint:errcheck // half-close
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
}

func (p *Proxy) serve(handle func(net.Conn)) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := p.ln.Accept()
			if err != nil {
				return
			}
			if !p.track(c) {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer p.untrack(c)
				handle(c)
			}()
		}
	}()
}

// NewSOCKS5 starts a SOCKS5 proxy (RFC 1928, CONNECT only) on 127.0.0.1.
// With a user name it takes only the user/password method (RFC 1929)
// with user and pass; without, only no authentication.
func NewSOCKS5(t testing.TB, user, pass string) *Proxy {
	t.Helper()
	p := newProxy(t, "socks5", user, pass)
	p.serve(p.socks)
	return p
}

func (p *Proxy) socks(c net.Conn) {
	br := bufio.NewReader(c)
	var head [2]byte
	if _, err := io.ReadFull(br, head[:]); err != nil || head[0] != 5 {
		return
	}
	methods := make([]byte, head[1])
	if _, err := io.ReadFull(br, methods); err != nil {
		return
	}
	want := byte(0x00)
	if p.user != "" {
		want = 0x02
	}
	if !strings.ContainsRune(string(methods), rune(want)) {
		c.Write([]byte{5, 0xff}) //nolint:errcheck // refused
		p.mu.Lock()
		p.refused++
		p.mu.Unlock()
		return
	}
	if _, err := c.Write([]byte{5, want}); err != nil {
		return
	}
	if p.user != "" && !p.socksAuth(c, br) {
		return
	}
	var req [4]byte
	if _, err := io.ReadFull(br, req[:]); err != nil || req[0] != 5 {
		return
	}
	if req[1] != 1 { // CONNECT only
		c.Write([]byte{5, 7, 0, 1, 0, 0, 0, 0, 0, 0}) //nolint:errcheck // command not supported
		return
	}
	var host string
	switch req[3] {
	case 1, 4:
		ip := make([]byte, map[byte]int{1: 4, 4: 16}[req[3]])
		if _, err := io.ReadFull(br, ip); err != nil {
			return
		}
		host = net.IP(ip).String()
	case 3:
		n, err := br.ReadByte()
		if err != nil {
			return
		}
		name := make([]byte, n)
		if _, err := io.ReadFull(br, name); err != nil {
			return
		}
		host = string(name)
	default:
		c.Write([]byte{5, 8, 0, 1, 0, 0, 0, 0, 0, 0}) //nolint:errcheck // address type not supported
		return
	}
	var port [2]byte
	if _, err := io.ReadFull(br, port[:]); err != nil {
		return
	}
	target := net.JoinHostPort(host, strconv.Itoa(int(binary.BigEndian.Uint16(port[:]))))
	up, err := p.dial(target)
	if err != nil {
		c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0}) //nolint:errcheck // connection refused
		return
	}
	defer p.untrack(up)
	if _, err := c.Write([]byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0}); err != nil {
		return
	}
	p.record("CONNECT " + target)
	p.pipe(&bufferedConn{Conn: c, r: br}, up)
}

// socksAuth runs the user/password subnegotiation (RFC 1929).
func (p *Proxy) socksAuth(c net.Conn, br *bufio.Reader) bool {
	var ver [2]byte
	if _, err := io.ReadFull(br, ver[:]); err != nil || ver[0] != 1 {
		return false
	}
	user := make([]byte, ver[1])
	if _, err := io.ReadFull(br, user); err != nil {
		return false
	}
	n, err := br.ReadByte()
	if err != nil {
		return false
	}
	pass := make([]byte, n)
	if _, err := io.ReadFull(br, pass); err != nil {
		return false
	}
	if string(user) != p.user || string(pass) != p.pass {
		c.Write([]byte{1, 1}) //nolint:errcheck // refused
		p.mu.Lock()
		p.refused++
		p.mu.Unlock()
		return false
	}
	_, err = c.Write([]byte{1, 0})
	return err == nil
}

// bufferedConn reads what its reader buffered first.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// CloseWrite half-closes the connection underneath.
func (b *bufferedConn) CloseWrite() error {
	if tc, ok := b.Conn.(*net.TCPConn); ok {
		return tc.CloseWrite()
	}
	return nil
}

// NewHTTP starts an HTTP proxy on 127.0.0.1: it forwards an absolute-form
// request (a plain http:// upstream) and tunnels a CONNECT. With a user
// name it wants Basic Proxy-Authorization with user and pass, and
// answers 407 otherwise.
func NewHTTP(t testing.TB, user, pass string) *Proxy {
	t.Helper()
	p := newProxy(t, "http", user, pass)
	tr := &http.Transport{
		DialContext: func(_ context.Context, _, addr string) (net.Conn, error) { return p.dial(addr) },
		// One connection per request: the upstream sees each forwarded
		// request from an address the proxy opened.
		DisableKeepAlives: true,
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.http(w, r, tr)
	}), ReadHeaderTimeout: 10 * time.Second}
	srv.ConnState = func(c net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			p.track(c)
		case http.StateClosed:
			p.mu.Lock()
			delete(p.conns, c)
			p.mu.Unlock()
		}
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		srv.Serve(p.ln) //nolint:errcheck // ends with Close
	}()
	t.Cleanup(func() { srv.Close() }) //nolint:errcheck // closing
	return p
}

func (p *Proxy) http(w http.ResponseWriter, r *http.Request, tr *http.Transport) {
	if p.user != "" {
		want := "Basic " + base64.StdEncoding.EncodeToString([]byte(p.user+":"+p.pass))
		if r.Header.Get("Proxy-Authorization") != want {
			p.mu.Lock()
			p.refused++
			p.mu.Unlock()
			w.Header().Set("Proxy-Authenticate", `Basic realm="proxytest"`)
			http.Error(w, "proxy credentials required", http.StatusProxyAuthRequired)
			return
		}
	}
	if r.Method == http.MethodConnect {
		p.connect(w, r)
		return
	}
	if !r.URL.IsAbs() {
		http.Error(w, "not a proxy request", http.StatusBadRequest)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	for _, h := range []string{"Proxy-Authorization", "Proxy-Connection", "Connection", "Keep-Alive"} {
		out.Header.Del(h)
	}
	p.record(r.Method + " " + r.URL.String())
	resp, err := tr.RoundTrip(out)
	if err != nil {
		http.Error(w, "proxytest: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			rc.Flush() //nolint:errcheck // streams go on event by event
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) connect(w http.ResponseWriter, r *http.Request) {
	up, err := p.dial(r.Host)
	if err != nil {
		http.Error(w, "proxytest: cannot reach "+r.Host, http.StatusBadGateway)
		return
	}
	defer p.untrack(up)
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	if _, err := brw.WriteString("HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	if err := brw.Flush(); err != nil {
		return
	}
	p.record("CONNECT " + r.Host)
	p.pipe(&bufferedConn{Conn: c, r: brw.Reader}, up)
}

// ClosedURL is a proxy URL of scheme at an address where nothing listens
// (a port just closed): every dial of it is refused.
func ClosedURL(t testing.TB, scheme string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxytest: listen: %v", err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Fatalf("proxytest: close: %v", err)
	}
	return scheme + "://" + addr
}
