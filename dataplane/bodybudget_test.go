package dataplane

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weirhq/weir/internal/defaults"
)

// TestBodyBudgetReserve: a handful of keys cannot take the whole buffer.
// With the default bounds one key holds at most 128 MiB; keys that
// already hold bodies share the first 768 MiB; the last 256 MiB is for
// keys that hold nothing, one body each. The attack that blocked a worker
// before (four keys with eight 31 MiB bodies each, then a fifth) leaves
// room, and a new key is served until the whole buffer is full.
func TestBodyBudgetReserve(t *testing.T) {
	t.Parallel()
	b := newBodyBudget(newMetrics(prometheus.NewRegistry()))
	lim := bodyLimits{total: defaults.BodyBuffer, perKey: defaults.BodyBufferPerKey}
	const body = 31 << 20
	scope := func(err error) string {
		var full *errBodyBuffer
		if errors.As(err, &full) {
			return full.scope
		}
		if err != nil {
			return err.Error()
		}
		return "fits"
	}
	taken := func(key string) int {
		n := 0
		for b.reserve(key, 0, body, lim) == nil {
			n++
		}
		return n
	}
	// One key: four bodies of 31 MiB fit its 128 MiB, the fifth is its
	// own bound (a 429).
	if n := taken("k0"); n != 4 {
		t.Fatalf("one key took %d bodies, want 4 (128 MiB)", n)
	}
	if s := scope(b.reserve("k0", 0, body, lim)); s != "key" {
		t.Errorf("the key's next body: %s, want its own bound", s)
	}
	// Keys that hold bodies fill the shared 768 MiB: six keys' worth.
	for i := 1; ; i++ {
		key := fmt.Sprintf("k%d", i)
		if n := taken(key); n < 4 {
			// The key's first body came from the reserve (it held
			// nothing); its next ones did not fit the shared part.
			if s := scope(b.reserve(key, 0, body, lim)); s != "reserve" {
				t.Errorf("%s after %d bodies: %s, want the reserve refused", key, n, s)
			}
			if i < 6 {
				t.Fatalf("the shared part was full after %d keys", i)
			}
			break
		}
	}
	shared := lim.total - lim.total/reserveShare
	b.mu.Lock()
	total := b.total
	b.mu.Unlock()
	if total > shared+body {
		t.Errorf("%d bytes reserved; keys that hold bodies may take %d and one body more", total, shared)
	}
	// Each new key still gets its first body, until the reserve is gone.
	fresh := 0
	for i := 0; i < 100; i++ {
		if err := b.reserve(fmt.Sprintf("new%d", i), 0, body, lim); err != nil {
			if s := scope(err); s != "worker" {
				t.Errorf("a new key refused as %s, want the worker full", s)
			}
			break
		}
		fresh++
	}
	if fresh < 7 {
		t.Errorf("only %d keys that held nothing got a body", fresh)
	}
	// A growing body (chunked, or a WebSocket message) of a key that held
	// nothing else may grow into the reserve: only its own bytes count.
	b2 := newBodyBudget(newMetrics(prometheus.NewRegistry()))
	small := bodyLimits{total: 4 << 20, perKey: 4 << 20}
	if err := b2.reserve("other", 0, 3<<20, small); err != nil {
		t.Fatal(err)
	}
	h := &bodyHold{b: b2, key: "alone", lim: small}
	for range 4 {
		if err := h.grow(256 << 10); err != nil {
			t.Fatalf("growing a lone key's body into the reserve: %v", err)
		}
	}
	h.release()
	if b2.total != 3<<20 || b2.perKey["alone"] != 0 {
		t.Errorf("%d reserved after the release (%d of the lone key), want the other key's 3 MiB", b2.total, b2.perKey["alone"])
	}
}

// TestBodyBufferErrorReserve: the reserve's refusal is a 503 that says
// what it is.
func TestBodyBufferErrorReserve(t *testing.T) {
	t.Parallel()
	e := bodyBufferError(&errBodyBuffer{scope: "reserve", limit: 768 << 20})
	if e == nil || e.status != http.StatusServiceUnavailable || e.retryAfter != bodyBufferRetry {
		t.Fatalf("%+v", e)
	}
}
