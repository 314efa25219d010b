package dataplane

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/randid"
)

// Refused requests are counted, not recorded. A request answered before
// routing (serve() refused it: no account was leased, nothing was held)
// leaves no route event: a client that floods refusals (a key over its
// rate limit, a bad key, bad input, HTTP/2 rapid resets) would otherwise
// make the control plane write a row per request. The worker counts them
// per interval (RefusalInterval, a minute by default), key and reason, in
// memory, and reports each count once its interval is over, with the
// route events (ReportRoutesRequest.refusals): one row per worker,
// interval, key and reason however many there were. Known keys are
// bounded by the operator; requests without a known key count under no
// key. weir_dataplane_refusals_total{surface,reason} counts them at once.

// The refusal reasons: one fixed set (the metric's label values, the
// rows' reason).
const (
	refusalMissingKey     = "missing_key"     // no weir key
	refusalInvalidKey     = "invalid_key"     // an unknown or revoked key
	refusalUnverified     = "unverified"      // the key could not be checked (control plane unreachable)
	refusalBadRequest     = "bad_request"     // headers a request may not carry
	refusalKeyRateLimit   = "key_rate_limit"  // the key's own rate limit
	refusalControlPlane   = "control_plane"   // the key's rate limit could not be checked
	refusalBodyBuffer     = "body_buffer"     // the body buffer could not take the body
	refusalBodyTooLarge   = "body_too_large"  // over MaxBodyBytes
	refusalBodyTimeout    = "body_timeout"    // the body stopped arriving, or came too slowly
	refusalInvalidBody    = "invalid_body"    // not a body weir can route (JSON, UTF-8, model)
	refusalModelForbidden = "model_forbidden" // outside the key's allowlist
	refusalWebSocketLimit = "websocket_limit" // too many WebSocket connections for the key
	refusalCanceled       = "canceled"        // the client left before it was answered
)

var refusalReasons = []string{refusalMissingKey, refusalInvalidKey, refusalUnverified, refusalBadRequest,
	refusalKeyRateLimit, refusalControlPlane, refusalBodyBuffer, refusalBodyTooLarge, refusalBodyTimeout,
	refusalInvalidBody, refusalModelForbidden, refusalWebSocketLimit, refusalCanceled}

// refusalCounter holds the counts of the intervals not yet reported.
type refusalCounter struct {
	worker string
	every  time.Duration
	now    func() time.Time
	metric *prometheus.CounterVec
	// report queues counts for the control plane (the reporter's outbox).
	report func(...*weirv1.RefusalCount)

	mu     sync.Mutex
	counts map[refusalBucket]int64
	// timer fires when the oldest interval counted is over; nil while
	// nothing is counted.
	timer *time.Timer
}

type refusalBucket struct {
	start         int64 // unix nanoseconds of the interval's start
	keyID, reason string
}

func newRefusalCounter(every time.Duration, now func() time.Time, metric *prometheus.CounterVec, report func(...*weirv1.RefusalCount)) *refusalCounter {
	return &refusalCounter{worker: "w_" + randid.Hex(8), every: every, now: now, metric: metric, report: report,
		counts: map[refusalBucket]int64{}}
}

// add counts one refusal of keyID's request ("" when the key was not
// known) on surface.
func (rc *refusalCounter) add(surface, keyID, reason string) {
	rc.metric.WithLabelValues(surface, reason).Inc()
	now := rc.now()
	b := refusalBucket{start: now.Truncate(rc.every).UnixNano(), keyID: keyID, reason: reason}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.counts[b]++
	if rc.timer == nil {
		rc.timer = time.AfterFunc(rc.wait(now), func() { rc.flush(false) })
	}
}

// wait is how long from now until the interval now is in is over.
func (rc *refusalCounter) wait(now time.Time) time.Duration {
	return max(now.Truncate(rc.every).Add(rc.every).Sub(now), 10*time.Millisecond)
}

// flush reports the counts of the intervals that are over, or all of
// them when final (the worker is closing).
func (rc *refusalCounter) flush(final bool) {
	now := rc.now()
	cut := now.Truncate(rc.every).UnixNano()
	rc.mu.Lock()
	var out []*weirv1.RefusalCount
	for b, n := range rc.counts {
		if b.start < cut || final {
			out = append(out, &weirv1.RefusalCount{WorkerId: rc.worker, KeyId: b.keyID, Reason: b.reason,
				IntervalStart: timestamppb.New(time.Unix(0, b.start)), Count: n})
			delete(rc.counts, b)
		}
	}
	rc.timer = nil
	if len(rc.counts) > 0 && !final {
		rc.timer = time.AfterFunc(rc.wait(now), func() { rc.flush(false) })
	}
	rc.mu.Unlock()
	if len(out) > 0 {
		rc.report(out...)
	}
}

// close reports what is counted, whatever its interval.
func (rc *refusalCounter) close() {
	rc.mu.Lock()
	if rc.timer != nil {
		rc.timer.Stop()
	}
	rc.mu.Unlock()
	rc.flush(true)
}
