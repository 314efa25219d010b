package dataplane

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestTransportFailureRealDials classifies the errors real dials produce,
// through the worker's own upstream client: nothing is built by hand, so
// a change in how the standard library wraps them shows here.
func TestTransportFailureRealDials(t *testing.T) {
	t.Parallel()
	// A closed port: bound, then released, so nothing listens there.
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close() //nolint:errcheck // closing is the point

	// A listener that accepts and closes at once (reset), and one that
	// accepts and never answers (timeout).
	hangup := listen(t, func(c net.Conn) { c.Close() }) //nolint:errcheck // hanging up is the point
	silent := listen(t, func(c net.Conn) {})

	// A TLS server whose certificate no root here signed.
	untrusted := httptest.NewUnstartedServer(http.NotFoundHandler())
	untrusted.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshakes fail on purpose
	untrusted.StartTLS()
	t.Cleanup(untrusted.Close)
	// The same certificate trusted, asked for a name it does not carry.
	trusted := x509.NewCertPool()
	trusted.AddCert(untrusted.Certificate())
	wrongName := "https://localhost:" + untrusted.URL[strings.LastIndexByte(untrusted.URL, ':')+1:]

	for _, tc := range []struct {
		name  string
		url   string
		roots *x509.CertPool
		cause weirv1.TransportCause
		text  string
	}{
		{"closed port", "http://" + closedAddr + "/v1/messages", nil, weirv1.TransportCause_TRANSPORT_CAUSE_REFUSED, "connection refused"},
		{"no such host", "https://api.example.invalid/v1/messages", nil, weirv1.TransportCause_TRANSPORT_CAUSE_DNS, "no such host"},
		{"untrusted certificate", untrusted.URL + "/v1/messages", nil, weirv1.TransportCause_TRANSPORT_CAUSE_TLS, "certificate signed by an unknown authority"},
		{"certificate for another name", wrongName + "/v1/messages", trusted, weirv1.TransportCause_TRANSPORT_CAUSE_TLS, "certificate not valid for the host"},
		{"accepted and closed", "http://" + hangup + "/v1/messages", nil, weirv1.TransportCause_TRANSPORT_CAUSE_RESET, ""},
		{"accepted, never answered", "http://" + silent + "/v1/messages", nil, weirv1.TransportCause_TRANSPORT_CAUSE_TIMEOUT, "no response headers in time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := Config{UpstreamHeaderTimeout: 300 * time.Millisecond}
			cfg.setDefaults()
			if tc.roots != nil {
				cfg.Upstream.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: tc.roots}
			}
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, tc.url, strings.NewReader(`{"model":"m"}`))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := cfg.Upstream.Do(req)
			if err == nil {
				resp.Body.Close() //nolint:errcheck // a test
				t.Fatalf("status %d, want a transport error", resp.StatusCode)
			}
			cause, text := transportFailure(err)
			if cause != tc.cause || (tc.text != "" && text != tc.text) {
				t.Fatalf("transportFailure(%v) = %v %q, want %v %q", err, cause, text, tc.cause, tc.text)
			}
			// The text names the kind, never where: no address, port or host.
			for _, where := range []string{"127.0.0.1", "localhost", "example.invalid", closedAddr, hangup, silent} {
				if strings.Contains(text, where) {
					t.Fatalf("text %q names %q", text, where)
				}
			}
		})
	}
}

// listen serves each accepted connection with serve until the test ends,
// and returns the address.
func listen(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			serve(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close() //nolint:errcheck // teardown
		<-done
		for _, c := range conns {
			c.Close() //nolint:errcheck // teardown
		}
	})
	return ln.Addr().String()
}
