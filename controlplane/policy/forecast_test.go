package policy

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestEstimateForecast(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)
	reset := t0.Add(48 * time.Hour)
	line := func(from, rate float64, n int, step time.Duration, r time.Time) []Sample {
		var s []Sample
		for i := range n {
			s = append(s, Sample{At: t0.Add(time.Duration(i) * step), Utilization: from + rate*(time.Duration(i)*step).Hours(), ResetsAt: r})
		}
		return s
	}
	near := func(got *time.Time, want time.Time) bool {
		return got != nil && got.Sub(want).Abs() < time.Minute
	}
	t.Run("steady burn", func(t *testing.T) {
		t.Parallel()
		f, ok := estimateForecast(line(0.1, 0.05, 31, 2*time.Minute, reset), 6*time.Hour)
		// At 60 min: 0.15; 0.85 left at 0.05/h = 17 h.
		if !ok || math.Abs(f.burnPerHour-0.05) > 1e-9 || !near(f.exhaustsAt, t0.Add(time.Hour+17*time.Hour)) {
			t.Fatalf("got %+v %v", f, ok)
		}
	})
	t.Run("would not exhaust before the reset", func(t *testing.T) {
		t.Parallel()
		f, ok := estimateForecast(line(0.1, 0.01, 31, 2*time.Minute, reset), 6*time.Hour)
		if !ok || f.exhaustsAt != nil || f.burnPerHour <= 0 {
			t.Fatalf("got %+v %v", f, ok)
		}
	})
	t.Run("not burning", func(t *testing.T) {
		t.Parallel()
		f, ok := estimateForecast(line(0.4, 0, 31, 2*time.Minute, reset), 6*time.Hour)
		if !ok || f.exhaustsAt != nil || f.burnPerHour != 0 {
			t.Fatalf("got %+v %v", f, ok)
		}
	})
	t.Run("too little history", func(t *testing.T) {
		t.Parallel()
		if _, ok := estimateForecast(line(0.4, 0.1, 1, 2*time.Minute, reset), 6*time.Hour); ok {
			t.Fatal("one sample gave a forecast")
		}
		if _, ok := estimateForecast(line(0.4, 0.1, 3, 2*time.Minute, reset), 6*time.Hour); ok {
			t.Fatal("4 minutes gave a forecast")
		}
	})
	t.Run("only the current window", func(t *testing.T) {
		t.Parallel()
		// An older window burned fast; the current one (a reset 5 days
		// later, 1 s of jitter) burns at 0.05/h.
		old := line(0.2, 0.5, 10, 2*time.Minute, t0.Add(-time.Hour))
		cur := line(0.1, 0.05, 31, 2*time.Minute, reset)
		for i := range cur {
			cur[i].At = cur[i].At.Add(time.Hour)
			if i%2 == 1 {
				cur[i].ResetsAt = reset.Add(time.Second)
			}
		}
		f, ok := estimateForecast(append(old, cur...), 6*time.Hour)
		if !ok || math.Abs(f.burnPerHour-0.05) > 1e-9 {
			t.Fatalf("got %+v %v", f, ok)
		}
	})
	t.Run("a fall is a reset", func(t *testing.T) {
		t.Parallel()
		// Same reset recorded (a stale reset), but utilization fell from
		// 0.9 to 0.02: fit only what came after.
		before := line(0.6, 0.3, 30, 2*time.Minute, reset)
		after := line(0.02, 0.05, 31, 2*time.Minute, reset)
		for i := range after {
			after[i].At = after[i].At.Add(2 * time.Hour)
		}
		f, ok := estimateForecast(append(before, after...), 6*time.Hour)
		if !ok || math.Abs(f.burnPerHour-0.05) > 1e-9 {
			t.Fatalf("got %+v %v", f, ok)
		}
	})
	t.Run("lookback", func(t *testing.T) {
		t.Parallel()
		// Two hours at 0.2/h, then an hour at 0.05/h: a one-hour lookback
		// sees only the latter.
		first := line(0.0, 0.2, 60, 2*time.Minute, reset)
		second := line(0.4, 0.05, 31, 2*time.Minute, reset)
		for i := range second {
			second[i].At = second[i].At.Add(2 * time.Hour)
		}
		f, ok := estimateForecast(append(first, second...), time.Hour)
		if !ok || math.Abs(f.burnPerHour-0.05) > 1e-9 {
			t.Fatalf("got %+v %v", f, ok)
		}
	})
	t.Run("already full", func(t *testing.T) {
		t.Parallel()
		s := line(0.9, 0.2, 31, 2*time.Minute, reset)
		f, ok := estimateForecast(s, 6*time.Hour)
		if !ok || f.exhaustsAt == nil || !f.exhaustsAt.Equal(s[len(s)-1].At) {
			t.Fatalf("got %+v %v", f, ok)
		}
	})
}

// The backtest: simulated histories of one window, snapshotted every two
// minutes as the usage endpoint reports them (whole percents, plus noise
// where the profile has it), and the estimator asked at several points
// before the true exhaustion. The error is |predicted - true| as a share of
// the true remaining time; a forecast of "not before the reset" counts as
// predicting the reset.
//
// The bounds are the measured values (recorded in docs/accounts.md)
// with headroom for a change of seed, not targets: the estimator is a
// linear fit, and a history that changes pace (idle then burst) is where
// it is worst, by construction.
func TestForecastBacktest(t *testing.T) {
	t.Parallel()
	const step = 2 * time.Minute
	var burstAt float64 // hours into the window, drawn per history
	type profile struct {
		name   string
		window string
		length time.Duration
		// rate is the true burn per hour at hour h of the window.
		rate  func(r *rand.Rand, h float64) float64
		noise float64
		// askFrom: the questions are spread over the time from this many
		// hours into the window to the true exhaustion (a burst nothing in
		// the history announces is no forecast's to predict; how fast the
		// fit catches up with it is).
		askFrom func(r *rand.Rand) float64
	}
	idleFor := func(r *rand.Rand) float64 { return 12 + 36*r.Float64() }
	profiles := []profile{
		{name: "steady weekly", window: windowSevenDay, length: 7 * 24 * time.Hour,
			rate: func(r *rand.Rand, h float64) float64 { return 0.012 }},
		{name: "steady five-hour", window: windowFiveHour, length: 5 * time.Hour,
			rate: func(r *rand.Rand, h float64) float64 { return 0.3 }},
		{name: "bursty weekly", window: windowSevenDay, length: 7 * 24 * time.Hour, noise: 0.004,
			rate: func(r *rand.Rand, h float64) float64 {
				// Sessions: an exponential draw around 0.015/h, a tenth of
				// the time a burst of five times that.
				x := r.ExpFloat64() * 0.015
				if r.Float64() < 0.1 {
					x *= 5
				}
				return x
			}},
		{name: "bursty five-hour", window: windowFiveHour, length: 5 * time.Hour, noise: 0.004,
			rate: func(r *rand.Rand, h float64) float64 {
				x := r.ExpFloat64() * 0.3
				if r.Float64() < 0.1 {
					x *= 4
				}
				return x
			}},
		{name: "idle then burst weekly", window: windowSevenDay, length: 7 * 24 * time.Hour, noise: 0.002,
			rate: func(r *rand.Rand, h float64) float64 {
				if h < burstAt {
					return 0.0005
				}
				return 0.02
			},
			askFrom: func(r *rand.Rand) float64 { return burstAt }},
	}
	var errs []float64
	perProfile := map[string][]float64{}
	for _, p := range profiles {
		for seed := range uint64(20) {
			r := rand.New(rand.NewPCG(seed, 0x5eed))
			burstAt = idleFor(r)
			from := 0.0
			if p.askFrom != nil {
				from = p.askFrom(r)
			}
			windowStart := time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)
			reset := windowStart.Add(p.length)
			// Simulate the true path to exhaustion or the reset.
			u := 0.02 + 0.1*r.Float64()
			var truth []float64 // true utilization at each step
			var at []time.Time
			exhausted := time.Time{}
			for ts := windowStart; ts.Before(reset); ts = ts.Add(step) {
				truth = append(truth, u)
				at = append(at, ts)
				if u >= 1 && exhausted.IsZero() {
					exhausted = ts
					break
				}
				u += p.rate(r, ts.Sub(windowStart).Hours()) * step.Hours()
			}
			if exhausted.IsZero() {
				continue // never exhausts: nothing to measure
			}
			obs := make([]Sample, len(truth))
			for i, v := range truth {
				o := v + p.noise*r.NormFloat64()
				o = math.Round(min(max(o, 0), 1)*100) / 100
				obs[i] = Sample{At: at[i], Utilization: o, ResetsAt: reset.Add(time.Duration(r.IntN(3)-1) * time.Second)}
			}
			lookback := forecastLookback(p.window)
			// Ask at 10%, 30%, 50%, 70% and 90% of the way from askFrom to
			// the exhaustion, once the window is an hour old.
			origin := windowStart.Add(time.Duration(from * float64(time.Hour)))
			for _, frac := range []float64{0.1, 0.3, 0.5, 0.7, 0.9} {
				now := origin.Add(time.Duration(frac * float64(exhausted.Sub(origin))))
				if now.Sub(windowStart) < time.Hour {
					continue
				}
				var hist []Sample
				for _, o := range obs {
					if !o.At.After(now) {
						hist = append(hist, o)
					}
				}
				f, ok := estimateForecast(hist, lookback)
				pred := reset
				if ok && f.exhaustsAt != nil {
					pred = *f.exhaustsAt
				}
				remaining := exhausted.Sub(now)
				if remaining <= 0 {
					continue
				}
				e := math.Abs(pred.Sub(exhausted).Hours()) / remaining.Hours()
				errs = append(errs, e)
				perProfile[p.name] = append(perProfile[p.name], e)
			}
		}
	}
	quant := func(xs []float64, q float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[int(math.Ceil(q*float64(len(s))))-1]
	}
	for _, p := range profiles {
		e := perProfile[p.name]
		if len(e) == 0 {
			t.Fatalf("%s: nothing measured", p.name)
		}
		t.Logf("%-24s n=%3d median %5.1f%% p90 %5.1f%%", p.name, len(e), 100*quant(e, 0.5), 100*quant(e, 0.9))
	}
	med, p90 := quant(errs, 0.5), quant(errs, 0.9)
	t.Logf("all                      n=%3d median %5.1f%% p90 %5.1f%%", len(errs), 100*med, 100*p90)
	// Bounds: the measured values (median 2.2%, p90 27.6% over all; steady
	// histories within 2% but for the last minutes of a 5-hour window,
	// where one whole percent is a large share of what remains) with
	// roughly half again as headroom, so a regression of the estimator
	// fails and a change of seed does not.
	if med > 0.05 || p90 > 0.40 {
		t.Fatalf("forecast error median %.1f%% p90 %.1f%%: above the bounds (5%%, 40%%)", 100*med, 100*p90)
	}
	if e := quant(perProfile["steady weekly"], 0.9); e > 0.05 {
		t.Fatalf("steady weekly p90 %.1f%%: above 5%%", 100*e)
	}
}
