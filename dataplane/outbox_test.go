package dataplane

import (
	"fmt"
	"testing"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestOutboxIsBounded: with the control plane unreachable, every Release
// waits to be sent again, up to maxRedeliveries; past that the oldest are
// dropped and counted, so a worker cut off for long keeps a bounded amount.
func TestOutboxIsBounded(t *testing.T) {
	t.Parallel()
	s := newTestServer(t) // its control plane's address refuses connections
	p := s.pool
	o := &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, Status: 429}
	const extra = 5
	for i := range maxRedeliveries + extra {
		_, err := p.releaseNow(t.Context(), &weirv1.ReleaseRequest{LeaseId: fmt.Sprint(i), Outcome: o})
		if !undelivered(err) {
			t.Fatalf("release %d: %v (code %v), want an error to send again", i, err, connect.CodeOf(err))
		}
	}
	queued := p.releases.queued()
	n, oldest := len(queued), queued[0].req.LeaseId
	if n != maxRedeliveries || oldest != fmt.Sprint(extra) {
		t.Errorf("outbox holds %d Releases from %s, want %d from %d", n, oldest, maxRedeliveries, extra)
	}
	var m dto.Metric
	if err := p.metrics.reportsDropped.WithLabelValues("release").Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != extra {
		t.Errorf("dropped %v, want %d", got, extra)
	}
}

// TestUndelivered: what may not have reached the control plane, or found
// it unable to store, is sent again; a refusal is final.
func TestUndelivered(t *testing.T) {
	for code, want := range map[connect.Code]bool{
		connect.CodeUnavailable: true, connect.CodeDeadlineExceeded: true, connect.CodeInternal: true,
		connect.CodeUnknown: true, connect.CodeAborted: true,
		connect.CodeNotFound: false, connect.CodeInvalidArgument: false, connect.CodePermissionDenied: false,
		connect.CodeUnauthenticated: false, connect.CodeFailedPrecondition: false,
	} {
		if got := undelivered(connect.NewError(code, nil)); got != want {
			t.Errorf("undelivered(%v) = %v, want %v", code, got, want)
		}
	}
}
