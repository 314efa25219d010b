package certs

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirhq/weir/internal/certs/certtest"
	"github.com/weirhq/weir/internal/clock"
	"github.com/weirhq/weir/internal/serve"
	"github.com/weirhq/weir/internal/syncbuf"
)

// replace writes a leaf over the files as a rotation does (write aside,
// rename), its modification time a second on so that it differs even on
// a coarse file system.
func replace(t *testing.T, file string, data []byte, mod time.Time) {
	t.Helper()
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tmp, mod, mod); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
}

// TestKeypairServesRotatedCertificate: a server over serve.Run with a
// Keypair serves, on the next handshake after the check interval, the
// certificate written over its files; it does not look at the files
// before then; a half-written rotation (a certificate whose key is not
// there yet) keeps the previous certificate until the key arrives. The
// log says what happened and never shows a key.
func TestKeypairServesRotatedCertificate(t *testing.T) {
	t.Parallel()
	ca := certtest.NewCA(t, "test ca")
	dir := t.TempDir()
	first, second, third := ca.Server(t, "first"), ca.Server(t, "second"), ca.Server(t, "third")
	certFile, keyFile := first.Write(t, dir, "server")
	logs := &syncbuf.Buffer{}
	kp, err := Load(certFile, keyFile, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(time.Now())
	kp.now = clk.Now
	kp.checked = clk.Now()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- serve.Run(ctx, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(r.Proto)) //nolint:errcheck // test
		}), serve.Options{TLS: ServerConfig(kp, nil)})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	served := func() *big.Int {
		t.Helper()
		conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: ca.Pool(), NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		defer conn.Close()
		st := conn.ConnectionState()
		if st.NegotiatedProtocol != "h2" {
			t.Errorf("ALPN %q, want h2", st.NegotiatedProtocol)
		}
		return st.PeerCertificates[0].SerialNumber
	}
	if got := served(); got.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatal("the first certificate is not served")
	}

	mod := time.Now().Add(time.Second)
	replace(t, certFile, second.CertPEM, mod)
	replace(t, keyFile, second.KeyPEM, mod)
	if got := served(); got.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatal("the files were read again before the check interval")
	}
	clk.Advance(CheckEvery)
	if got := served(); got.Cmp(second.Cert.SerialNumber) != 0 {
		t.Fatal("the rotated certificate is not served on the next handshake")
	}

	// Half a rotation: the third certificate, still the second's key.
	mod = mod.Add(time.Second)
	replace(t, certFile, third.CertPEM, mod)
	clk.Advance(CheckEvery)
	if got := served(); got.Cmp(second.Cert.SerialNumber) != 0 {
		t.Fatal("a certificate without its key replaced the working pair")
	}
	replace(t, keyFile, third.KeyPEM, mod.Add(time.Second))
	clk.Advance(CheckEvery)
	if got := served(); got.Cmp(third.Cert.SerialNumber) != 0 {
		t.Fatal("the completed rotation is not served")
	}

	// Cleartext HTTP/2 is off on a TLS server; HTTP/2 over TLS is on.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}, ForceAttemptHTTP2: true}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("https://" + ln.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Errorf("HTTPS answered over %s, want HTTP/2", resp.Proto)
	}

	out := logs.String()
	if strings.Count(out, "tls certificate reloaded") != 2 || strings.Count(out, "tls certificate reload failed") != 1 {
		t.Errorf("log:\n%s", out)
	}
	for _, l := range []certtest.Leaf{first, second, third} {
		if strings.Contains(out, string(l.KeyPEM[40:80])) {
			t.Error("a private key appeared in the log")
		}
	}
}

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	ca := certtest.NewCA(t, "test ca")
	dir := t.TempDir()
	a, b := ca.Server(t, "a"), ca.Server(t, "b")
	certA, keyA := a.Write(t, dir, "a")
	_, keyB := b.Write(t, dir, "b")
	if _, err := Load(certA, keyB, nil); err == nil || strings.Contains(err.Error(), "PRIVATE KEY") {
		t.Errorf("mismatched pair: %v", err)
	}
	if _, err := Load(certA, filepath.Join(dir, "missing.key"), nil); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing key: %v", err)
	}
	if _, err := Pool(keyA); err == nil || strings.Contains(err.Error(), "PRIVATE KEY") {
		t.Errorf("a key as a CA file: %v", err)
	}
	if p, err := Pool(ca.Write(t, dir, "ca")); err != nil || p == nil {
		t.Errorf("CA file: %v", err)
	}
}
