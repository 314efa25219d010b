package telemetry

import (
	"testing"
)

// TestEnabled: tracing follows the standard OTEL_* variables and is off
// by default.
func TestEnabled(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}, false},
		{map[string]string{"OTEL_SERVICE_NAME": "weir"}, false},
	} {
		if got := Enabled(func(k string) string { return tc.env[k] }); got != tc.want {
			t.Errorf("%v: enabled %v, want %v", tc.env, got, tc.want)
		}
	}
}

// TestSetupOff: with tracing off, nothing is set up: a nil provider,
// and the RPC wrappers hand back what they were given.
func TestSetupOff(t *testing.T) {
	t.Parallel()
	tp, shutdown, err := Setup(t.Context(), ServiceDataplane, func(string) string { return "" })
	if err != nil || tp != nil {
		t.Fatalf("Setup off: %v, %v", tp, err)
	}
	if err := shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if RPCTransport(nil, nil) == nil {
		t.Error("RPCTransport(nil, nil) is nil")
	}
}

// TestSetupServiceName: OTEL_SERVICE_NAME wins over the process default.
func TestSetupServiceName(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "weir-edge")
	res, err := Resource(t.Context(), ServiceDataplane)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := res.Set().Value("service.name"); v.AsString() != "weir-edge" {
		t.Errorf("service.name %q, want weir-edge", v.AsString())
	}
	t.Setenv("OTEL_SERVICE_NAME", "")
	res, err = Resource(t.Context(), ServiceControlplane)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := res.Set().Value("service.name"); v.AsString() != ServiceControlplane {
		t.Errorf("service.name %q, want %s", v.AsString(), ServiceControlplane)
	}
}
