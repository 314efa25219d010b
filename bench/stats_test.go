package bench

import (
	"testing"
	"time"
)

func ms2d(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

func TestPercentile(t *testing.T) {
	t.Parallel()
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	for _, tc := range []struct {
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{nil, 50, 0},
		{[]time.Duration{7}, 50, 7},
		{[]time.Duration{7}, 99, 7},
		{[]time.Duration{1, 2}, 50, 1},
		{[]time.Duration{1, 2}, 51, 2},
		{hundred, 50, 50 * time.Millisecond},
		{hundred, 99, 99 * time.Millisecond},
		{hundred, 100, 100 * time.Millisecond},
		{hundred, 0, time.Millisecond},
	} {
		if got := percentile(tc.in, tc.p); got != tc.want {
			t.Errorf("percentile(%d values, %v) = %v, want %v", len(tc.in), tc.p, got, tc.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	ds := []time.Duration{5, 1, 4, 2, 3} // unsorted on purpose
	s := summarize(ds)
	if s.N != 5 || s.P50 != 3 || s.P99 != 5 || s.Max != 5 || s.Mean != 3 {
		t.Errorf("summarize = %+v", s)
	}
	if (summarize(nil) != Summary{}) {
		t.Error("summarize(nil) is not zero")
	}
}

func TestAddedAndSustained(t *testing.T) {
	t.Parallel()
	step := func(name string, rate int, p50, p99, maxMs float64, errs int64) Step {
		return Step{Target: name, Rate: rate, stepLoad: stepLoad{Measured: 1000, Errors: errs,
			Latency: Summary{N: 1000, P50: ms2d(p50), P99: ms2d(p99), Max: ms2d(maxMs)}}}
	}
	a := added(step("weir", 100, 1.5, 4, 9, 0).Latency, step("direct", 100, 1, 2, 3, 0).Latency)
	if a.P50 != ms2d(0.5) || a.P99 != ms2d(2) || a.Max != ms2d(6) {
		t.Errorf("added = %+v", a)
	}
	// weir over bare p99: +0.5, +3, +8, +0.5 (a later recovery must not
	// count), and weir fails 2% at the last rate.
	rows := []Comparison{
		compare(step("direct", 100, 1, 2, 3, 0), step("bare", 100, 1, 2, 3, 0), step("weir", 100, 1, 2.5, 4, 0)),
		compare(step("direct", 250, 1, 2, 3, 0), step("bare", 250, 1, 3, 3, 0), step("weir", 250, 1, 6, 9, 0)),
		compare(step("direct", 500, 1, 2, 3, 0), step("bare", 500, 1, 4, 5, 0), step("weir", 500, 2, 12, 20, 0)),
		compare(step("direct", 1000, 1, 3, 3, 0), step("bare", 1000, 1, 20, 30, 0), step("weir", 1000, 2, 20.5, 40, 20)),
	}
	s := sustain(0, rows)
	if s.WeirOverBareUnder[1] != 100 || s.WeirOverBareUnder[5] != 250 || s.WeirOverBareUnder[10] != 500 {
		t.Errorf("within 1/5/10 ms: %v", s.WeirOverBareUnder)
	}
	// Over direct ≤ 10 ms: weir +0.5, +4, +10, (fails); bare +0, +1, +2, +17.
	if s.Weir != 500 || s.Bare != 500 || s.Ratio != 1 || s.Capped {
		t.Errorf("sustained = %+v", s)
	}
	if got := rows[2].WeirOverBare; got.P50 != ms2d(1) || got.P99 != ms2d(8) || got.Max != ms2d(15) {
		t.Errorf("weir over bare at 500 = %+v", got)
	}
}

func TestCPUAttribution(t *testing.T) {
	t.Parallel()
	d := Step{Target: "direct", CPUPerRequest: 300 * time.Microsecond, PGCPUPerRequest: 10 * time.Microsecond}
	b := Step{Target: "bare", CPUPerRequest: 420 * time.Microsecond, PGCPUPerRequest: 10 * time.Microsecond}
	w := Step{Target: "weir", CPUPerRequest: 900 * time.Microsecond, PGCPUPerRequest: 260 * time.Microsecond}
	c := compare(d, b, w)
	if c.BareCPUPerRequest != 120*time.Microsecond || c.WeirCPUPerRequest != 600*time.Microsecond || c.WeirPGCPUPerRequest != 250*time.Microsecond {
		t.Errorf("cpu: bare %v weir %v pg %v", c.BareCPUPerRequest, c.WeirCPUPerRequest, c.WeirPGCPUPerRequest)
	}
}

func TestIdlePerStream(t *testing.T) {
	t.Parallel()
	got := idlePerStream([]IdleResult{
		{Target: "direct", N: 1000, Opened: 1000, RSSGrowth: 40 << 20, PeakGrowth: 50 << 20},
		{Target: "bare", N: 1000, Opened: 1000, RSSGrowth: 60 << 20, PeakGrowth: 70 << 20},
		{Target: "weir", N: 1000, Opened: 1000, RSSGrowth: 100 << 20, PeakGrowth: 130 << 20},
	})
	if len(got) != 1 {
		t.Fatalf("got %d rows", len(got))
	}
	per := func(mib int64) int64 { return (mib << 20) / 1000 }
	if g := got[0]; g.WeirPerStream != per(100)-per(40) || g.BarePerStream != per(60)-per(40) || g.WeirPeakPerStream != per(130)-per(50) {
		t.Errorf("per stream = %+v", g)
	}
}
