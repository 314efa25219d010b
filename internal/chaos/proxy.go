package chaos

import (
	"net"
	"sync"
)

// Proxy is a TCP proxy the harness can cut: it forwards each connection it
// accepts to the next of its backends (round-robin), closes every
// connection on Cut, and forwards nothing while blackholed (bytes and new
// connections wait until it heals, like a partition: no error, only
// silence). With no backend, a new connection is closed at once, as a
// refused one would be.
type Proxy struct {
	ln net.Listener

	mu       sync.Mutex
	backends []string
	next     int
	conns    map[net.Conn]struct{}
	// open is closed while traffic flows; a blackhole replaces it with a
	// fresh channel, closed when it heals.
	open   chan struct{}
	closed bool
	// onHold, for tests, is called when a connection's bytes or dial wait
	// for a blackhole to heal.
	onHold func()
}

// NewProxy listens on a fresh loopback port.
func NewProxy(backends ...string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	open := make(chan struct{})
	close(open)
	p := &Proxy{ln: ln, backends: backends, conns: map[net.Conn]struct{}{}, open: open}
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetBackends replaces the backends new connections go to; connections
// already made stay.
func (p *Proxy) SetBackends(addrs ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.backends = append([]string(nil), addrs...)
}

// Cut closes every connection through the proxy and reports how many
// there were (each side counted).
func (p *Proxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns)
	for c := range p.conns {
		c.Close() //nolint:errcheck // cutting
	}
	clear(p.conns)
	return n
}

// Blackhole stops (on) or resumes forwarding.
func (p *Proxy) Blackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		if on {
			p.open = make(chan struct{})
		}
	default:
		if !on {
			close(p.open)
		}
	}
}

// Close stops accepting, heals and cuts everything.
func (p *Proxy) Close() {
	p.ln.Close() //nolint:errcheck // teardown
	p.Blackhole(false)
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.Cut()
}

// wait blocks while the proxy is blackholed.
func (p *Proxy) wait() {
	p.mu.Lock()
	open, hook := p.open, p.onHold
	p.mu.Unlock()
	select {
	case <-open:
		return
	default:
	}
	if hook != nil {
		hook()
	}
	<-open
}

// track remembers c for Cut; false when the proxy is closed.
func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) forget(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		c.Close() //nolint:errcheck // done
	}
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

func (p *Proxy) serve(c net.Conn) {
	if !p.track(c) {
		c.Close() //nolint:errcheck // closed proxy
		return
	}
	p.wait()
	p.mu.Lock()
	var addr string
	if len(p.backends) > 0 {
		addr = p.backends[p.next%len(p.backends)]
		p.next++
	}
	p.mu.Unlock()
	if addr == "" {
		p.forget(c)
		return
	}
	b, err := net.Dial("tcp", addr)
	if err != nil {
		p.forget(c)
		return
	}
	if !p.track(b) {
		p.forget(c, b)
		return
	}
	done := make(chan struct{}, 2)
	go p.pipe(b, c, done)
	go p.pipe(c, b, done)
	<-done
	p.forget(c, b)
	<-done
}

// pipe copies src to dst, holding each chunk while the proxy is
// blackholed.
func (p *Proxy) pipe(dst, src net.Conn, done chan<- struct{}) {
	defer func() { done <- struct{}{} }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.wait()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
