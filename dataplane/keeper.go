package dataplane

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/defaults"
)

// keeper renews every lease the worker holds in one RenewBatch call per
// period (a third of the shortest lease TTL held): a worker with thousands
// of long streams open costs the control plane one call, not thousands,
// and each stream costs no goroutine of its own.
//
// A renewal that does not get through is tried again every
// renewRetryEvery, so that leases are renewed within about that of the
// control plane's return (after an outage of every control plane or of
// Postgres the control plane keeps their places for a TTL: see
// controlplane/leaseclock.go). A lease the control plane refuses to renew
// has lost its place: it lapsed while this worker alone was cut off, and
// its account's places were granted again meanwhile. The keeper stops
// renewing it and calls its lost func, which ends the request's upstream
// attempt: the account must not serve more than its cap.
type keeper struct {
	client weirv1connect.LeaseServiceClient
	// requests lists the requests in progress whose pending route events
	// the keeper keeps open with the same calls (pending.go).
	requests func() []string
	log      *slog.Logger

	mu     sync.Mutex
	leases map[string]keptLease
	// ttl is the last lease TTL the control plane granted: a pending
	// event stays open that long past its renewal.
	ttl time.Duration
	// every is the wait run last planned (period); a lease whose TTL
	// needs a shorter one wakes it.
	every time.Duration
	wake  chan struct{} // a shorter TTL arrived: re-plan the wait
	stop  context.CancelFunc
	done  chan struct{}
}

// keptLease is one lease the keeper renews.
type keptLease struct {
	ttl  time.Duration
	lost func()
}

// renewRetryEvery is how soon a renewal that did not get through is tried
// again.
const renewRetryEvery = time.Second

func newKeeper(client weirv1connect.LeaseServiceClient, requests func() []string, log *slog.Logger) *keeper {
	ctx, cancel := context.WithCancel(context.Background())
	k := &keeper{client: client, requests: requests, log: log, leases: map[string]keptLease{}, ttl: defaultLeaseTTL,
		wake: make(chan struct{}, 1), stop: cancel, done: make(chan struct{})}
	go k.run(ctx)
	return k
}

// hold keeps lease renewed until the returned func is called. lost is
// called (once, from the keeper's goroutine) if the control plane refuses
// to renew it.
func (k *keeper) hold(lease *weirv1.Lease, lost func()) (release func()) {
	ttl := lease.GetTtl().AsDuration()
	if ttl <= 0 {
		return func() {}
	}
	k.mu.Lock()
	k.leases[lease.Id] = keptLease{ttl: ttl, lost: lost}
	k.ttl = ttl
	// A lease like the others changes nothing the wait was planned on:
	// only a shorter TTL wakes the loop (not every request).
	sooner := ttl/3 < k.every
	k.mu.Unlock()
	if sooner {
		select {
		case k.wake <- struct{}{}:
		default:
		}
	}
	return func() {
		k.mu.Lock()
		delete(k.leases, lease.Id)
		k.mu.Unlock()
	}
}

// defaultLeaseTTL is the control plane's default lease TTL, assumed until
// a lease says otherwise.
const defaultLeaseTTL = defaults.LeaseTTL

// period is a third of the shortest TTL held, or of the last one granted.
func (k *keeper) period() time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.ttl / 3
	for _, l := range k.leases {
		p = min(p, l.ttl/3)
	}
	k.every = p
	return p
}

func (k *keeper) run(ctx context.Context) {
	defer close(k.done)
	last := time.Now()
	failed := false
	for {
		every := k.period()
		if failed {
			every = min(every, renewRetryEvery)
		}
		t := time.NewTimer(max(time.Until(last.Add(every)), 0))
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
		failed = !k.renew(ctx)
	}
}

// renew renews every lease held and every pending request, and reports
// whether every call got an answer.
func (k *keeper) renew(ctx context.Context) bool {
	k.mu.Lock()
	ids := make([]string, 0, len(k.leases))
	for id := range k.leases {
		ids = append(ids, id)
	}
	k.mu.Unlock()
	reqs := k.requests()
	ok := true
	for len(ids) > 0 || len(reqs) > 0 {
		n, m := min(len(ids), maxRenewCall), min(len(reqs), maxRenewCall)
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := k.client.RenewBatch(rctx, connect.NewRequest(&weirv1.RenewBatchRequest{LeaseIds: ids[:n], RequestIds: reqs[:m]}))
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			ok = false
			k.log.Warn("renew leases failed", "leases", n, "requests", m, "err", err)
		case err == nil:
			k.refused(ids[:n], resp.Msg.RenewedLeaseIds)
		}
		ids, reqs = ids[n:], reqs[m:]
	}
	return ok
}

// refused ends the leases among sent that the control plane did not
// renew and that are still held.
func (k *keeper) refused(sent, renewed []string) {
	if len(renewed) == len(sent) {
		return
	}
	got := make(map[string]bool, len(renewed))
	for _, id := range renewed {
		got[id] = true
	}
	var lost []func()
	k.mu.Lock()
	for _, id := range sent {
		if l, held := k.leases[id]; held && !got[id] {
			delete(k.leases, id)
			if l.lost != nil {
				lost = append(lost, l.lost)
			}
		}
	}
	k.mu.Unlock()
	if len(lost) > 0 {
		k.log.Warn("leases lost their place: their requests are ended", "leases", len(lost))
	}
	for _, f := range lost {
		f()
	}
}

// maxRenewCall matches the control plane's limit per RenewBatch call.
const maxRenewCall = 10000

func (k *keeper) close() {
	k.stop()
	<-k.done
}
