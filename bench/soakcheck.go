package bench

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The soak's tolerances. Goroutines and descriptors must come back to the
// idle baseline once traffic stopped, within a margin for what a busy
// process keeps (the control plane's pool may hold a few more Postgres
// connections than at the start, each a descriptor; timers and pooled
// objects come and go); a leak of one per request is thousands. Heap and
// RSS are compared under traffic: the median of the last quarter of the
// samples against that of the second (the first is warm-up), a growth
// allowed up to a share or a floor, whichever is larger (a small heap
// moves by more than a share between two medians).
const (
	goroutineMargin = 20
	fdMargin        = 10
	heapGrowthShare = 0.20
	heapGrowthFloor = 4 << 20
	rssGrowthShare  = 0.20
	rssGrowthFloor  = 8 << 20
)

// Check is one verdict of the soak.
type Check struct {
	Name      string `json:"name"`
	Tolerance string `json:"tolerance"`
	Measured  string `json:"measured"`
	Pass      bool   `json:"pass"`
}

// settled says the idle process is back: no live lease and, against a
// baseline, goroutines, descriptors and Postgres connections within the
// checks' margins.
func settled(sm Sample, base *Sample) bool {
	if sm.LiveLeases != 0 {
		return false
	}
	return base == nil || (sm.Goroutines <= base.Goroutines+goroutineMargin && sm.FDs <= base.FDs+fdMargin && sm.PGInUse <= base.PGInUse)
}

// quarters returns the samples of the second and of the last quarter of
// the traffic.
func quarters(samples []Sample, d time.Duration) (second, last []Sample) {
	for _, s := range samples {
		switch {
		case s.At >= d/4 && s.At < d/2:
			second = append(second, s)
		case s.At >= d*3/4:
			last = append(last, s)
		}
	}
	return second, last
}

// median of f over samples (the lower middle of an even count).
func median(samples []Sample, f func(Sample) int64) int64 {
	if len(samples) == 0 {
		return 0
	}
	vs := make([]int64, len(samples))
	for i, s := range samples {
		vs[i] = f(s)
	}
	slices.Sort(vs)
	return vs[(len(vs)-1)/2]
}

// judge derives every check from a finished run.
func judge(r *SoakResult) []Check {
	base, end := r.Baseline, r.Settled
	var out []Check
	back := func(name string, margin, b, e int) {
		out = append(out, Check{Name: name, Tolerance: fmt.Sprintf("≤ baseline + %d once traffic stopped", margin),
			Measured: fmt.Sprintf("%d → %d (%+d)", b, e, e-b), Pass: e <= b+margin})
	}
	back("goroutines", goroutineMargin, base.Goroutines, end.Goroutines)
	back("open file descriptors", fdMargin, base.FDs, end.FDs)
	out = append(out, Check{Name: "live leases", Tolerance: "0 once traffic stopped (cancelled requests' released, no stuck hold)",
		Measured: fmt.Sprint(end.LiveLeases), Pass: end.LiveLeases == 0})
	out = append(out, Check{Name: "Postgres connections in use", Tolerance: "≤ baseline once traffic stopped",
		Measured: fmt.Sprintf("%d → %d (%d open)", base.PGInUse, end.PGInUse, end.PGOpen), Pass: end.PGInUse <= base.PGInUse})

	second, last := quarters(r.Samples, r.Config.Duration)
	growth := func(name string, share float64, floor int64, f func(Sample) int64) {
		c := Check{Name: name, Tolerance: fmt.Sprintf("last quarter's median within +%.0f%% (or +%s MiB) of the second quarter's", 100*share, mib(floor))}
		if len(second) == 0 || len(last) == 0 {
			c.Measured = fmt.Sprintf("too few samples (%d and %d)", len(second), len(last))
			out = append(out, c)
			return
		}
		a, b := median(second, f), median(last, f)
		allowed := max(int64(share*float64(a)), floor)
		c.Measured = fmt.Sprintf("%s → %s MiB (%+.1f%%)", mib(a), mib(b), 100*float64(b-a)/float64(max(a, 1)))
		c.Pass = b-a <= allowed
		out = append(out, c)
	}
	growth("Go heap in use after GC", heapGrowthShare, heapGrowthFloor, func(s Sample) int64 { return s.HeapInuse })
	growth("RSS", rssGrowthShare, rssGrowthFloor, func(s Sample) int64 { return s.RSS })

	q := r.Requests
	total := q.OK + q.Cancelled + q.Failed
	out = append(out, Check{Name: "requests failed", Tolerance: "0: every request served (storm-time ones after their hold) or cancelled by its client as planned",
		Measured: fmt.Sprintf("%d of %d (storm-time: %d served, %d failed)", q.Failed, total, q.StormServed, q.StormFailed),
		Pass:     q.Failed == 0 && total > 0})

	var missing []string
	need := func(ok bool, what string) {
		if !ok {
			missing = append(missing, what)
		}
	}
	ex := map[string]int64{}
	for _, c := range r.Exercised {
		ex[c.Name] = c.Value
	}
	need(len(r.Storms) > 0 && ex["holds"] > 0 && ex["breaker opens"] > 0, "storm holds and the breaker")
	need(q.StormServed > 0, "storm-time requests served")
	need(ex["upstream 429s (attempts)"] > 0 && ex["rate_limited cooldowns written"] > 0, "429 failover and cooldowns")
	need(q.Cancelled > 0, "client cancellations")
	need(q.Sessions > 0, "session requests")
	need(q.Served["responses"]+q.Served["responses stream"] > 0, "Responses requests")
	for name, v := range ex {
		if strings.HasPrefix(name, "requests served by worker") && v == 0 {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	c := Check{Name: "every mechanism ran", Tolerance: "storms held and served, 429s failed over and cooled an account, cancellations, sessions, Responses, both workers",
		Measured: "all", Pass: len(missing) == 0}
	if len(missing) > 0 {
		c.Measured = "missing: " + strings.Join(missing, ", ")
	}
	return append(out, c)
}

func mib(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }
