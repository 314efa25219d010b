package dataplane

import (
	"github.com/weirhq/weir/internal/defaults"

	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// Config configures a data-plane worker. Zero values take the defaults
// noted on each field.
type Config struct {
	// ControlPlaneURL is where LeaseService is served. Required.
	// Env: WEIR_CONTROLPLANE_URL.
	ControlPlaneURL string
	// Token is the data-plane token for LeaseService. Required.
	// Env: WEIR_DATAPLANE_TOKEN.
	Token string
	// MaxBodyBytes caps a request body. Default 32 MiB.
	MaxBodyBytes int64
	// MaxResponseBytes caps a non-streamed upstream answer, which is read
	// whole before it is sent: a larger one fails like a cut connection
	// and is never held whole. Default 64 MiB.
	MaxResponseBytes int64
	// BodyReadTimeout bounds reading a request's body once its headers
	// arrived (the server's ReadHeaderTimeout bounds those), and a
	// Responses WebSocket message once its first frame arrived: a client
	// that trickles gets a 408 instead of holding a handler and its
	// reserved bytes. It is counted from the start, never renewed, and
	// does not bound the response, however long a stream runs. Default 2m.
	BodyReadTimeout time.Duration
	// BodyIdleTimeout cuts a body (or a WebSocket message) that makes no
	// progress for this long, within BodyReadTimeout: a client that stops
	// sending gets a 408 at once rather than at the overall bound. Every
	// read that brings a byte starts it again. Default 10s; a value above
	// BodyReadTimeout leaves the overall bound alone.
	BodyIdleTimeout time.Duration
	// MaxWebSocketsPerKey bounds the Responses WebSocket connections one
	// client key holds open on this worker at once; past it the handshake
	// gets a 429 in the OpenAI format (Codex then speaks HTTP). Each
	// connection's messages count against the body buffer like HTTP
	// bodies. Default 32.
	MaxWebSocketsPerKey int
	// RefusalInterval is the span over which the worker counts requests
	// refused before routing (bad keys, rate limits, the body buffer, bad
	// input), per key and reason, before it reports the count: a flood of
	// refusals costs the database one row per worker, key, reason and
	// interval. Default 1m; at least 1s.
	RefusalInterval time.Duration
	// MaxAttempts caps upstream attempts (across accounts) per request.
	// Default 5.
	MaxAttempts int
	// KeyCacheTTL is how long a verified client key is trusted without
	// asking again; Acquire re-checks every key regardless. Default 5s.
	KeyCacheTTL time.Duration
	// LeaseIdle is how long a reusable lease may sit idle on this worker
	// before it is returned to the pool (see leasePool). Default 100ms; a
	// negative value turns reuse off on this worker (every request then
	// asks the control plane).
	LeaseIdle time.Duration
	// ReportInterval spaces a worker's ReportRoutes calls, and its
	// ReleaseBatch calls, at least this far apart: under load each call
	// carries everything queued since the last, so Postgres commits a few
	// large batches instead of one per request. A report after a quiet
	// spell goes at once, and nothing that waits on the control plane's
	// answer is paced: a failure's Release, a probe's, a budgeted key's
	// spend. Default 250ms (a route batch that fills, 256 events, goes at
	// once): at 200 req/s a worker's two calls every 100 ms were most of
	// what weir cost beyond the proxy itself (an RPC, a transaction and a
	// commit each, whatever they carry); a longer pace cut the whole
	// stack's CPU per request there by 14–24% in alternated runs
	// (docs/performance.md) and left 1,000 req/s as it was. The price: a
	// route event, a success's record and the dashboards' view land up to
	// 250 ms later, and a worker killed outright loses the records of the
	// requests it finished in its last 250 ms (a budgeted key's spend is
	// never paced). Negative sends whenever a call can go.
	ReportInterval time.Duration
	// CapacityHold, UnreachableHold and RequestDeadline apply until the
	// control plane's settings arrive (and whenever it cannot be reached).
	// Defaults 20m, 30s and 25m; a negative hold means 0 (fail fast).
	CapacityHold    time.Duration
	UnreachableHold time.Duration
	RequestDeadline time.Duration
	// BodyBuffer and BodyBufferPerKey bound the request-body bytes the
	// worker buffers at once, in all and for one key (bodybudget.go),
	// until the control plane's body_buffer_bytes and
	// body_buffer_per_key_bytes settings arrive. Defaults 1 GiB and
	// 128 MiB; the last quarter of the buffer is kept for keys that hold
	// no body on this worker (bodybudget.go).
	BodyBuffer       int64
	BodyBufferPerKey int64
	// SettingsPoll is how often the worker reads the control plane's
	// settings. Default 10s.
	SettingsPoll time.Duration
	// StreamIdleTimeout ends an upstream answer that sends nothing for
	// this long, streamed or not: before output it is retried like a
	// dropped connection, after output the client gets an error event.
	// Default 3m.
	StreamIdleTimeout time.Duration
	// UpstreamHeaderTimeout ends an attempt whose upstream accepted the
	// request but sent no response headers for this long; it is retried
	// like a dropped connection. A non-streamed answer's headers come
	// only once it is whole, so it is as long as the SDKs' own request
	// timeout. It applies to the default Upstream client only. Default 10m.
	UpstreamHeaderTimeout time.Duration
	// ReadHeaderTimeout bounds reading a request's headers (Serve): a
	// client that sends part of them and stalls is disconnected. Default
	// 10s.
	ReadHeaderTimeout time.Duration
	// Sleep waits d or until ctx ends (false). Tests compress time with it.
	// Default: a timer.
	Sleep func(ctx context.Context, d time.Duration) bool
	// Rand returns a number in [0,1) for backoff jitter. Default math/rand.
	Rand func() float64
	// Upstream is the client for provider traffic. Default: a tuned
	// transport with no overall timeout (streams run long).
	Upstream *http.Client
	// ControlPlane is the client for LeaseService. Default: h2c.
	ControlPlane *http.Client
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// MetricsToken, when set, is the bearer token /metrics needs. The
	// binary reads WEIR_METRICS_TOKEN.
	MetricsToken string
	// MetricsApart leaves /metrics out of Handler (a path weir does not
	// serve, on the agents' port): the binary serves MetricsHandler on an
	// address of its own (WEIR_DATAPLANE_METRICS_ADDR).
	MetricsApart bool
	// Registry receives the worker's metrics. Default: a new one.
	Registry *prometheus.Registry
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// TracerProvider receives a span per request, per upstream attempt and
	// per control-plane RPC (see internal/telemetry). Default: none, no
	// tracing. The binary sets it from the OTEL_* variables.
	TracerProvider trace.TracerProvider
}

// Validate names the first bad field.
func (c *Config) Validate() error {
	if c.ControlPlaneURL == "" {
		return errors.New("dataplane: ControlPlaneURL (WEIR_CONTROLPLANE_URL) is required")
	}
	if u, err := url.Parse(c.ControlPlaneURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("dataplane: ControlPlaneURL must be an http(s) URL")
	}
	if c.Token == "" {
		return errors.New("dataplane: Token (WEIR_DATAPLANE_TOKEN) is required")
	}
	if c.MaxBodyBytes < 0 {
		return errors.New("dataplane: MaxBodyBytes must not be negative")
	}
	if c.MaxResponseBytes < 0 {
		return errors.New("dataplane: MaxResponseBytes must not be negative")
	}
	if c.MaxAttempts < 0 {
		return errors.New("dataplane: MaxAttempts must not be negative")
	}
	if c.KeyCacheTTL < 0 {
		return errors.New("dataplane: KeyCacheTTL must not be negative")
	}
	if c.RequestDeadline < 0 || c.SettingsPoll < 0 || c.StreamIdleTimeout < 0 || c.BodyReadTimeout < 0 || c.BodyIdleTimeout < 0 {
		return errors.New("dataplane: RequestDeadline, SettingsPoll, StreamIdleTimeout, BodyReadTimeout and BodyIdleTimeout must not be negative")
	}
	if c.UpstreamHeaderTimeout < 0 {
		return errors.New("dataplane: UpstreamHeaderTimeout must not be negative")
	}
	if c.ReadHeaderTimeout < 0 {
		return errors.New("dataplane: ReadHeaderTimeout must not be negative")
	}
	if c.MaxWebSocketsPerKey < 0 {
		return errors.New("dataplane: MaxWebSocketsPerKey must not be negative")
	}
	if c.RefusalInterval != 0 && c.RefusalInterval < time.Second {
		return errors.New("dataplane: RefusalInterval must be at least 1s")
	}
	return nil
}

func (c *Config) setDefaults() {
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 32 << 20
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = 64 << 20
	}
	if c.BodyReadTimeout == 0 {
		c.BodyReadTimeout = 2 * time.Minute
	}
	if c.BodyIdleTimeout == 0 {
		c.BodyIdleTimeout = 10 * time.Second
	}
	if c.MaxWebSocketsPerKey == 0 {
		c.MaxWebSocketsPerKey = 32
	}
	if c.RefusalInterval == 0 {
		c.RefusalInterval = time.Minute
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 5
	}
	if c.KeyCacheTTL == 0 {
		c.KeyCacheTTL = 5 * time.Second
	}
	switch {
	case c.LeaseIdle == 0:
		c.LeaseIdle = 100 * time.Millisecond
	case c.LeaseIdle < 0:
		c.LeaseIdle = 0
	}
	switch {
	case c.ReportInterval == 0:
		c.ReportInterval = 250 * time.Millisecond
	case c.ReportInterval < 0:
		c.ReportInterval = 0
	}
	switch {
	case c.CapacityHold == 0:
		c.CapacityHold = defaults.CapacityHold
	case c.CapacityHold < 0:
		c.CapacityHold = 0
	}
	switch {
	case c.UnreachableHold == 0:
		c.UnreachableHold = defaults.UnreachableHold
	case c.UnreachableHold < 0:
		c.UnreachableHold = 0
	}
	if c.RequestDeadline == 0 {
		c.RequestDeadline = defaults.RequestDeadline
	}
	if c.BodyBuffer <= 0 {
		c.BodyBuffer = defaults.BodyBuffer
	}
	if c.BodyBufferPerKey <= 0 {
		c.BodyBufferPerKey = defaults.BodyBufferPerKey
	}
	if c.SettingsPoll == 0 {
		c.SettingsPoll = 10 * time.Second
	}
	if c.StreamIdleTimeout == 0 {
		c.StreamIdleTimeout = 3 * time.Minute
	}
	if c.UpstreamHeaderTimeout == 0 {
		c.UpstreamHeaderTimeout = 10 * time.Minute
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = 10 * time.Second
	}
	if c.Sleep == nil {
		c.Sleep = sleepCtx
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	if c.Upstream == nil {
		c.Upstream = &http.Client{Transport: &http.Transport{
			Proxy: http.ProxyFromEnvironment,
			// A dial that gets no answer (a filtered address) ends like
			// http.DefaultTransport's, not at the system's TCP timeout.
			DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost:   256,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
			// Without it an upstream that accepts and never answers holds
			// the attempt, its lease and the client for good.
			ResponseHeaderTimeout: c.UpstreamHeaderTimeout,
			ForceAttemptHTTP2:     true,
			// An HTTP/1.1 connection holds both buffers for as long as its
			// stream runs. A request's headers fit in 1 KiB (its body is
			// written past the buffer in one call). The relay's SSE
			// scanner and io.ReadAll read the body in larger pieces, which
			// bypass the read buffer; it serves the status line, the
			// headers (a longer line is gathered past it) and chunk-size
			// lines. 4 KiB each would be idle memory.
			WriteBufferSize: 1 << 10,
			ReadBufferSize:  256,
		}}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}
