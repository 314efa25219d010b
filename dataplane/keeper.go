package dataplane

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// keeper renews every lease the worker holds in one RenewBatch call per
// period (a third of the shortest lease TTL held): a worker with thousands
// of long streams open costs the control plane one call, not thousands,
// and each stream costs no goroutine of its own.
type keeper struct {
	client weirv1connect.LeaseServiceClient
	log    *slog.Logger

	mu     sync.Mutex
	leases map[string]time.Duration // lease id → its TTL
	wake   chan struct{}            // a shorter TTL arrived: re-plan the wait
	stop   context.CancelFunc
	done   chan struct{}
}

func newKeeper(client weirv1connect.LeaseServiceClient, log *slog.Logger) *keeper {
	ctx, cancel := context.WithCancel(context.Background())
	k := &keeper{client: client, log: log, leases: map[string]time.Duration{},
		wake: make(chan struct{}, 1), stop: cancel, done: make(chan struct{})}
	go k.run(ctx)
	return k
}

// hold keeps lease renewed until the returned func is called.
func (k *keeper) hold(lease *weirv1.Lease) (release func()) {
	ttl := lease.GetTtl().AsDuration()
	if ttl <= 0 {
		return func() {}
	}
	k.mu.Lock()
	k.leases[lease.Id] = ttl
	k.mu.Unlock()
	select {
	case k.wake <- struct{}{}:
	default:
	}
	return func() {
		k.mu.Lock()
		delete(k.leases, lease.Id)
		k.mu.Unlock()
	}
}

// period is a third of the shortest TTL held; a default while none is.
func (k *keeper) period() time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := 10 * time.Second
	for _, ttl := range k.leases {
		p = min(p, ttl/3)
	}
	return p
}

func (k *keeper) run(ctx context.Context) {
	defer close(k.done)
	last := time.Now()
	for {
		wait := time.Until(last.Add(k.period()))
		t := time.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-k.wake:
			t.Stop()
			continue // a shorter TTL may bring the next renewal forward
		case <-t.C:
		}
		last = time.Now()
		k.renew(ctx)
	}
}

func (k *keeper) renew(ctx context.Context) {
	k.mu.Lock()
	ids := make([]string, 0, len(k.leases))
	for id := range k.leases {
		ids = append(ids, id)
	}
	k.mu.Unlock()
	for len(ids) > 0 {
		n := min(len(ids), maxRenewCall)
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := k.client.RenewBatch(rctx, connect.NewRequest(&weirv1.RenewBatchRequest{LeaseIds: ids[:n]}))
		cancel()
		if err != nil && ctx.Err() == nil {
			k.log.Warn("renew leases failed", "leases", n, "err", err)
		}
		ids = ids[n:]
	}
}

// maxRenewCall matches the control plane's limit per RenewBatch call.
const maxRenewCall = 10000

func (k *keeper) close() {
	k.stop()
	<-k.done
}
