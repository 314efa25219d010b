package dataplane

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// renewRecorder is a lease service that renews everything and records
// when each lease was renewed.
type renewRecorder struct {
	weirv1connect.LeaseServiceClient
	mu      sync.Mutex
	renewed map[string][]time.Time
}

func (r *renewRecorder) RenewBatch(_ context.Context, req *connect.Request[weirv1.RenewBatchRequest]) (*connect.Response[weirv1.RenewBatchResponse], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range req.Msg.LeaseIds {
		r.renewed[id] = append(r.renewed[id], time.Now())
	}
	return connect.NewResponse(&weirv1.RenewBatchResponse{RenewedLeaseIds: req.Msg.LeaseIds}), nil
}

// TestKeeperPlansOnTheShortestTTL: leases like those held leave the
// renewal where it was planned; a lease with a shorter TTL brings it
// forward to a third of that TTL.
func TestKeeperPlansOnTheShortestTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &renewRecorder{renewed: map[string][]time.Time{}}
		k := newKeeper(rec, func() []string { return nil }, slog.New(slog.NewTextHandler(io.Discard, nil)))
		defer k.close()
		start := time.Now()
		at := func(id string) time.Duration {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if len(rec.renewed[id]) == 0 {
				return -1
			}
			return rec.renewed[id][0].Sub(start)
		}
		lease := func(id string, ttl time.Duration) {
			k.hold(&weirv1.Lease{Id: id, Ttl: durationpb.New(ttl)}, func() {})
		}
		synctest.Wait()
		lease("a", 30*time.Second)
		time.Sleep(4 * time.Second)
		lease("b", 30*time.Second) // like a: the plan stands
		time.Sleep(5*time.Second + time.Millisecond)
		synctest.Wait()
		if got := at("a"); got != -1 {
			t.Fatalf("a renewed at %v, before its first period", got)
		}
		time.Sleep(2 * time.Second) // past the default TTL's third
		synctest.Wait()
		aAt, bAt := at("a"), at("b")
		if aAt <= 0 || aAt > defaultLeaseTTL/3 || bAt != aAt {
			t.Fatalf("a renewed at %v, b at %v: want both at the planned %v", aAt, bAt, defaultLeaseTTL/3)
		}
		since := time.Now()
		lease("c", 3*time.Second) // a shorter TTL: the next renewal comes sooner
		time.Sleep(time.Second + time.Millisecond)
		synctest.Wait()
		if got := at("c"); got < 0 || got.Seconds() > since.Sub(start).Seconds()+1 {
			t.Fatalf("c (TTL 3s) held at %v, first renewed at %v: want within a second", since.Sub(start), got)
		}
	})
}
