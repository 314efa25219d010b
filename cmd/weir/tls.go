package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/weirhq/weir/internal/certs"
	"github.com/weirhq/weir/internal/rpcclient"
)

// keypair loads the certificate and key files named by certVar and keyVar:
// nil when neither is set, an error naming the variables when only one is.
func keypair(e env, certVar, keyVar string, log *slog.Logger) (*certs.Keypair, error) {
	certFile, keyFile := e.getenv(certVar), e.getenv(keyVar)
	switch {
	case certFile == "" && keyFile == "":
		return nil, nil
	case certFile == "" || keyFile == "":
		return nil, fmt.Errorf("%s and %s: %w", certVar, keyVar, certs.ErrHalfPair)
	}
	kp, err := certs.Load(certFile, keyFile, log)
	if err != nil {
		return nil, fmt.Errorf("%s, %s: %w", certVar, keyVar, err)
	}
	return kp, nil
}

// dataPlaneTLS is the data plane's server TLS, from
// WEIR_DATAPLANE_TLS_CERT and WEIR_DATAPLANE_TLS_KEY; nil serves cleartext.
func dataPlaneTLS(e env, log *slog.Logger) (*tls.Config, error) {
	kp, err := keypair(e, "WEIR_DATAPLANE_TLS_CERT", "WEIR_DATAPLANE_TLS_KEY", log)
	if err != nil || kp == nil {
		return nil, err
	}
	return certs.ServerConfig(kp, nil), nil
}

// controlPlaneTLS is the control plane's server TLS, from
// WEIR_CONTROLPLANE_TLS_CERT and WEIR_CONTROLPLANE_TLS_KEY, and whether
// LeaseService requires a client certificate: with
// WEIR_CONTROLPLANE_CLIENT_CA the server verifies the certificates clients
// give against it. nil serves cleartext.
func controlPlaneTLS(e env, log *slog.Logger) (tc *tls.Config, requireClientCert bool, err error) {
	kp, err := keypair(e, "WEIR_CONTROLPLANE_TLS_CERT", "WEIR_CONTROLPLANE_TLS_KEY", log)
	if err != nil {
		return nil, false, err
	}
	clientCA := e.getenv("WEIR_CONTROLPLANE_CLIENT_CA")
	if kp == nil {
		if clientCA != "" {
			return nil, false, fmt.Errorf("WEIR_CONTROLPLANE_CLIENT_CA needs TLS: set WEIR_CONTROLPLANE_TLS_CERT and WEIR_CONTROLPLANE_TLS_KEY")
		}
		return nil, false, nil
	}
	var pool *x509.CertPool
	if clientCA != "" {
		if pool, err = certs.Pool(clientCA); err != nil {
			return nil, false, fmt.Errorf("WEIR_CONTROLPLANE_CLIENT_CA: %w", err)
		}
	}
	return certs.ServerConfig(kp, pool), pool != nil, nil
}

// controlPlaneClient is the HTTP client reaching the control plane at url:
// h2c for http, HTTP/2 over TLS for https, trusting WEIR_CONTROLPLANE_CA
// (else the system roots). A data plane (asDataPlane) presents
// WEIR_DATAPLANE_CLIENT_CERT and WEIR_DATAPLANE_CLIENT_KEY when set (mTLS).
func controlPlaneClient(e env, url string, asDataPlane bool, log *slog.Logger) (*http.Client, error) {
	ca := e.getenv("WEIR_CONTROLPLANE_CA")
	var kp *certs.Keypair
	if asDataPlane {
		var err error
		if kp, err = keypair(e, "WEIR_DATAPLANE_CLIENT_CERT", "WEIR_DATAPLANE_CLIENT_KEY", log); err != nil {
			return nil, err
		}
	}
	if !strings.HasPrefix(url, "https://") {
		if ca != "" || kp != nil {
			return nil, fmt.Errorf("WEIR_CONTROLPLANE_CA and the data plane's client certificate need an https control plane, not %s", url)
		}
		return rpcclient.HTTPClient(), nil
	}
	var roots *x509.CertPool
	if ca != "" {
		var err error
		if roots, err = certs.Pool(ca); err != nil {
			return nil, fmt.Errorf("WEIR_CONTROLPLANE_CA: %w", err)
		}
	}
	return rpcclient.TLSHTTPClient(certs.ClientConfig(roots, kp)), nil
}
