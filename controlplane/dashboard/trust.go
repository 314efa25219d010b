package dashboard

import (
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
)

// What a request says about itself is believed only from a trusted proxy
// (Config.TrustedProxies): its X-Forwarded-Proto says whether the browser
// used TLS, its X-Forwarded-For's last hop is the browser. Anyone else's
// headers are the browser's own claims and change nothing.

// peerAddr is the address of the connection's other end.
func peerAddr(r *http.Request) (netip.Addr, bool) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, err := netip.ParseAddr(host)
	return a.Unmap(), err == nil
}

func (h *Handler) fromTrustedProxy(r *http.Request) bool {
	a, ok := peerAddr(r)
	return ok && slices.ContainsFunc(h.cfg.TrustedProxies, func(p netip.Prefix) bool { return p.Contains(a) })
}

// secure says the browser reached us over TLS: directly, or through a
// trusted proxy that says so. Cookies are then Secure and HSTS is sent.
func (h *Handler) secure(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	return h.fromTrustedProxy(r) && strings.EqualFold(strings.TrimSpace(r.Header.Get("X-Forwarded-Proto")), "https")
}

// source is the browser's address, as a limit counts it: an IPv4 address,
// or an IPv6 address's /64 (one host commonly holds the whole /64).
func (h *Handler) source(r *http.Request) netip.Prefix {
	a, _ := peerAddr(r)
	if h.fromTrustedProxy(r) {
		hops := strings.Split(r.Header.Get("X-Forwarded-For"), ",")
		if fa, err := netip.ParseAddr(strings.TrimSpace(hops[len(hops)-1])); err == nil {
			a = fa.Unmap()
		}
	}
	return sourcePrefix(a)
}

func sourcePrefix(a netip.Addr) netip.Prefix {
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, _ := a.Prefix(bits) // an invalid address (no peer) is one zero prefix
	return p
}
