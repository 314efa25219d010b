package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/sim"
)

// tracing gives a test one in-memory exporter behind two tracer
// providers, one per process, as `weir dev` has.
func tracing(t *testing.T) (*tracetest.InMemoryExporter, options) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	provider := func(service string) *sdktrace.TracerProvider {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
			sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))))
		t.Cleanup(func() { tp.Shutdown(t.Context()) }) //nolint:errcheck // in-memory
		return tp
	}
	return exp, options{cpTracer: provider("weir-controlplane"), dpTracer: provider("weir-dataplane")}
}

// requestSpan waits for the data plane's span of the request (it ends
// after the lease's release, once the client has its answer).
func requestSpan(t *testing.T, exp *tracetest.InMemoryExporter, name string) tracetest.SpanStub {
	t.Helper()
	var found tracetest.SpanStub
	eventually(t, "the request span", func() bool {
		for _, s := range exp.GetSpans() {
			if s.Name == name && s.SpanKind == trace.SpanKindServer {
				found = s
				return true
			}
		}
		return false
	})
	return found
}

func attr(s tracetest.SpanStub, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func service(s tracetest.SpanStub) string {
	v, _ := s.Resource.Set().Value("service.name")
	return v.AsString()
}

// TestTraceSpansDataplaneToControlplane: one request is one trace, from
// the worker's request span through its upstream attempt to the control
// plane's Acquire and Release handlers. The request is refused upstream
// (400): a success settles in a ReleaseBatch off the request's path, a
// failure's Release is part of it.
func TestTraceSpansDataplaneToControlplane(t *testing.T) {
	t.Parallel()
	exp, opts := tracing(t)
	opts.accounts = []account{{label: "a", faults: []sim.Fault{{Kind: sim.FaultBadRequest}}}}
	e := setup(t, opts)

	if r := e.post(false); r.status != http.StatusBadRequest {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	req := requestSpan(t, exp, "POST /v1/messages")
	tid := req.SpanContext.TraceID()
	for key, want := range map[string]attribute.Value{
		"weir.surface":              attribute.StringValue("messages"),
		"weir.model_family":         attribute.StringValue("sonnet"),
		"weir.outcome":              attribute.StringValue("client_error"),
		"http.response.status_code": attribute.IntValue(400),
		"weir.attempts":             attribute.IntValue(1),
		"weir.held_seconds":         attribute.Float64Value(0),
	} {
		if got, ok := attr(req, key); !ok || got != want {
			t.Errorf("request span %s = %v, want %v", key, got.String(), want.String())
		}
	}
	if service(req) != "weir-dataplane" {
		t.Errorf("request span from %q", service(req))
	}

	var attempt *tracetest.SpanStub
	cpSide := map[string]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		if s.SpanContext.TraceID() != tid {
			continue
		}
		switch {
		case s.Name == "upstream attempt":
			attempt = &s
		case s.SpanKind == trace.SpanKindServer && service(s) == "weir-controlplane":
			cpSide[s.Name] = s
		}
	}
	if attempt == nil {
		t.Fatal("no upstream attempt span in the request's trace")
	}
	if attempt.Parent.SpanID() != req.SpanContext.SpanID() {
		t.Error("the attempt span is not the request span's child")
	}
	for key, want := range map[string]attribute.Value{
		"weir.provider":             attribute.StringValue("anthropic"),
		"weir.outcome_class":        attribute.StringValue("client_error"),
		"http.response.status_code": attribute.IntValue(400),
	} {
		if got, ok := attr(*attempt, key); !ok || got != want {
			t.Errorf("attempt span %s = %v, want %v", key, got.String(), want.String())
		}
	}
	for _, rpc := range []string{"/weir.v1.LeaseService/Acquire", "/weir.v1.LeaseService/Release"} {
		s, ok := cpSide[rpc]
		if !ok {
			t.Errorf("no control-plane span %s in the request's trace (have %v)", rpc, keys(cpSide))
			continue
		}
		if !s.Parent.IsRemote() {
			t.Errorf("%s: parent is not the worker's (remote) client span", rpc)
		}
	}
	if rel, ok := cpSide["/weir.v1.LeaseService/Release"]; ok {
		// The Release RPC belongs to the attempt it reports.
		var client *tracetest.SpanStub
		for _, s := range exp.GetSpans() {
			if s.SpanContext.SpanID() == rel.Parent.SpanID() {
				client = &s
			}
		}
		if client == nil || client.Parent.SpanID() != attempt.SpanContext.SpanID() {
			t.Error("the Release RPC is not under the upstream attempt span")
		}
	}
}

func keys(m map[string]tracetest.SpanStub) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestTraceCarriesNoSecrets: no span name, attribute, event, status or
// resource holds the client's key, an account credential or a token,
// through a failover and a stream.
func TestTraceCarriesNoSecrets(t *testing.T) {
	t.Parallel()
	exp, opts := tracing(t)
	opts.accounts = []account{
		{label: "first", priority: 10, faults: []sim.Fault{{Kind: sim.FaultRateLimit, RetryAfter: 30}}},
		{label: "second", oauth: true},
	}
	e := setup(t, opts)
	for _, stream := range []bool{false, true} {
		if r := e.post(stream); r.status != http.StatusOK {
			t.Fatalf("stream %v: status %d: %s", stream, r.status, r.body)
		}
	}
	if r := e.do(http.MethodPost, "/v1/messages", messagesBody(false), func(r *http.Request) {
		r.Header.Set("X-Api-Key", "sk-weir-wrong-"+randid.Hex(8))
	}); r.status != http.StatusUnauthorized {
		t.Fatalf("wrong key: status %d", r.status)
	}
	eventually(t, "the three request spans", func() bool {
		n := 0
		for _, s := range exp.GetSpans() {
			if s.Name == "POST /v1/messages" {
				n++
			}
		}
		return n == 3
	})

	sum := sha256.Sum256([]byte(e.key))
	secrets := []string{e.key, hex.EncodeToString(sum[:]), e.admin, e.dpToken}
	for _, c := range e.creds {
		secrets = append(secrets, c)
	}
	spans := exp.GetSpans()
	var attempts int
	for _, s := range spans {
		if s.Name == "upstream attempt" {
			attempts++
		}
		var text []string
		text = append(text, s.Name, s.Status.Description)
		for _, kv := range s.Attributes {
			text = append(text, string(kv.Key), kv.Value.String())
		}
		for _, ev := range s.Events {
			text = append(text, ev.Name)
			for _, kv := range ev.Attributes {
				text = append(text, string(kv.Key), kv.Value.String())
			}
		}
		for _, l := range s.Links {
			for _, kv := range l.Attributes {
				text = append(text, string(kv.Key), kv.Value.String())
			}
		}
		for _, kv := range s.Resource.Attributes() {
			text = append(text, kv.Value.String())
		}
		all := strings.Join(text, "\n")
		for _, secret := range secrets {
			if strings.Contains(all, secret) {
				t.Errorf("span %q carries a secret (%d characters)", s.Name, len(secret))
			}
		}
	}
	if attempts < 3 {
		t.Errorf("%d attempt spans, want the 429, its failover and the stream", attempts)
	}
}
