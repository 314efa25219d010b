// Package telemetry sets up OpenTelemetry tracing for weir's processes from
// the standard OTEL_* environment variables, and holds the few helpers the
// data plane and the control plane share to trace their RPCs. Tracing is off
// unless an exporter is configured; off, every tracer is a no-op.
//
// It imports neither the database nor River: the data plane uses it.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Service names, unless OTEL_SERVICE_NAME says otherwise.
const (
	ServiceDataplane    = "weir-dataplane"
	ServiceControlplane = "weir-controlplane"
)

// Enabled reports whether getenv configures a trace exporter:
// OTEL_TRACES_EXPORTER=otlp, or an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT
// or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT). OTEL_SDK_DISABLED=true and
// OTEL_TRACES_EXPORTER=none turn it off.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER"))) {
	case "none":
		return false
	case "otlp":
		return true
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup returns the tracer provider for one process (service is its
// default service name) and a shutdown that flushes it. With tracing off it
// returns a nil provider (nothing is wrapped or traced) and a no-op
// shutdown. The exporter speaks OTLP
// over HTTP (http/protobuf) and reads the remaining OTEL_EXPORTER_OTLP_*
// variables (endpoint, headers, timeout, TLS) itself; the sampler comes from
// OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG (default: parent-based,
// always on).
func Setup(ctx context.Context, service string, getenv func(string) string) (trace.TracerProvider, func(context.Context) error, error) {
	if !Enabled(getenv) {
		return nil, func(context.Context) error { return nil }, nil
	}
	proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if proto != "" && proto != "http/protobuf" {
		return nil, nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: weir exports traces over http/protobuf only", proto)
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	res, err := Resource(ctx, service)
	if err != nil {
		return nil, nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}

// Resource names the process: service.name is service unless
// OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES set it.
func Resource(ctx context.Context, service string) (*resource.Resource, error) {
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // last: the environment wins
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("otel resource: %w", err)
	}
	return res, nil
}

// Propagator is W3C trace context: what carries one trace from the data
// plane to the control plane.
func Propagator() propagation.TextMapPropagator { return propagation.TraceContext{} }

// TracerProvider returns tp, or a no-op provider when tp is nil.
func TracerProvider(tp trace.TracerProvider) trace.TracerProvider {
	if tp == nil {
		return noop.NewTracerProvider()
	}
	return tp
}

// RPCTransport wraps base (nil: http.DefaultTransport) so that each RPC
// made inside a traced request becomes a client span named after its
// procedure and carries the trace context to the server. RPCs outside a
// trace (settings polls, route reports) are neither traced nor propagated:
// they would only be noise. No header is recorded, so the bearer token
// never reaches a span. With tp nil, base is returned as is.
func RPCTransport(base http.RoundTripper, tp trace.TracerProvider) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	if tp == nil {
		return base
	}
	return otelhttp.NewTransport(base,
		otelhttp.WithTracerProvider(tp),
		otelhttp.WithPropagators(Propagator()),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.URL.Path }),
		otelhttp.WithFilter(func(r *http.Request) bool {
			return trace.SpanContextFromContext(r.Context()).IsValid()
		}),
	)
}

// RPCHandler wraps a Connect handler so that each RPC is a server span
// named after its procedure, joined to the caller's trace when the request
// carries a W3C traceparent. Probes and scrapes (/metrics, /healthz,
// /readyz) and untraced LeaseService calls (a worker's background polls)
// are left out. With tp nil, h is returned as is.
func RPCHandler(h http.Handler, tp trace.TracerProvider) http.Handler {
	if tp == nil {
		return h
	}
	prop := Propagator()
	return otelhttp.NewHandler(h, "rpc",
		otelhttp.WithTracerProvider(tp),
		otelhttp.WithPropagators(prop),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.URL.Path }),
		otelhttp.WithFilter(func(r *http.Request) bool {
			switch r.URL.Path {
			case "/metrics", "/healthz", "/readyz":
				return false
			}
			if strings.HasPrefix(r.URL.Path, "/weir.v1.LeaseService/") {
				sc := trace.SpanContextFromContext(prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
				return sc.IsValid()
			}
			return true
		}),
	)
}
