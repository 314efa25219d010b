package policy

import (
	"math"
	"sort"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Forecasts: per account and usage window, the burn rate and when the
// window would be exhausted at that rate, from the usage snapshots (a copy
// of usage_windows every two minutes). The estimator is pure; the backtest
// in forecast_test.go measures its error on simulated histories and
// docs/accounts.md keeps the numbers.

const (
	// forecastSameWindow: two snapshots belong to the same window when
	// their resets differ by at most this (the poll and the headers round
	// a reset differently).
	forecastSameWindow = 2 * time.Second
	// forecastResetDrop: a fall of utilization larger than this between
	// two snapshots of one window is a reset (the segment starts again
	// after it); a smaller one is noise and stays in the fit.
	forecastResetDrop = 0.05
	// forecastMinSpan: the fitted snapshots must span at least this, or
	// there is no burn rate to speak of.
	forecastMinSpan = 10 * time.Minute
	// ForecastHistory: how far back the account views read snapshots; the
	// longest lookback below.
	ForecastHistory = 6 * time.Hour
)

// forecastLookback is the N of "the last N hours" fitted for a window: a
// 5-hour window moves within the hour, a weekly one needs hours of history
// to say anything, and recent use says more than the day before.
func forecastLookback(window string) time.Duration {
	if window == windowFiveHour {
		return time.Hour
	}
	return ForecastHistory
}

// Sample is one snapshot of one account's window.
type Sample struct {
	At          time.Time
	Utilization float64
	ResetsAt    time.Time
}

// forecast is what the estimator says about one window.
type forecast struct {
	// burnPerHour is the utilization used per hour (a fraction: 0.1 is
	// 10 points an hour); 0 or less when nothing is burning.
	burnPerHour float64
	// exhaustsAt is when the window reaches 100% at that rate; nil when it
	// is not burning or would not exhaust before it resets.
	exhaustsAt *time.Time
}

// estimateForecast fits the snapshots of the current window (the reset of
// the latest snapshot, within 2 s), after the last reset seen in them and
// within lookback of the latest one, by least squares. ok is false when
// there is not enough history for a rate.
func estimateForecast(samples []Sample, lookback time.Duration) (forecast, bool) {
	if len(samples) < 2 {
		return forecast{}, false
	}
	s := append([]Sample(nil), samples...)
	sort.SliceStable(s, func(i, j int) bool { return s[i].At.Before(s[j].At) })
	last := s[len(s)-1]
	cur := s[:0:0]
	for _, x := range s {
		if d := x.ResetsAt.Sub(last.ResetsAt); d <= forecastSameWindow && d >= -forecastSameWindow && !x.At.Before(last.At.Add(-lookback)) {
			cur = append(cur, x)
		}
	}
	// Start after the last reset-sized fall.
	for i := len(cur) - 1; i > 0; i-- {
		if cur[i-1].Utilization-cur[i].Utilization > forecastResetDrop {
			cur = cur[i:]
			break
		}
	}
	if len(cur) < 2 || cur[len(cur)-1].At.Sub(cur[0].At) < forecastMinSpan {
		return forecast{}, false
	}
	// Least squares of utilization on hours since the first sample.
	t0 := cur[0].At
	var n, sx, sy, sxx, sxy float64
	for _, x := range cur {
		h := x.At.Sub(t0).Hours()
		n++
		sx += h
		sy += x.Utilization
		sxx += h * h
		sxy += h * x.Utilization
	}
	den := n*sxx - sx*sx
	if den <= 0 {
		return forecast{}, false
	}
	burn := (n*sxy - sx*sy) / den
	if math.Abs(burn) < 1e-9 {
		burn = 0 // rounding of a flat line
	}
	f := forecast{burnPerHour: burn}
	if burn <= 0 {
		return f, true
	}
	// From the fitted line at the latest sample: the fit smooths the noise
	// a single reading carries.
	hLast := last.At.Sub(t0).Hours()
	fitted := (sy-burn*sx)/n + burn*hLast
	if last.Utilization > fitted {
		// The latest reading is the better anchor when it is ahead (usage
		// only grows within a window).
		fitted = last.Utilization
	}
	var at time.Time
	if fitted >= 1 {
		at = last.At
	} else {
		at = last.At.Add(time.Duration((1 - fitted) / burn * float64(time.Hour)))
	}
	if at.Before(last.ResetsAt) {
		f.exhaustsAt = &at
	}
	return f, true
}

// ForecastWindow is the API's forecast of one window, if there is one: a
// window that has already reset (its latest reset is past) has none.
func ForecastWindow(window string, samples []Sample, now time.Time) (*weirv1.Forecast, bool) {
	if len(samples) == 0 || !samples[len(samples)-1].ResetsAt.After(now) {
		return nil, false
	}
	f, ok := estimateForecast(samples, forecastLookback(window))
	if !ok {
		return nil, false
	}
	out := &weirv1.Forecast{Window: window, BurnPerHour: f.burnPerHour}
	if f.exhaustsAt != nil {
		out.ExhaustsAt = timestamppb.New(*f.exhaustsAt)
	}
	return out, true
}
