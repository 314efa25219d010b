package dataplane

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/clock"
)

// TestRefusalCounter: thousands of refusals make one count per interval,
// key and reason, reported once the interval is over (and the rest at
// close), each with the whole count.
func TestRefusalCounter(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(time.Date(2030, 1, 1, 12, 0, 10, 0, time.UTC))
	var mu sync.Mutex
	var got []*weirv1.RefusalCount
	reported := make(chan struct{}, 16)
	rc := newRefusalCounter(time.Minute, clk.Now, newMetrics(prometheus.NewRegistry()).refusals, func(c ...*weirv1.RefusalCount) {
		mu.Lock()
		got = append(got, c...)
		mu.Unlock()
		reported <- struct{}{}
	})
	for range 5000 {
		rc.add("messages", "key-1", refusalKeyRateLimit)
	}
	for range 300 {
		rc.add("responses", "", refusalInvalidKey)
	}
	clk.Advance(time.Minute) // the first interval is over
	rc.add("messages", "key-1", refusalKeyRateLimit)
	rc.flush(false) // what its timer does (it fires in real time)
	<-reported
	mu.Lock()
	first := got
	got = nil
	mu.Unlock()
	want := map[string]int64{"key-1/key_rate_limit": 5000, "/invalid_key": 300}
	if len(first) != 2 {
		t.Fatalf("%d counts for the first interval, want 2: %v", len(first), first)
	}
	for _, c := range first {
		if n := want[c.KeyId+"/"+c.Reason]; c.Count != n || !c.IntervalStart.AsTime().Equal(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)) || c.WorkerId != rc.worker {
			t.Errorf("count %v, want %d in the 12:00 interval", c, n)
		}
	}
	rc.close()
	<-reported
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || got[0].Count != 1 || !got[0].IntervalStart.AsTime().Equal(time.Date(2030, 1, 1, 12, 1, 0, 0, time.UTC)) {
		t.Errorf("at close: %v, want the open interval's one refusal", got)
	}
}
