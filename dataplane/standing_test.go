package dataplane

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

var standingNow = time.Date(2030, 3, 4, 5, 0, 0, 0, time.UTC)

func pooledWindow(pct float64, resetIn time.Duration) *weirv1.PooledWindow {
	return &weirv1.PooledWindow{UsedPercent: pct, ResetsAt: timestamppb.New(standingNow.Add(resetIn)), Accounts: 2, Readings: 2}
}

func itoa64(n int64) string { b, _ := json.Marshal(n); return string(b) }

// TestWriteUnifiedHeaders: the unified headers Claude Code reads, from the
// pool's standing and the request's own finding that the pool is out of
// quota.
func TestWriteUnifiedHeaders(t *testing.T) {
	t.Parallel()
	serving := &weirv1.ModelStanding{Available: true, FiveHour: pooledWindow(60, 2*time.Hour), SevenDay: pooledWindow(25, 50*time.Hour)}
	weekly := &weirv1.ModelStanding{Available: true, FiveHour: pooledWindow(10, 2*time.Hour), SevenDay: pooledWindow(80, 50*time.Hour)}
	spent := &weirv1.ModelStanding{OutOfQuota: true, AvailableAt: timestamppb.New(standingNow.Add(3 * time.Hour)),
		FiveHour: pooledWindow(100, 3*time.Hour), SevenDay: pooledWindow(40, 50*time.Hour)}
	block := &weirv1.QuotaBlock{WindowMinutes: 10080, ResetsAt: timestamppb.New(standingNow.Add(7 * time.Hour))}
	for _, tc := range []struct {
		name   string
		ms     *weirv1.ModelStanding
		block  *weirv1.QuotaBlock
		family string
		status int
		want   map[string]string // suffix after the prefix → value
	}{
		{name: "nothing known", status: 200, want: map[string]string{}},
		{name: "a success: allowed, the more used window named", ms: serving, status: 200, want: map[string]string{
			"Status": "allowed", "Representative-Claim": "five_hour", "Reset": itoa64(standingNow.Add(2 * time.Hour).Unix()),
			"5h-Utilization": "0.6", "5h-Reset": itoa64(standingNow.Add(2 * time.Hour).Unix()),
			"7d-Utilization": "0.25", "7d-Reset": itoa64(standingNow.Add(50 * time.Hour).Unix()),
		}},
		{name: "the weekly window is the fuller", ms: weekly, status: 200, want: map[string]string{
			"Status": "allowed", "Representative-Claim": "seven_day", "Reset": itoa64(standingNow.Add(50 * time.Hour).Unix()),
			"5h-Utilization": "0.1", "5h-Reset": itoa64(standingNow.Add(2 * time.Hour).Unix()),
			"7d-Utilization": "0.8", "7d-Reset": itoa64(standingNow.Add(50 * time.Hour).Unix()),
		}},
		{name: "a 429 the pool's quota did not cause (a budget, a burst): nothing", ms: spent, status: 429, want: map[string]string{}},
		{name: "a block naming no reset: the standing's recovery", ms: spent, status: 429,
			block: &weirv1.QuotaBlock{WindowMinutes: 300}, want: map[string]string{
				"Status": "rejected", "Representative-Claim": "five_hour", "Reset": itoa64(standingNow.Add(3 * time.Hour).Unix()),
				"5h-Utilization": "1", "5h-Reset": itoa64(standingNow.Add(3 * time.Hour).Unix()),
				"7d-Utilization": "0.4", "7d-Reset": itoa64(standingNow.Add(50 * time.Hour).Unix()),
			}},
		{name: "a 429 with the pool out of quota: its window and reset", ms: spent, block: block, status: 429, want: map[string]string{
			"Status": "rejected", "Representative-Claim": "seven_day", "Reset": itoa64(standingNow.Add(7 * time.Hour).Unix()),
			"5h-Utilization": "1", "5h-Reset": itoa64(standingNow.Add(3 * time.Hour).Unix()),
			"7d-Utilization": "0.4", "7d-Reset": itoa64(standingNow.Add(50 * time.Hour).Unix()),
		}},
		{name: "a model family's weekly window, as Anthropic names it", family: "opus", status: 429,
			block: &weirv1.QuotaBlock{Kind: weirv1.QuotaKind_QUOTA_KIND_FAMILY_WINDOW, WindowMinutes: 10080, ResetsAt: timestamppb.New(standingNow.Add(7 * time.Hour))},
			want:  map[string]string{"Status": "rejected", "Representative-Claim": "seven_day_opus", "Reset": itoa64(standingNow.Add(7 * time.Hour).Unix())}},
		{name: "a block without a standing still says rejected", block: block, status: 429, want: map[string]string{
			"Status": "rejected", "Representative-Claim": "seven_day", "Reset": itoa64(standingNow.Add(7 * time.Hour).Unix()),
		}},
		{name: "a success is allowed, whatever the standing said", ms: spent, status: 200, want: map[string]string{
			"Status": "allowed", "Representative-Claim": "five_hour", "Reset": itoa64(standingNow.Add(3 * time.Hour).Unix()),
			"5h-Utilization": "1", "5h-Reset": itoa64(standingNow.Add(3 * time.Hour).Unix()),
			"7d-Utilization": "0.4", "7d-Reset": itoa64(standingNow.Add(50 * time.Hour).Unix()),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			writeUnifiedHeaders(h, tc.ms, tc.block, tc.family, tc.status)
			if len(h) != len(tc.want) {
				t.Errorf("wrote %v, want %v", h, tc.want)
			}
			for k, v := range tc.want {
				if got := h.Get(unifiedPrefix + k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
		})
	}
}

// TestWriteCodexHeaders: the pool's windows as Codex's primary and
// secondary; a window a usage limit wrote already is left alone.
func TestWriteCodexHeaders(t *testing.T) {
	t.Parallel()
	ms := &weirv1.ModelStanding{FiveHour: pooledWindow(40, 2*time.Hour), SevenDay: pooledWindow(12.5, 50*time.Hour)}
	h := http.Header{}
	writeCodexHeaders(h, ms, standingNow)
	for k, v := range map[string]string{
		"X-Codex-Primary-Used-Percent": "40", "X-Codex-Primary-Window-Minutes": "300",
		"X-Codex-Primary-Reset-At": itoa64(standingNow.Add(2 * time.Hour).Unix()), "X-Codex-Primary-Reset-After-Seconds": "7200",
		"X-Codex-Secondary-Used-Percent": "12.5", "X-Codex-Secondary-Window-Minutes": "10080",
		"X-Codex-Secondary-Reset-At": itoa64(standingNow.Add(50 * time.Hour).Unix()), "X-Codex-Secondary-Reset-After-Seconds": "180000",
	} {
		if got := h.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	limited := http.Header{}
	limited.Set("X-Codex-Primary-Used-Percent", "100")
	writeCodexHeaders(limited, ms, standingNow)
	if limited.Get("X-Codex-Primary-Used-Percent") != "100" || limited.Get("X-Codex-Primary-Window-Minutes") != "" ||
		limited.Get("X-Codex-Secondary-Used-Percent") != "12.5" {
		t.Errorf("over a usage limit's primary: %v", limited)
	}
	none := http.Header{}
	writeCodexHeaders(none, nil, standingNow)
	if len(none) != 0 {
		t.Errorf("no standing wrote %v", none)
	}
}

// TestCodexRateLimitsEvent: the event Codex reads over its WebSocket, in
// the shape it parses (type, rate_limits.primary/secondary with
// used_percent, window_minutes, reset_at), SSE-framed; none without a
// window.
func TestCodexRateLimitsEvent(t *testing.T) {
	t.Parallel()
	ev := codexRateLimitsEvent(&weirv1.ModelStanding{FiveHour: pooledWindow(40, 2*time.Hour)})
	name, data, ok := strings.Cut(string(ev), "\ndata: ")
	if !ok || name != "event: codex.rate_limits" || !strings.HasSuffix(data, "\n\n") {
		t.Fatalf("event %q", ev)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(data), &got); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(got)
	want := `{"rate_limits":{"primary":{"reset_at":` + itoa64(standingNow.Add(2*time.Hour).Unix()) +
		`,"used_percent":40,"window_minutes":300}},"type":"codex.rate_limits"}`
	if string(b) != want {
		t.Errorf("event data %s, want %s", b, want)
	}
	if ev := codexRateLimitsEvent(&weirv1.ModelStanding{Available: true}); ev != nil {
		t.Errorf("a standing without windows made %q", ev)
	}
}

// fakeStandingReads is a standings.fetch that counts its calls and
// answers what it is told.
type fakeStandingReads struct {
	mu    sync.Mutex
	calls int
	ms    *weirv1.ModelStanding
	err   error
}

func (f *fakeStandingReads) fetch(ctx context.Context, _ string, _ weirv1.Surface, _ string) (*weirv1.ModelStanding, error) {
	time.Sleep(50 * time.Millisecond) // a control plane's round trip
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return f.ms, f.err
}

func (f *fakeStandingReads) set(ms *weirv1.ModelStanding, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ms, f.err = ms, err
}

func (f *fakeStandingReads) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// TestStandingsCache: a request asks for its key's standing off its own
// path (nothing is known until the read lands); requests meanwhile start
// no second read; a standing is asked again once standingFresh old, served
// until standingStale old, and forgotten when the control plane refuses
// the key. Two models of one family share one entry.
func TestStandingsCache(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeStandingReads{ms: &weirv1.ModelStanding{Available: true, FiveHour: pooledWindow(10, time.Hour)}}
		c := newStandings(f.fetch, time.Now)
		defer c.close()
		sf := weirv1.Surface_SURFACE_MESSAGES
		// landed lets the reads under way land.
		landed := func() {
			time.Sleep(100 * time.Millisecond)
			synctest.Wait()
		}
		c.want("k", sf, "claude-sonnet-4-5")
		if c.get("k", sf, "claude-sonnet-4-5") != nil {
			t.Fatal("a standing before its read landed")
		}
		c.want("k", sf, "claude-sonnet-4-0") // the same family, while the read runs
		landed()
		if n := f.count(); n != 1 {
			t.Fatalf("%d reads, want one for the family", n)
		}
		if ms := c.get("k", sf, "claude-sonnet-4-0"); ms.GetFiveHour().GetUsedPercent() != 10 {
			t.Fatalf("standing %v", ms)
		}
		if c.get("k", sf, "claude-opus-4-1") != nil || c.get("other", sf, "claude-sonnet-4-5") != nil {
			t.Error("another family's or key's standing is this one's")
		}

		time.Sleep(standingFresh - 2*time.Second)
		c.want("k", sf, "claude-sonnet-4-5")
		landed()
		if n := f.count(); n != 1 {
			t.Errorf("%d reads of a fresh standing, want none more", n)
		}
		f.set(nil, connect.NewError(connect.CodeUnavailable, errors.New("down")))
		time.Sleep(2 * time.Second)
		c.want("k", sf, "claude-sonnet-4-5")
		landed()
		if n := f.count(); n != 2 {
			t.Errorf("%d reads, want a second once the standing is %v old", n, standingFresh)
		}
		if c.get("k", sf, "claude-sonnet-4-5") == nil {
			t.Error("a failed read dropped a standing younger than standingStale")
		}
		time.Sleep(standingStale)
		if c.get("k", sf, "claude-sonnet-4-5") != nil {
			t.Error("a standing older than standingStale is still written")
		}

		f.set(&weirv1.ModelStanding{Available: true}, nil)
		c.want("k", sf, "claude-sonnet-4-5")
		landed()
		if c.get("k", sf, "claude-sonnet-4-5") == nil {
			t.Fatal("no standing after a good read")
		}
		f.set(nil, connect.NewError(connect.CodePermissionDenied, errors.New("revoked")))
		time.Sleep(standingFresh)
		c.want("k", sf, "claude-sonnet-4-5")
		landed()
		if c.get("k", sf, "claude-sonnet-4-5") != nil {
			t.Error("a refused key's standing is still written")
		}
	})
}
