package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
)

// refusedError is an HTTP proxy's answer to CONNECT other than 200.
type refusedError struct{ status int }

func (e *refusedError) Error() string {
	return "the proxy refused CONNECT (" + statusText(e.status) + ")"
}

// statusText is "407 Proxy Authentication Required": the code and Go's
// own words for it, never the proxy's.
func statusText(code int) string {
	s := strconv.Itoa(code)
	if t := http.StatusText(code); t != "" {
		s += " " + t
	}
	return s
}

// Failure says whether err, a request's failure through a proxy, was the
// proxy's own: it could not be reached (a dial, a lookup or a TLS
// handshake with the proxy failed, "proxyconnect" in net/http's words),
// or it refused (the SOCKS handshake failed, or CONNECT was answered
// other than 200). text says which, without an address or credential:
// "could not be reached (connection refused)". A failure past the proxy
// (the upstream's answer, or its connection cut) is not the proxy's.
func Failure(err error) (text string, ok bool) {
	var refused *refusedError
	if errors.As(err, &refused) {
		return "refused: it answered CONNECT " + statusText(refused.status), true
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		op, isOp := e.(*net.OpError)
		switch {
		case !isOp:
		case op.Op == "proxyconnect":
			return "could not be reached (" + dialCause(op.Err) + ")", true
		case op.Op == "socks connect":
			return "refused the SOCKS5 handshake (" + socksCause(op.Err) + ")", true
		}
	}
	return "", false
}

// RefusedStatus is the text of a proxy's refusal by status: the answer an
// HTTP proxy gives a plain http:// request it will not forward (407: its
// credentials were missing or wrong).
func RefusedStatus(code int) string {
	return "refused: it answered " + statusText(code)
}

// dialCause says why the proxy could not be reached.
func dialCause(err error) string {
	var (
		dns    *net.DNSError
		netErr net.Error
		rec    tls.RecordHeaderError
		verify *tls.CertificateVerificationError
	)
	switch {
	case errors.As(err, &dns) && dns.IsNotFound:
		return "no such host"
	case errors.As(err, &dns):
		return "lookup failed"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	case errors.As(err, &rec):
		return "the proxy does not speak TLS"
	case errors.As(err, &verify):
		return "the proxy's certificate is not trusted"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return "timed out"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "no route to the proxy"
	}
	return "connection failed"
}

// socksCause says why a SOCKS5 proxy refused: net/http's SOCKS client
// words a refusal in fixed texts (RFC 1928's replies, the methods).
func socksCause(err error) string {
	switch msg := err.Error(); {
	case strings.Contains(msg, "authentication"):
		// "username/password authentication failed", or "no acceptable
		// authentication methods": none were given and it wants some.
		return "its credentials were refused or missing"
	case strings.HasPrefix(msg, "unknown error "):
		// A reply other than success, in RFC 1928's words: "host
		// unreachable", "connection refused", "connection not allowed by
		// ruleset".
		return "it could not open the tunnel: " + strings.TrimPrefix(msg, "unknown error ")
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		return "it closed the connection"
	}
	var netErr net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout() {
		return "timed out"
	}
	return "the handshake failed"
}
