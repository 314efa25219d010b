// Package dataplane is weir's stateless worker: it terminates agent
// traffic on the Anthropic wire, leases an account from the control plane
// for each attempt, relays the upstream's answer, and reports the outcome.
// It keeps no durable state and never touches the database.
package dataplane

import (
	"context"
	"net/http"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/internal/telemetry"
)

// Server is one data-plane worker.
type Server struct {
	cfg      Config
	leases   weirv1connect.LeaseServiceClient
	keys     *keyCache
	reporter *reporter
	keeper   *keeper
	pool     *leasePool
	settings *settingsPoller
	metrics  *metrics
	tracer   trace.Tracer
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
	s := &Server{
		cfg:      cfg,
		leases:   leases,
		keys:     &keyCache{client: leases, ttl: cfg.KeyCacheTTL, now: cfg.Now, entries: map[string]keyEntry{}},
		reporter: newReporter(leases, cfg.Logger, cfg.ReportInterval, m.routesDropped.Inc, m.redelivered.WithLabelValues("route_events").Inc),
		keeper:   newKeeper(leases, cfg.Logger),
		metrics:  m,
		tracer:   telemetry.TracerProvider(cfg.TracerProvider).Tracer(tracerName),
	}
	s.pool = newLeasePool(leases, cfg.Logger, cfg.Now, cfg.Sleep, m, cfg.LeaseIdle, cfg.ReportInterval, s.keys.forgetAll)
	s.settings = newSettingsPoller(s)
	return s, nil
}

// Handler serves the Anthropic and OpenAI surfaces plus /metrics and /healthz.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/messages", s.method(http.MethodPost, s.proxyHandler(surfaceMessages)))
	mux.HandleFunc("/v1/messages/count_tokens", s.method(http.MethodPost, s.proxyHandler(surfaceCount)))
	mux.HandleFunc("/v1/models", s.method(http.MethodGet, s.proxyHandler(surfaceModels)))
	responses := s.method(http.MethodPost, s.proxyHandler(surfaceResp))
	mux.HandleFunc("/v1/responses", func(w http.ResponseWriter, r *http.Request) {
		if isWebSocket(r) {
			s.serveResponsesWebSocket(w, r)
			return
		}
		responses(w, r)
	})
	mux.HandleFunc("/v1/chat/completions", s.method(http.MethodPost, s.proxyHandler(surfaceChat)))
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n")) //nolint:errcheck // nothing to do if the probe left
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeAPIError(w, newRequestID(), errNotFound("no route for "+r.Method+" "+r.URL.Path))
	})
	return mux
}

func (s *Server) method(m string, h http.HandlerFunc) http.HandlerFunc {
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
			writeAPIError(w, newRequestID(), &apiError{status: http.StatusMethodNotAllowed,
				typ: "invalid_request_error", message: r.Method + " is not allowed on " + r.URL.Path + "; use " + m, final: true})
			return
		}
		h(w, r)
	}
}

// Close flushes queued route events, waiting until ctx ends.
func (s *Server) Close(ctx context.Context) {
	s.settings.close()
	s.pool.close()
	s.keeper.close()
	s.reporter.close(ctx)
}
