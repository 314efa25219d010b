package chaos

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
)

// echoServer answers each line with name + ": " + the line.
func echoServer(t *testing.T, name string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					io.WriteString(c, name+": "+line) //nolint:errcheck // test
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, br *bufio.Reader, line string) string {
	t.Helper()
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatal(err)
	}
	got, err := br.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(got)
}

func dialProxy(t *testing.T, p *Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func TestProxyRoundRobinAndCut(t *testing.T) {
	t.Parallel()
	p, err := NewProxy(echoServer(t, "a"), echoServer(t, "b"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c1, r1 := dialProxy(t, p)
	c2, r2 := dialProxy(t, p)
	got := []string{roundTrip(t, c1, r1, "hi"), roundTrip(t, c2, r2, "hi")}
	if !(got[0] == "a: hi" && got[1] == "b: hi") && !(got[0] == "b: hi" && got[1] == "a: hi") {
		t.Fatalf("answers %q: want one from each backend", got)
	}
	if n := p.Cut(); n != 4 {
		t.Errorf("cut %d connections, want 4 (two each side)", n)
	}
	if _, err := r1.ReadString('\n'); err == nil {
		t.Error("a cut connection still reads")
	}
	// A new connection after the cut works again.
	c3, r3 := dialProxy(t, p)
	if got := roundTrip(t, c3, r3, "again"); !strings.HasSuffix(got, ": again") {
		t.Errorf("after the cut: %q", got)
	}
}

func TestProxyNoBackendRefuses(t *testing.T) {
	t.Parallel()
	p, err := NewProxy()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, br := dialProxy(t, p)
	if _, err := br.ReadString('\n'); err == nil {
		t.Error("a connection with no backend stays open")
	}
	p.SetBackends(echoServer(t, "late"))
	c, br := dialProxy(t, p)
	if got := roundTrip(t, c, br, "x"); got != "late: x" {
		t.Errorf("got %q", got)
	}
}

func TestProxyBlackholeHoldsUntilHealed(t *testing.T) {
	t.Parallel()
	p, err := NewProxy(echoServer(t, "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	held := make(chan struct{}, 4)
	p.mu.Lock()
	p.onHold = func() { held <- struct{}{} }
	p.mu.Unlock()
	c, br := dialProxy(t, p)
	if got := roundTrip(t, c, br, "before"); got != "a: before" {
		t.Fatalf("got %q", got)
	}
	p.Blackhole(true)
	if _, err := io.WriteString(c, "during\n"); err != nil {
		t.Fatal(err)
	}
	<-held // the line waits at the proxy
	// And a new connection waits before it is forwarded.
	c2, br2 := dialProxy(t, p)
	<-held
	p.Blackhole(false)
	if got, err := br.ReadString('\n'); err != nil || strings.TrimSpace(got) != "a: during" {
		t.Fatalf("after healing: %q, %v", got, err)
	}
	if got := roundTrip(t, c2, br2, "new"); got != "a: new" {
		t.Errorf("new connection after healing: %q", got)
	}
}
