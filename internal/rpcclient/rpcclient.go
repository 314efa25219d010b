// Package rpcclient holds what every Connect client of the control plane
// needs: an HTTP client that speaks h2c (the control plane serves Connect,
// gRPC and gRPC-Web on one cleartext HTTP/2 port) or HTTP/2 over TLS, and
// a bearer-token interceptor.
package rpcclient

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"
)

// HTTPClient returns a client that multiplexes calls over cleartext HTTP/2.
// A nil timeout means none: per-call deadlines come from contexts.
func HTTPClient() *http.Client {
	t := transport()
	t.Protocols.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: t}
}

// TLSHTTPClient returns a client for an https control plane: HTTP/2 over
// TLS (HTTP/1.1 only if the server offers nothing else) with tc, which
// says which roots to trust and which certificate to present.
func TLSHTTPClient(tc *tls.Config) *http.Client {
	t := transport()
	t.TLSClientConfig = tc
	t.TLSHandshakeTimeout = 10 * time.Second
	t.Protocols.SetHTTP2(true)
	t.Protocols.SetHTTP1(true)
	return &http.Client{Transport: t}
}

func transport() *http.Transport {
	return &http.Transport{
		Proxy:               nil, // control-plane traffic never goes through an HTTP proxy
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		Protocols:           new(http.Protocols),
	}
}

// Token is a client interceptor that sends a bearer token on every call.
func Token(token string) connect.Interceptor { return bearer(token) }

type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", "Bearer "+string(b))
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", "Bearer "+string(b))
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// Actor is a client interceptor that says who is calling, in the
// Weir-Actor header the control plane's audit log records
// (controlplane.ActorHeader). It is a declaration, not a credential.
func Actor(name string) connect.Interceptor { return actor(name) }

type actor string

func (a actor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Weir-Actor", string(a))
		return next(ctx, req)
	}
}

func (a actor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Weir-Actor", string(a))
		return conn
	}
}

func (a actor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
