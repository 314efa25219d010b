package controlplane

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// BenchmarkStoreRoutes stores a worker's batch of route events (what one
// ReportRoutes call does, without Connect) into a real Postgres, for
// batch sizes a worker sends at 50, 500 and 5,000 requests a second
// (one call per 20ms). It reports the cost per event (event-µs).
func BenchmarkStoreRoutes(b *testing.B) {
	l := benchServer(b).leases()
	for _, size := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			events := make([]*weirv1.RouteEvent, size)
			n := 0
			for b.Loop() {
				for i := range events {
					n++
					events[i] = &weirv1.RouteEvent{
						RequestId: fmt.Sprintf("weir_bench_%d", n), Surface: "messages", Model: "claude-sonnet-4-5",
						Status: 200, Attempts: 1, Duration: durationpb.New(40 * time.Millisecond),
						TimeToFirstByte: durationpb.New(3 * time.Millisecond), StartedAt: timestamppb.Now(),
						InputTokens: 1200, OutputTokens: 300,
						AttemptRecords: []*weirv1.AttemptRecord{{At: durationpb.New(time.Millisecond), Status: 200,
							Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Duration: durationpb.New(39 * time.Millisecond)}},
					}
				}
				if err := l.storeRoutes(b.Context(), events, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(n), "event-µs")
		})
	}
}
