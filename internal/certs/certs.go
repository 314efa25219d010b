// Package certs loads the TLS material of weir's servers and of the
// clients of its control plane from files: a certificate and key that are
// re-read when the files change, so a certificate rotates without a
// restart, and CA pools. Nothing here logs or returns key material.
package certs

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// CheckEvery is how often, at most, a Keypair looks at its files: a
// handshake in between costs a lock and a pointer read.
const CheckEvery = 5 * time.Second

// Keypair is a certificate and its private key read from two PEM files,
// re-read on a handshake when either file's modification time or size
// changed since the last load (looked at once per CheckEvery at most). A
// reload that fails (a certificate written before its key, a bad file)
// keeps the last good pair and is retried when the files change again.
type Keypair struct {
	certFile, keyFile string
	log               *slog.Logger
	now               func() time.Time

	mu      sync.Mutex
	cert    *tls.Certificate
	loaded  stamp // the files as they were when cert was read
	failed  stamp // the files as they were at the last failed reload
	checked time.Time
}

// stamp is what a stat says about both files.
type stamp struct {
	certMod, keyMod   time.Time
	certSize, keySize int64
}

// Load reads certFile and keyFile (PEM). log receives a line per reload
// and per failed one (file names and the certificate's expiry, never the
// key); nil means slog.Default().
func Load(certFile, keyFile string, log *slog.Logger) (*Keypair, error) {
	if log == nil {
		log = slog.Default()
	}
	k := &Keypair{certFile: certFile, keyFile: keyFile, log: log, now: time.Now}
	st, err := k.stat()
	if err != nil {
		return nil, err
	}
	cert, err := k.read()
	if err != nil {
		return nil, err
	}
	k.cert, k.loaded, k.checked = cert, st, k.now()
	return k, nil
}

func (k *Keypair) stat() (stamp, error) {
	c, err := os.Stat(k.certFile)
	if err != nil {
		return stamp{}, fmt.Errorf("tls certificate: %w", err)
	}
	kf, err := os.Stat(k.keyFile)
	if err != nil {
		return stamp{}, fmt.Errorf("tls key: %w", err)
	}
	return stamp{certMod: c.ModTime(), keyMod: kf.ModTime(), certSize: c.Size(), keySize: kf.Size()}, nil
}

// read loads the pair. crypto/tls's errors name what is wrong (no PEM
// data, a key that does not match the certificate), never the contents.
func (k *Keypair) read() (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls certificate %s with key %s: %w", k.certFile, k.keyFile, err)
	}
	return &cert, nil
}

// Certificate returns the current pair, reloading it first if the files
// changed.
func (k *Keypair) Certificate() *tls.Certificate {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	if now.Sub(k.checked) < CheckEvery {
		return k.cert
	}
	k.checked = now
	st, err := k.stat()
	if err != nil || st == k.loaded || st == k.failed {
		return k.cert
	}
	cert, err := k.read()
	if err != nil {
		k.failed = st
		k.log.Warn("tls certificate reload failed; serving the previous one", "err", err)
		return k.cert
	}
	k.cert, k.loaded = cert, st
	k.log.Info("tls certificate reloaded", "cert", k.certFile, "not_after", cert.Leaf.NotAfter)
	return k.cert
}

// GetCertificate is tls.Config.GetCertificate, for servers.
func (k *Keypair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return k.Certificate(), nil
}

// GetClientCertificate is tls.Config.GetClientCertificate, for clients
// presenting a certificate (mTLS).
func (k *Keypair) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return k.Certificate(), nil
}

// Pool reads the PEM certificates in file into a pool, for verifying a
// server's or a client's certificate.
func Pool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("ca %s: no PEM certificate in it", file)
	}
	return p, nil
}

// ServerConfig serves kp's certificate (TLS 1.2 and later). With
// clientCAs, a client may present a certificate, which must then verify
// against them (a certificate from another CA fails the handshake); the
// handler decides which calls need one (tls.ConnectionState.VerifiedChains).
func ServerConfig(kp *Keypair, clientCAs *x509.CertPool) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: kp.GetCertificate}
	if clientCAs != nil {
		c.ClientCAs = clientCAs
		c.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return c
}

// ClientConfig trusts roots (nil: the system's) and, with kp, presents
// its certificate when the server asks for one.
func ClientConfig(roots *x509.CertPool, kp *Keypair) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}
	if kp != nil {
		c.GetClientCertificate = kp.GetClientCertificate
	}
	return c
}

// ErrHalfPair means one of a certificate and its key was given without
// the other.
var ErrHalfPair = errors.New("a certificate and its key go together: set both or neither")
