// Package dataplane is weir's stateless worker: it terminates agent
// traffic on the Anthropic wire, leases an account from the control plane
// for each attempt, relays the upstream's answer, and reports the outcome.
// It keeps no durable state and never touches the database.
package dataplane

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"path"
	"strings"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/trace"

	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/egress"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/internal/serve"
	"github.com/weirhq/weir/internal/telemetry"
)

// Server is one data-plane worker.
type Server struct {
	cfg      Config
	leases   weirv1connect.LeaseServiceClient
	keys     *keyCache
	reporter *reporter
	// ledger is the spend of budgeted keys not reported yet.
	ledger *ledger
	// pending are the requests in progress, recorded as such (pending.go).
	pending  *pendingRequests
	keeper   *keeper
	pool     *leasePool
	settings *settingsPoller
	metrics  *metrics
	bodies   *bodyBudget
	// sockets counts each key's Responses WebSocket connections.
	sockets *socketCount
	// refusals counts the requests refused before routing (refusals.go).
	refusals *refusalCounter
	// limited remembers, per key hash, until when its rate limit refuses
	// (keylimits.go).
	limited *limitedKeys
	// tracer is nil without a configured tracer provider: no span is
	// started then (nothing would record it, and starting one costs a
	// request about ten allocations).
	tracer trace.Tracer
	// egress keeps the clients through egress proxies (egress.go).
	egress *egress.Clients
	// standings are the keys' standings the worker knows (standing.go).
	standings *standings
}

// New builds a worker.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	hc := cfg.ControlPlane
	if hc == nil {
		hc = rpcclient.HTTPClient()
	}
	if cfg.TracerProvider != nil {
		// RPCs made for a traced request join its trace, on both sides.
		traced := *hc
		traced.Transport = telemetry.RPCTransport(hc.Transport, cfg.TracerProvider)
		hc = &traced
	}
	leases := weirv1connect.NewLeaseServiceClient(hc, cfg.ControlPlaneURL,
		connect.WithInterceptors(rpcclient.Token(cfg.Token)))
	m := newMetrics(cfg.Registry)
	pending := newPendingRequests()
	spent := newLedger(cfg.Now)
	s := &Server{
		cfg:     cfg,
		leases:  leases,
		keys:    &keyCache{client: leases, ttl: cfg.KeyCacheTTL, now: cfg.Now, entries: map[string]keyEntry{}},
		pending: pending,
		ledger:  spent,
		reporter: newReporter(leases, pending, cfg.Logger, cfg.ReportInterval,
			func(n int) { m.routesDropped.Add(float64(n)) }, m.redelivered.WithLabelValues("route_events").Inc, spent.settle),
		keeper:  newKeeper(leases, pending.reported, cfg.Logger),
		metrics: m,
		bodies:  newBodyBudget(m),
		sockets: &socketCount{m: map[string]int{}},
		limited: &limitedKeys{m: map[string]limitedKey{}},
		egress:  newEgressClients(cfg),
	}
	if cfg.TracerProvider != nil {
		s.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	s.standings = newStandings(s.fetchStanding, cfg.Now)
	s.refusals = newRefusalCounter(cfg.RefusalInterval, cfg.Now, m.refusals, s.reporter.reportRefusals)
	s.pool = newLeasePool(leases, cfg.Logger, cfg.Now, cfg.Sleep, m, cfg.LeaseIdle, cfg.ReportInterval, func() {
		s.keys.forgetAll()
		s.limited.clear()
		s.standings.forgetAll()
	})
	s.settings = newSettingsPoller(s)
	return s, nil
}

// MetricsHandler serves /metrics' content: the worker's metrics, behind
// Config.MetricsToken when it is set.
func (s *Server) MetricsHandler() http.Handler {
	return serve.Metrics(s.cfg.Registry, s.cfg.MetricsToken)
}

// Handler serves the Anthropic and OpenAI surfaces plus /metrics (unless
// Config.MetricsApart) and /healthz.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/messages", s.method(http.MethodPost, surfaceMessages, s.proxyHandler(surfaceMessages)))
	mux.HandleFunc("/v1/messages/count_tokens", s.method(http.MethodPost, surfaceCount, s.proxyHandler(surfaceCount)))
	mux.HandleFunc("/v1/models", s.method(http.MethodGet, surfaceModels, s.proxyHandler(surfaceModels)))
	responses := s.method(http.MethodPost, surfaceResp, s.proxyHandler(surfaceResp))
	mux.HandleFunc("/v1/responses", func(w http.ResponseWriter, r *http.Request) {
		if isWebSocket(r) {
			s.serveResponsesWebSocket(w, r)
			return
		}
		responses(w, r)
	})
	mux.HandleFunc("/v1/chat/completions", s.method(http.MethodPost, surfaceChat, s.proxyHandler(surfaceChat)))
	// The key's own standing (standing.go); its errors are Anthropic's.
	mux.HandleFunc("/v1/weir/usage", s.method(http.MethodGet, surfaceModels, s.serveUsage))
	if !s.cfg.MetricsApart {
		mux.Handle("GET /metrics", s.MetricsHandler())
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n")) //nolint:errcheck // nothing to do if the probe left
	})
	mux.HandleFunc("/", notFound)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !canonicalPath(r.URL.Path) {
			// The mux would redirect /v1/../x to /x, and a client following
			// a 301 turns its POST into a GET: a path that is not clean
			// names nothing weir serves.
			notFound(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// notFound answers a path weir does not serve, in the wire format the
// path suggests (pathWire).
func notFound(w http.ResponseWriter, r *http.Request) {
	writeError(w, pathWire(r.URL.Path), newRequestID(), errNotFound("no route for "+r.Method+" "+r.URL.Path))
}

// openAIPaths are OpenAI's own resources: an unknown path under one of
// them gets the OpenAI error shape. Everything else (including paths
// both APIs have, such as /v1/files) gets the Anthropic shape, weir's
// default.
var openAIPaths = []string{"/v1/responses", "/v1/chat", "/v1/completions", "/v1/embeddings", "/v1/realtime", "/backend-api"}

// pathWire is the error format for a request weir answers without a
// surface: OpenAI's under OpenAI's own resources, else Anthropic's.
func pathWire(p string) wire {
	for _, prefix := range openAIPaths {
		if p == prefix || strings.HasPrefix(p, prefix+"/") {
			return wireOpenAI
		}
	}
	return wireAnthropic
}

// canonicalPath reports whether p is clean: no . or .. segment, no
// doubled slash (a trailing slash is kept).
func canonicalPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

// method admits requests of method m (and a browser's CORS preflight)
// to h; any other method gets a 405 with Allow, in sf's wire format.
func (s *Server) method(m string, sf surface, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodOptions && r.Header.Get("Origin") != "" {
			// A browser's CORS preflight.
			s.cors(w.Header(), r)
			w.Header().Set("Access-Control-Allow-Methods", m)
			if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
				w.Header().Set("Access-Control-Allow-Headers", req)
			}
			w.Header().Set("Access-Control-Max-Age", "600")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if r.Method != m {
			w.Header().Set("Allow", m)
			writeError(w, sf.wire, newRequestID(), &apiError{status: http.StatusMethodNotAllowed,
				typ: "invalid_request_error", message: r.Method + " is not allowed on " + r.URL.Path + "; use " + m, final: true})
			return
		}
		h(w, r)
	}
}

// Serve serves Handler on ln until ctx ends, then drains for up to 30s
// (streams run long). A client's headers must arrive within
// Config.ReadHeaderTimeout.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	return s.ServeTLS(ctx, ln, nil)
}

// ServeTLS is Serve over TLS when tc is set (it must give a certificate).
func (s *Server) ServeTLS(ctx context.Context, ln net.Listener, tc *tls.Config) error {
	return serve.Run(ctx, ln, s.Handler(), serve.Options{Logger: s.cfg.Logger,
		ShutdownTimeout: 30 * time.Second, ReadHeaderTimeout: s.cfg.ReadHeaderTimeout, TLS: tc})
}

// Close flushes queued route events, waiting until ctx ends.
func (s *Server) Close(ctx context.Context) {
	s.settings.close()
	s.standings.close()
	s.pool.close()
	s.keeper.close()
	s.refusals.close()
	s.reporter.close(ctx)
	s.egress.Close()
}
