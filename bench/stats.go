package bench

import (
	"math"
	"slices"
	"time"
)

// Summary is a latency distribution reduced to what the report shows.
type Summary struct {
	N    int           `json:"n"`
	P50  time.Duration `json:"p50_ns"`
	P90  time.Duration `json:"p90_ns"`
	P99  time.Duration `json:"p99_ns"`
	Max  time.Duration `json:"max_ns"`
	Mean time.Duration `json:"mean_ns"`
}

// summarize sorts ds in place and reduces it.
func summarize(ds []time.Duration) Summary {
	if len(ds) == 0 {
		return Summary{}
	}
	slices.Sort(ds)
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return Summary{
		N:    len(ds),
		P50:  percentile(ds, 50),
		P90:  percentile(ds, 90),
		P99:  percentile(ds, 99),
		Max:  ds[len(ds)-1],
		Mean: sum / time.Duration(len(ds)),
	}
}

// percentile is the nearest-rank percentile of sorted: the smallest value
// with at least p% of the values at or below it.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// Added is what one target adds over another at the same percentiles: a
// difference of percentiles, not a percentile of per-request differences
// (the two runs serve different requests).
type Added struct {
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

func added(over, base Summary) Added {
	return Added{P50: over.P50 - base.P50, P99: over.P99 - base.P99, Max: over.Max - base.Max}
}

// sustained is the highest of rates (ascending) up to which every step
// passed ok: a rate counts only if every lower rate passed too. 0 means
// none did.
func sustained(rates []int, ok func(i int) bool) int {
	best := 0
	for i, r := range rates {
		if !ok(i) {
			break
		}
		best = r
	}
	return best
}
