package controlplane

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/google/uuid"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Forecasts: per account and usage window, the burn rate and when the
// window would be exhausted at that rate, from the usage snapshots (a copy
// of usage_windows every two minutes). The estimator is pure; the backtest
// in forecast_test.go measures its error on simulated histories and
// docs/architecture.md keeps the numbers.

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
	// forecastHistory: how far back the account views read snapshots; the
	// longest lookback below.
	forecastHistory = 6 * time.Hour
)

// forecastLookback is the N of "the last N hours" fitted for a window: a
// 5-hour window moves within the hour, a weekly one needs hours of history
// to say anything, and recent use says more than the day before.
func forecastLookback(window string) time.Duration {
	if window == windowFiveHour {
		return time.Hour
	}
	return forecastHistory
}

// usageSample is one snapshot of one account's window.
type usageSample struct {
	at          time.Time
	utilization float64
	resetsAt    time.Time
}

// usageForecast is what the estimator says about one window.
type usageForecast struct {
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
func estimateForecast(samples []usageSample, lookback time.Duration) (usageForecast, bool) {
	if len(samples) < 2 {
		return usageForecast{}, false
	}
	s := append([]usageSample(nil), samples...)
	sort.SliceStable(s, func(i, j int) bool { return s[i].at.Before(s[j].at) })
	last := s[len(s)-1]
	cur := s[:0:0]
	for _, x := range s {
		if d := x.resetsAt.Sub(last.resetsAt); d <= forecastSameWindow && d >= -forecastSameWindow && !x.at.Before(last.at.Add(-lookback)) {
			cur = append(cur, x)
		}
	}
	// Start after the last reset-sized fall.
	for i := len(cur) - 1; i > 0; i-- {
		if cur[i-1].utilization-cur[i].utilization > forecastResetDrop {
			cur = cur[i:]
			break
		}
	}
	if len(cur) < 2 || cur[len(cur)-1].at.Sub(cur[0].at) < forecastMinSpan {
		return usageForecast{}, false
	}
	// Least squares of utilization on hours since the first sample.
	t0 := cur[0].at
	var n, sx, sy, sxx, sxy float64
	for _, x := range cur {
		h := x.at.Sub(t0).Hours()
		n++
		sx += h
		sy += x.utilization
		sxx += h * h
		sxy += h * x.utilization
	}
	den := n*sxx - sx*sx
	if den <= 0 {
		return usageForecast{}, false
	}
	burn := (n*sxy - sx*sy) / den
	if math.Abs(burn) < 1e-9 {
		burn = 0 // rounding of a flat line
	}
	f := usageForecast{burnPerHour: burn}
	if burn <= 0 {
		return f, true
	}
	// From the fitted line at the latest sample: the fit smooths the noise
	// a single reading carries.
	hLast := last.at.Sub(t0).Hours()
	fitted := (sy-burn*sx)/n + burn*hLast
	if last.utilization > fitted {
		// The latest reading is the better anchor when it is ahead (usage
		// only grows within a window).
		fitted = last.utilization
	}
	var at time.Time
	if fitted >= 1 {
		at = last.at
	} else {
		at = last.at.Add(time.Duration((1 - fitted) / burn * float64(time.Hour)))
	}
	if at.Before(last.resetsAt) {
		f.exhaustsAt = &at
	}
	return f, true
}

// forecasts reads every account's recent snapshots in one query and
// forecasts each window with enough history.
func (s *Server) forecasts(ctx context.Context, now time.Time) (map[uuid.UUID][]*weirv1.Forecast, error) {
	rows, err := s.q.RecentUsageSnapshots(ctx, now.Add(-forecastHistory))
	if err != nil {
		return nil, fmt.Errorf("usage snapshots: %w", err)
	}
	out := make(map[uuid.UUID][]*weirv1.Forecast)
	// Rows come ordered by account, window and time: forecast each run.
	for i := 0; i < len(rows); {
		j := i
		var samples []usageSample
		for ; j < len(rows) && rows[j].AccountID == rows[i].AccountID && rows[j].WindowName == rows[i].WindowName; j++ {
			samples = append(samples, usageSample{at: rows[j].TakenAt, utilization: rows[j].Utilization, resetsAt: rows[j].ResetsAt})
		}
		if f, ok := forecastWindow(rows[i].WindowName, samples, now); ok {
			out[rows[i].AccountID] = append(out[rows[i].AccountID], f)
		}
		i = j
	}
	return out, nil
}

// forecastWindow is the API's forecast of one window, if there is one: a
// window that has already reset (its latest reset is past) has none.
func forecastWindow(window string, samples []usageSample, now time.Time) (*weirv1.Forecast, bool) {
	if len(samples) == 0 || !samples[len(samples)-1].resetsAt.After(now) {
		return nil, false
	}
	f, ok := estimateForecast(samples, forecastLookback(window))
	if !ok {
		return nil, false
	}
	return &weirv1.Forecast{Window: window, BurnPerHour: f.burnPerHour, ExhaustsAt: timestampOrNil(f.exhaustsAt)}, true
}
