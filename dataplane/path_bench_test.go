package dataplane

import (
	"context"
	"net/http"
	"net/http/httputil"
	"net/url"
	"testing"
	"time"

	"github.com/weirhq/weir/internal/sim"
)

// BenchmarkRequestPath is one non-streaming request through the whole
// worker (key check, routing, a reused lease, the relay, its settlement
// and route report) against the scripted control plane and the
// in-process simulator, beside a bare reverse proxy to the same simulator
// in the same run: the ratio of the two is the worker's own user-space
// work per request, without the network's system calls (weir bench apart
// measures those, as users run it). Its allocations include the fakes'.
func BenchmarkRequestPath(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		up := sim.New(sim.Config{Script: sim.Script{Accounts: []sim.AccountScript{
			{Name: "a", Credential: credentialOf("a"), Kind: sim.KindAPIKey}}}, Deltas: 3})
		target, _ := url.Parse("http://sim.test")
		rp := httputil.NewSingleHostReverseProxy(target)
		rp.Transport = serveMem(b, up).Transport
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Header.Set("X-Api-Key", credentialOf("a"))
			rp.ServeHTTP(w, r)
		})
		r := &rig{t: b, h: h}
		benchSend(b, r)
	})
	b.Run("weir", func(b *testing.B) {
		cp := newFakeCP(&fakeAccount{id: "a"})
		cp.reuse = time.Hour
		r := newRig(b, cp, func(c *Config) { c.LeaseIdle = time.Hour })
		// Until the pool's stream is up and a lease is cached, requests
		// ask the control plane: warm up on requests, not on a clock.
		for i := 0; !r.s.pool.cache.isReady() || i < 100; i++ {
			if i == 100_000 {
				b.Fatal("the lease pool never became ready")
			}
			if got := r.send(context.Background(), false); got.status != http.StatusOK {
				b.Fatalf("%d %s", got.status, got.body)
			}
		}
		benchSend(b, r)
	})
}

func benchSend(b *testing.B, r *rig) {
	b.ReportAllocs()
	for b.Loop() {
		if got := r.send(context.Background(), false); got.status != http.StatusOK {
			b.Fatalf("%d %s", got.status, got.body)
		}
	}
}
