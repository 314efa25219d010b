package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/internal/sim"
)

// usageSum is tokens as a client or the simulator counted them.
type usageSum struct {
	requests, input, output, cacheRead, cacheCreation int64
}

// TestUsageKeptAcrossRestarts: three keys send a few hundred requests
// through two workers while the control plane restarts, a worker is
// replaced and Postgres restarts; the usage weir keeps per key is exactly
// what the clients were told they used, and per account what the
// simulator says it answered.
func TestUsageKeptAcrossRestarts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cluster := privateCluster(t, dir, 0)
	port := cluster.Port()
	pool := migratedPool(t, cluster, 8)
	e := setup(t, options{db: pool, hold: time.Minute, noDataplane: true,
		accounts: []account{{label: "a", maxConc: 8}, {label: "b", maxConc: 8}}})
	ctx := t.Context()
	keys := make([]string, 3)
	names := make([]string, 3)
	for i := range keys {
		names[i] = fmt.Sprintf("kept-%d", i)
		res, err := e.keys.CreateKey(ctx, connect.NewRequest(&weirv1.CreateKeyRequest{Name: names[i]}))
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = res.Msg.Secret
	}
	_, w1 := e.newDataplane(nil)
	dp2, w2 := e.newDataplane(nil)
	workers := []string{w1.URL, w2.URL}

	var mu sync.Mutex
	told := map[string]*usageSum{}
	// A phase is n requests from six clients, round robin over keys and
	// workers, each a Claude Code turn (cache_control on the system prompt).
	phase := func(n int) {
		var wg sync.WaitGroup
		for c := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				hc := &http.Client{}
				for i := c; i < n; i += 6 {
					k := i % 3
					body := fmt.Sprintf(`{"model":"%s","max_tokens":64,"system":[{"type":"text","text":"You are agent %d.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"turn %d"}]}`, model, k, i%7)
					r := e.doWith(hc, workers[i%2], http.MethodPost, "/v1/messages", body, func(r *http.Request) {
						r.Header.Set("X-Api-Key", keys[k])
						r.Header.Set("X-Claude-Code-Session-Id", fmt.Sprintf("session-%d", k))
					})
					if r.status != 200 {
						t.Errorf("request %d: %d %s", i, r.status, r.body)
						continue
					}
					var msg struct {
						Usage struct {
							Input         int64 `json:"input_tokens"`
							Output        int64 `json:"output_tokens"`
							CacheRead     int64 `json:"cache_read_input_tokens"`
							CacheCreation int64 `json:"cache_creation_input_tokens"`
						} `json:"usage"`
					}
					if err := json.Unmarshal(r.body, &msg); err != nil {
						t.Errorf("request %d: %v", i, err)
						continue
					}
					mu.Lock()
					s := told[names[k]]
					if s == nil {
						s = &usageSum{}
						told[names[k]] = s
					}
					s.requests++
					s.input += msg.Usage.Input
					s.output += msg.Usage.Output
					s.cacheRead += msg.Usage.CacheRead
					s.cacheCreation += msg.Usage.CacheCreation
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}

	phase(100)
	// The control plane restarts on its address.
	e.startControlPlane(e.stopControlPlane())
	phase(100)
	// A worker is replaced (stopped as an orchestrator stops it: its
	// outbox is sent before it exits).
	closeServer(w2)
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	dp2.Close(stopCtx)
	cancel()
	_, w3 := e.newDataplane(nil)
	workers[1] = w3.URL
	// Postgres restarts on its address.
	if err := cluster.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	privateCluster(t, dir, port)
	// The new worker knows no key yet: it admits one only once the
	// control plane can check it (a client would retry the 503 until).
	eventually(t, "the control plane to check keys again", func() bool {
		for _, k := range keys {
			if _, err := e.leases.VerifyKey(ctx, connect.NewRequest(&weirv1.VerifyKeyRequest{KeyHash: controlplane.HashKey(k)})); err != nil {
				return false
			}
		}
		return true
	})
	phase(100)

	usage := weirv1connect.NewUsageServiceClient(rpcclient.HTTPClient(), e.cpSrv.URL, connect.WithInterceptors(rpcclient.Token(e.admin)))
	span := &weirv1.QueryUsageRequest{Since: timestamppb.New(time.Now().Add(-time.Hour)), Until: timestamppb.New(time.Now().Add(time.Hour))}
	query := func(by string) map[string]usageSum {
		req := &weirv1.QueryUsageRequest{GroupBy: []string{by}, Since: span.Since, Until: span.Until}
		resp, err := usage.QueryUsage(ctx, connect.NewRequest(req))
		if err != nil {
			t.Fatalf("QueryUsage: %v", err)
		}
		out := map[string]usageSum{}
		for _, r := range resp.Msg.Rows {
			name := r.KeyName
			if by == "account" {
				name = r.AccountLabel
			}
			out[name] = usageSum{r.Requests, r.InputTokens, r.OutputTokens, r.CacheReadTokens, r.CacheCreationTokens}
		}
		return out
	}
	var byKey map[string]usageSum
	eventually(t, "every request's usage stored", func() bool {
		byKey = query("key")
		var n int64
		for _, s := range byKey {
			n += s.requests
		}
		return n >= 300
	})
	for _, name := range names {
		if got, want := byKey[name], *told[name]; got != want {
			t.Errorf("%s: weir kept %+v, the client was told %+v", name, got, want)
		}
	}
	// Per account, what the simulator answered.
	sim := map[string]usageSum{}
	for _, a := range e.sim.Attempts() {
		if a.Status != 200 {
			continue
		}
		s := sim[a.Account]
		s.requests++
		s.input += int64(a.Usage.InputTokens)
		s.output += int64(a.Usage.OutputTokens)
		s.cacheRead += int64(a.Usage.CacheReadTokens)
		s.cacheCreation += int64(a.Usage.CacheCreationTokens)
		sim[a.Account] = s
	}
	byAccount := query("account")
	for label, want := range sim {
		if got := byAccount[label]; got != want {
			t.Errorf("account %s: weir kept %+v, the simulator answered %+v", label, got, want)
		}
	}
	if told[names[0]].cacheRead == 0 {
		t.Errorf("no request read the cache: the test did not exercise cache reads")
	}
}

// TestCacheMissAttributedToFailover: a Claude Code session reads its
// prompt cache on its account until that account is overloaded; the turn
// that fails over to another account misses the cache there, and
// ExplainCache says so: moved, by a failover from the overloaded account.
func TestCacheMissAttributedToFailover(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "a", maxConc: 4, priority: 10}, {label: "b", maxConc: 4}}})
	ctx := t.Context()
	turn := func(n int) response {
		body := fmt.Sprintf(`{"model":"%s","max_tokens":64,"system":[{"type":"text","text":"You are a careful coding agent.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"step %d"}]}`, model, n)
		r := e.do(http.MethodPost, "/v1/messages", body, func(r *http.Request) { r.Header.Set("X-Claude-Code-Session-Id", "cc-session-1") })
		if r.status != 200 {
			t.Fatalf("turn %d: %d %s", n, r.status, r.body)
		}
		return r
	}
	turn(1)
	turn(2)
	if err := e.sim.AddFaults("a", sim.Fault{Kind: sim.FaultOverloaded, Times: 5}); err != nil {
		t.Fatal(err)
	}
	moved := turn(3).header.Get("Weir-Request-Id")
	usage := weirv1connect.NewUsageServiceClient(rpcclient.HTTPClient(), e.cpSrv.URL, connect.WithInterceptors(rpcclient.Token(e.admin)))
	var sc *weirv1.SessionCache
	eventually(t, "the session's three turns stored", func() bool {
		resp, err := usage.ExplainCache(ctx, connect.NewRequest(&weirv1.ExplainCacheRequest{SessionKey: "cc-session-1"}))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Msg.Sessions) == 1 && resp.Msg.Sessions[0].Requests == 3 {
			sc = resp.Msg.Sessions[0]
		}
		return sc != nil
	})
	if sc.CacheReadTokens == 0 {
		t.Errorf("turn 2 read nothing from the cache: %v", sc)
	}
	if len(sc.Misses) != 1 {
		t.Fatalf("misses: %v", sc.Misses)
	}
	m := sc.Misses[0]
	if m.RequestId != moved || m.Cause != "moved" || m.PreviousAccountLabel != "a" || m.AccountLabel != "b" ||
		!strings.Contains(m.Why, "failover: a answered 529 overloaded_error") {
		t.Errorf("the miss: %v", m)
	}
}
