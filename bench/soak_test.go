package bench

import (
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSoakCatchesLeaks runs a short soak that leaks a goroutine and a
// descriptor with every request (the hook stands for a leak in weir):
// their checks must fail, every other check still give a verdict, and the
// report say so.
func TestSoakCatchesLeaks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Postgres and runs traffic for several seconds")
	}
	stop := make(chan struct{})
	var (
		leakWG sync.WaitGroup
		mu     sync.Mutex
		files  []*os.File
	)
	t.Cleanup(func() {
		close(stop)
		leakWG.Wait()
		for _, f := range files {
			f.Close()
		}
	})
	cfg := SoakConfig{Duration: 4 * time.Second, Rate: 40, SampleEvery: 250 * time.Millisecond,
		StormEvery: 2 * time.Second, StormLength: 500 * time.Millisecond, Settle: 2 * time.Second,
		leak: func() {
			leakWG.Go(func() { <-stop })
			f, err := os.Open(os.DevNull)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			files = append(files, f)
			mu.Unlock()
		}}
	res, err := RunSoak(t.Context(), cfg)
	if err != nil {
		t.Fatalf("RunSoak: %v", err)
	}
	verdicts := map[string]bool{}
	for _, c := range res.Checks {
		if c.Measured == "" || c.Tolerance == "" {
			t.Errorf("check %q has no measure or tolerance: %+v", c.Name, c)
		}
		verdicts[c.Name] = c.Pass
	}
	for _, name := range []string{"goroutines", "open file descriptors"} {
		if pass, ok := verdicts[name]; !ok || pass {
			t.Errorf("check %q: present %v, passed %v; want a failure (the hook leaked one per request)", name, ok, pass)
		}
	}
	if len(res.Checks) != 8 {
		t.Errorf("%d checks, want 8:\n%s", len(res.Checks), res.Summary())
	}
	for _, name := range []string{"live leases", "requests failed"} {
		if !verdicts[name] {
			t.Errorf("check %q failed; the leak hook should not affect it\n%s", name, res.Summary())
		}
	}
	if md := res.Markdown(); !strings.Contains(md, "**FAIL**: ") || !strings.Contains(md, "goroutines") {
		t.Errorf("report does not say the run failed:\n%s", md)
	}
}

// TestJudge: each check against a run that breaks only it.
func TestJudge(t *testing.T) {
	const d = 8 * time.Second
	clean := func() *SoakResult {
		r := &SoakResult{Config: SoakConfig{Duration: d}}
		r.Baseline = Sample{Goroutines: 40, FDs: 30, PGInUse: 1}
		r.Settled = r.Baseline
		for i := range 8 {
			r.Samples = append(r.Samples, Sample{At: time.Duration(i) * time.Second, HeapInuse: 100 << 20, RSS: 200 << 20})
		}
		r.Requests = Tally{OK: 10, Cancelled: 2, StormServed: 3, Sessions: 1, Served: map[string]int{"responses": 1}}
		r.Storms = []Window{{From: time.Second, To: 2 * time.Second}}
		r.Exercised = []Count{{"holds", 1}, {"breaker opens", 1}, {"upstream 429s (attempts)", 1},
			{"rate_limited cooldowns written", 1}, {"requests served by worker 1", 5}, {"requests served by worker 2", 5}}
		return r
	}
	if failed := judgeFailed(clean()); len(failed) > 0 {
		t.Fatalf("a clean run failed %v", failed)
	}
	for _, tc := range []struct {
		name   string
		mutate func(r *SoakResult)
		want   string
	}{
		{"goroutines back within the margin", func(r *SoakResult) { r.Settled.Goroutines += goroutineMargin }, ""},
		{"goroutines leaked", func(r *SoakResult) { r.Settled.Goroutines += goroutineMargin + 1 }, "goroutines"},
		{"descriptors leaked", func(r *SoakResult) { r.Settled.FDs += fdMargin + 1 }, "open file descriptors"},
		{"a lease left", func(r *SoakResult) { r.Settled.LiveLeases = 1 }, "live leases"},
		{"a connection held", func(r *SoakResult) { r.Settled.PGInUse++ }, "Postgres connections in use"},
		{"heap grew 25%", func(r *SoakResult) {
			for i := 6; i < 8; i++ {
				r.Samples[i].HeapInuse = 125 << 20
			}
		}, "Go heap in use after GC"},
		{"heap grew 15%", func(r *SoakResult) {
			for i := 6; i < 8; i++ {
				r.Samples[i].HeapInuse = 115 << 20
			}
		}, ""},
		{"small heap grew under the floor", func(r *SoakResult) {
			for i := range r.Samples {
				r.Samples[i].HeapInuse = 5 << 20
			}
			r.Samples[6].HeapInuse, r.Samples[7].HeapInuse = 8<<20, 8<<20
		}, ""},
		{"RSS grew 30%", func(r *SoakResult) {
			for i := 6; i < 8; i++ {
				r.Samples[i].RSS = 260 << 20
			}
		}, "RSS"},
		{"no samples in the last quarter", func(r *SoakResult) { r.Samples = r.Samples[:5] }, "Go heap in use after GC; RSS"},
		{"a request failed", func(r *SoakResult) { r.Requests.Failed = 1 }, "requests failed"},
		{"no storm", func(r *SoakResult) { r.Storms = nil }, "every mechanism ran"},
		{"a worker idle", func(r *SoakResult) { r.Exercised[5].Value = 0 }, "every mechanism ran"},
		{"no cancellation", func(r *SoakResult) { r.Requests.Cancelled = 0 }, "every mechanism ran"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := clean()
			tc.mutate(r)
			if got := strings.Join(judgeFailed(r), "; "); got != tc.want {
				t.Errorf("failed %q, want %q", got, tc.want)
			}
		})
	}
}

func judgeFailed(r *SoakResult) []string {
	r.Checks = judge(r)
	return r.Failed()
}
