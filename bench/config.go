package bench

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"
)

// Config is one `weir bench` run. Zero values take the defaults noted.
type Config struct {
	// Rates are the non-streaming request rates, per second, each a step.
	// Default 100, 250, 500, 1000, 2000.
	Rates []int
	// Duration is how long each step is measured. Default 10s.
	Duration time.Duration
	// Warmup runs before each step's measurement at the same rate and is
	// left out of it. Default 2s, or a fifth of Duration if less.
	Warmup time.Duration
	// SimLatencies are the simulator's fixed delays before an answer; the
	// whole run repeats for each (with a fresh weir). Default 0 and 50ms.
	SimLatencies []time.Duration
	// StreamRate is the rate of the streaming step (streams of 20–64
	// deltas 10–20 ms apart). Default 100; negative skips streams.
	StreamRate int
	// Streams are the counts of concurrent idle streams whose memory is
	// measured (with the first sim latency only). Default 1000 and 5000;
	// a single 0 skips the test.
	Streams []int
	// Seed picks each stream's shape. Default 1.
	Seed uint64
	// CPUProfile, when set, receives a CPU profile of an extra weir-only
	// non-streaming step at ProfileRate (kept apart from the measured
	// steps, which profiling would slow down).
	CPUProfile string
	// ProfileRate is that step's rate. Default 250.
	ProfileRate int
	// Storm is how many requests the capacity-storm step holds (every
	// account answering 529), with the first sim latency, on a fresh stack
	// after the other steps. Default 2000; negative skips it.
	Storm int
	// StormWindow is how long the storm's cost is measured. Default 10s.
	StormWindow time.Duration
	// NoLeaseReuse turns the worker's lease reuse off (every request asks
	// the control plane): the reference for what the fast path saves.
	NoLeaseReuse bool
	// NoTranslation skips the translation steps: a Messages client on
	// OpenAI accounts through a translating alias, beside the simulator's
	// Chat Completions reached directly (what translation adds).
	NoTranslation bool
	// Workers also measures idle streams through worker children (the
	// bare proxy and a weir data plane, each in a process of its own,
	// re-executing this binary): the binary must call ServeChild first.
	Workers bool
	// Logger reports progress. Default: discard.
	Logger *slog.Logger

	// asked is Streams before the in-process open-file cap; a worker
	// child holds half the descriptors and takes them all.
	asked []int
}

// Validate names the first bad field.
func (c Config) Validate() error {
	var errs []error
	for _, r := range c.Rates {
		if r <= 0 || r > 100_000 {
			errs = append(errs, fmt.Errorf("bench: Rates: %d is not in 1..100000", r))
		}
	}
	if c.Duration < 0 || c.Warmup < 0 {
		errs = append(errs, errors.New("bench: Duration and Warmup must not be negative"))
	}
	for _, l := range c.SimLatencies {
		if l < 0 {
			errs = append(errs, fmt.Errorf("bench: SimLatencies: %v is negative", l))
		}
	}
	for _, n := range c.Streams {
		if n < 0 {
			errs = append(errs, fmt.Errorf("bench: Streams: %d is negative", n))
		}
	}
	if c.ProfileRate < 0 {
		errs = append(errs, errors.New("bench: ProfileRate must not be negative"))
	}
	return errors.Join(errs...)
}

func (c *Config) setDefaults() {
	if len(c.Rates) == 0 {
		c.Rates = []int{100, 250, 500, 1000, 2000}
	}
	c.Rates = slices.Sorted(slices.Values(c.Rates))
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Warmup == 0 {
		c.Warmup = min(2*time.Second, c.Duration/5)
	}
	if len(c.SimLatencies) == 0 {
		c.SimLatencies = []time.Duration{0, 50 * time.Millisecond}
	}
	if c.StreamRate == 0 {
		c.StreamRate = 100
	}
	if len(c.Streams) == 0 {
		c.Streams = []int{1000, 5000}
	}
	c.Streams = slices.DeleteFunc(c.Streams, func(n int) bool { return n == 0 })
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.ProfileRate == 0 {
		c.ProfileRate = 250
	}
	if c.Storm == 0 {
		c.Storm = 2000
	}
	if c.StormWindow == 0 {
		c.StormWindow = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}
