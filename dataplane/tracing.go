package dataplane

import (
	"context"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/telemetry"
)

// Tracing: a server span per client request, a client span per upstream
// attempt under it, and the control-plane RPCs (traced by the Connect
// client's transport) under those. Spans carry bounded facts only: never
// a key, a credential, a token, a body, a header value or a raw model
// string.

const tracerName = "github.com/weirhq/weir/dataplane"

func (s *Server) startRequestSpan(r *http.Request, in *inbound) (context.Context, trace.Span) {
	if s.tracer == nil {
		return r.Context(), trace.SpanFromContext(r.Context())
	}
	// An agent that traces its own calls gets weir's spans in its trace.
	ctx := telemetry.Propagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	return s.tracer.Start(ctx, r.Method+" /v1/"+in.sf.name,
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			attribute.String("http.request.method", r.Method),
			attribute.String("weir.surface", in.sf.name),
			attribute.String("weir.request_id", in.requestID),
		))
}

func endRequestSpan(span trace.Span, in *inbound, rec *weirv1.RouteEvent, status int, outcome string) {
	if !span.IsRecording() {
		span.End()
		return
	}
	span.SetAttributes(
		attribute.String("weir.model_family", modelFamily(in.model)),
		attribute.Bool("weir.stream", in.stream),
		attribute.Int("http.response.status_code", status),
		attribute.String("weir.outcome", outcome),
		attribute.Int("weir.attempts", int(rec.Attempts)),
		attribute.Int("weir.holds", int(rec.HoldCount)),
		attribute.Float64("weir.held_seconds", rec.Held.AsDuration().Seconds()),
	)
	if status >= 500 || (status == 0 && outcome != outcomeCanceled) {
		span.SetStatus(codes.Error, outcome)
	}
	span.End()
}

func (s *Server) startAttemptSpan(ctx context.Context, lease *weirv1.Lease, n int) (context.Context, trace.Span) {
	if s.tracer == nil {
		return ctx, trace.SpanFromContext(ctx)
	}
	return s.tracer.Start(ctx, "upstream attempt",
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("weir.provider", providerName(lease.Provider)),
			attribute.Int("weir.attempt", n),
		))
}

func endAttemptSpan(span trace.Span, o *weirv1.Outcome, d *weirv1.Decision) {
	if span.IsRecording() {
		span.SetAttributes(
			attribute.Int("http.response.status_code", int(o.Status)),
			attribute.String("weir.outcome_class", shortClass(o.Class)),
			attribute.String("weir.decision", shortAction(d.GetAction())),
			attribute.Bool("weir.bytes_to_client", o.BytesToClient),
			attribute.String("weir.transport_cause", causeName(o.TransportCause)),
		)
		switch o.Class {
		case weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_CANCELED:
		default:
			span.SetStatus(codes.Error, shortClass(o.Class))
		}
	}
	span.End()
}

// holdEvent marks a capacity hold on the request's span.
func holdEvent(ctx context.Context, held time.Duration) {
	trace.SpanFromContext(ctx).AddEvent("hold", trace.WithAttributes(attribute.Float64("weir.held_seconds", held.Seconds())))
}

func shortAction(a weirv1.Action) string {
	return strings.TrimPrefix(strings.ToLower(a.String()), "action_")
}
