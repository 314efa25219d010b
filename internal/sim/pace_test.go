package sim

import (
	"context"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestParseStreamHeader(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want StreamPace
		ok   bool
	}{
		{"", StreamPace{}, false},
		{"hold", StreamPace{Deltas: 1, Hold: true}, true},
		{"32x15ms", StreamPace{Deltas: 32, Delay: 15 * time.Millisecond}, true},
		{"1x0s", StreamPace{Deltas: 1}, true},
		{"0x1ms", StreamPace{}, false},
		{"5000x1ms", StreamPace{}, false},
		{"5x-1ms", StreamPace{}, false},
		{"5xsoon", StreamPace{}, false},
		{"fast", StreamPace{}, false},
	} {
		got, ok := parseStreamHeader(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseStreamHeader(%q) = %+v, %v; want %+v, %v", tc.in, got, ok, tc.want, tc.ok)
		}
		if ok {
			if back, _ := parseStreamHeader(got.String()); back != got {
				t.Errorf("%+v.String() = %q parses back to %+v", got, got.String(), back)
			}
		}
	}
}

// TestLatencyAndPace: Latency delays every answer; the stream header sets
// one reply's deltas and pace, or holds it open after its first delta.
func TestLatencyAndPace(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		s := New(Config{Script: testScript(), Latency: 50 * time.Millisecond, DeltaDelay: time.Hour})
		serve := func(ctx context.Context, stream bool, pace string) ([]sseEvent, time.Duration) {
			req := httptest.NewRequestWithContext(ctx, "POST", "/v1/messages", strings.NewReader(messagesBody(sonnet, stream)))
			req.Header = apiKeyHeaders(keyA)
			if pace != "" {
				req.Header.Set(StreamHeader, pace)
			}
			rec := httptest.NewRecorder()
			start := time.Now()
			s.ServeHTTP(rec, req)
			took := time.Since(start)
			if rec.Code != 200 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			if !stream {
				return nil, took
			}
			events, err := readEvents(rec.Body)
			if err != nil {
				t.Fatal(err)
			}
			return events, took
		}
		if _, took := serve(t.Context(), false, ""); took != 50*time.Millisecond {
			t.Errorf("non-streamed answer took %v, want the 50ms latency", took)
		}
		events, took := serve(t.Context(), true, "5x100ms")
		if took != 50*time.Millisecond+4*100*time.Millisecond {
			t.Errorf("5 deltas 100ms apart took %v", took)
		}
		if !slices.Equal(eventNames(events), streamNames(5)) {
			t.Errorf("events %v", eventNames(events))
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		events, took = serve(ctx, true, "hold")
		if took != 10*time.Second {
			t.Errorf("held stream ended after %v, want when the client left (10s)", took)
		}
		if got, want := eventNames(events), streamNames(1)[:4]; !slices.Equal(got, want) {
			t.Errorf("held stream sent %v, want %v", got, want)
		}
	})
}
