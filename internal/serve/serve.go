// Package serve runs an HTTP server that speaks HTTP/1.1 and cleartext
// HTTP/2 on one listener, or HTTP/1.1 and HTTP/2 over TLS, until its
// context ends, then drains it.
package serve

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// Options tune a server; zero values are sensible.
type Options struct {
	// ShutdownTimeout bounds the drain after ctx ends. Default 10s.
	ShutdownTimeout time.Duration
	// ReadHeaderTimeout defends against slow-header clients. Default 10s.
	ReadHeaderTimeout time.Duration
	// OnShutdown runs as the drain begins (e.g. to end long streams).
	OnShutdown func()
	Logger     *slog.Logger
	// TLS, when set, serves TLS (HTTP/2 by ALPN, else HTTP/1.1) instead
	// of cleartext; it must give a certificate (GetCertificate).
	TLS *tls.Config
	// QuietErrors logs the HTTP server's own error lines at debug, not
	// warn: for a server whose clients hang up as a matter of course
	// (the upstream simulator).
	QuietErrors bool
	// HTTP1Only serves cleartext HTTP/1.1 alone, no h2c: for a server
	// whose dropped connections must be dropped TCP connections, not
	// HTTP/2 stream resets (the upstream simulator).
	HTTP1Only bool
}

// Run serves h on ln until ctx is done, then shuts down gracefully.
func Run(ctx context.Context, ln net.Listener, h http.Handler, o Options) error {
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = 10 * time.Second
	}
	if o.ReadHeaderTimeout == 0 {
		o.ReadHeaderTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	errorLevel := slog.LevelWarn
	if o.QuietErrors {
		errorLevel = slog.LevelDebug
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: o.ReadHeaderTimeout,
		IdleTimeout:       2 * time.Minute,
		Protocols:         new(http.Protocols),
		ErrorLog:          slog.NewLogLogger(o.Logger.Handler(), errorLevel),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	srv.Protocols.SetHTTP1(true)
	if o.TLS != nil {
		srv.Protocols.SetHTTP2(true)
		srv.TLSConfig = o.TLS
	} else if !o.HTTP1Only {
		srv.Protocols.SetUnencryptedHTTP2(true)
	}
	if o.OnShutdown != nil {
		srv.RegisterOnShutdown(o.OnShutdown)
	}
	errc := make(chan error, 1)
	go func() {
		if o.TLS != nil {
			errc <- srv.ServeTLS(ln, "", "")
			return
		}
		errc <- srv.Serve(ln)
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = srv.Close()
	}
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		return serr
	}
	return err
}
