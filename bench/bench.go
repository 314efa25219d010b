package bench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"time"
)

// Step is one target at one rate, as measured.
type Step struct {
	SimLatency time.Duration `json:"sim_latency_ns"`
	Target     string        `json:"target"`
	Rate       int           `json:"rate"`
	Stream     bool          `json:"stream"`
	stepLoad
	// CPUPerRequest is this process's CPU over the step divided by Sent;
	// PGCPUPerRequest the same for its child processes (Postgres).
	CPUPerRequest   time.Duration `json:"cpu_per_request_ns"`
	PGCPUPerRequest time.Duration `json:"pg_cpu_per_request_ns"`
	// Acquire and Release are the LeaseService calls as the data plane
	// timed them (weir only).
	Acquire Summary `json:"acquire,omitzero"`
	Release Summary `json:"release,omitzero"`
	// ReleaseBatch is the batched settlement of successes (lease fast
	// path); its N against Sent is the batching.
	ReleaseBatch Summary `json:"release_batch,omitzero"`
}

// stepLoad is what one step's load generator measured, in either mode.
type stepLoad struct {
	// Sent counts every request fired, warm-up included; Measured those
	// due after the warm-up, of which Errors failed (transport error,
	// non-200, a stream cut short, or dropped past maxInFlight).
	Sent     int   `json:"sent"`
	Measured int   `json:"measured"`
	Errors   int64 `json:"errors"`
	// FirstError says why the first failed request failed.
	FirstError string `json:"first_error,omitempty"`
	// Latency is the whole response from its due time; streams also
	// have TTFB (first content_block_delta from the due time) and Gap
	// (each inter-delta gap minus the simulator's pace).
	Latency Summary `json:"latency"`
	TTFB    Summary `json:"ttfb,omitzero"`
	Gap     Summary `json:"gap,omitzero"`
}

// ok says the step kept up: at most 0.1% of its requests failed.
func (s stepLoad) ok() bool { return s.Measured > 0 && s.Errors*1000 <= int64(s.Measured) }

// Results is one run.
type Results struct {
	Started    time.Time     `json:"started"`
	Elapsed    time.Duration `json:"elapsed_ns"`
	GoVersion  string        `json:"go_version"`
	GOMAXPROCS int           `json:"gomaxprocs"`
	Config     struct {
		Rates         []int           `json:"rates"`
		Duration      time.Duration   `json:"duration_ns"`
		Warmup        time.Duration   `json:"warmup_ns"`
		SimLatencies  []time.Duration `json:"sim_latencies_ns"`
		StreamRate    int             `json:"stream_rate"`
		Streams       []int           `json:"streams"`
		Seed          uint64          `json:"seed"`
		NoLeaseReuse  bool            `json:"no_lease_reuse,omitempty"`
		NoTranslation bool            `json:"no_translation,omitempty"`
	} `json:"config"`
	Steps []Step       `json:"steps"`
	Idle  []IdleResult `json:"idle_streams"`
	// StreamsCapped lists idle-stream counts asked for and what the
	// open-file limit allowed instead.
	StreamsCapped [][2]int `json:"streams_capped,omitempty"`
	// FileLimit is RLIMIT_NOFILE during the run.
	FileLimit uint64 `json:"file_limit"`
	// Profile describes the profiled step, if any.
	Profile string `json:"profile,omitempty"`
	// Storm is the capacity-storm step, if it ran.
	Storm *StormResult `json:"storm,omitempty"`
}

// fdsPerStream and fdReserve size the open-file limit the idle-stream
// test needs: four descriptors a proxied stream, and room for the rest.
const (
	fdsPerStream = 4
	fdReserve    = 2048
)

// targetNames is the order every step runs its targets in, at each rate:
// interleaved, so drift on a shared machine hits all three alike.
var targetNames = []string{"direct", "bare", "weir"}

// Run runs the whole benchmark.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	res := &Results{Started: time.Now().UTC(), GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0)}
	res.Config.Rates, res.Config.Duration, res.Config.Warmup = cfg.Rates, cfg.Duration, cfg.Warmup
	res.Config.SimLatencies, res.Config.StreamRate, res.Config.Streams, res.Config.Seed = cfg.SimLatencies, cfg.StreamRate, cfg.Streams, cfg.Seed
	res.Config.NoLeaseReuse, res.Config.NoTranslation = cfg.NoLeaseReuse, cfg.NoTranslation
	fds := uint64(16384)
	if len(cfg.Streams) > 0 {
		fds = max(fds, uint64(slices.Max(cfg.Streams))*fdsPerStream+fdReserve)
	}
	got, err := raiseFileLimit(fds)
	if err != nil {
		return nil, fmt.Errorf("open-file limit: %w", err)
	}
	res.FileLimit = got
	cfg.asked = slices.Clone(cfg.Streams)
	// A stream through a proxy holds four descriptors in this one process
	// (client, proxy's accepted and dialled connections, simulator).
	if limit := int(got-fdReserve) / fdsPerStream; got < fds {
		for i, n := range cfg.Streams {
			if n > limit {
				res.StreamsCapped = append(res.StreamsCapped, [2]int{n, limit})
				cfg.Streams[i] = limit
			}
		}
		log.Warn("bench: open-file limit caps the idle streams", "want", fds, "limit", got, "streams", limit)
	}
	for li, lat := range cfg.SimLatencies {
		if err := runLatency(ctx, cfg, res, lat, li == 0); err != nil {
			return res, err
		}
	}
	if cfg.Storm > 0 {
		if err := runStorm(ctx, cfg, res); err != nil {
			return res, err
		}
	}
	res.Elapsed = time.Since(res.Started)
	return res, nil
}

// runLatency runs every step at one simulator latency on a fresh stack.
func runLatency(ctx context.Context, cfg Config, res *Results, lat time.Duration, first bool) error {
	log := cfg.Logger
	log.Info("bench: starting stack", "sim_latency", lat)
	st, err := startStack(ctx, cfg.options(lat))
	if err != nil {
		return fmt.Errorf("start stack: %w", err)
	}
	defer st.stop()
	ts := st.targets()
	clients := map[string]*http.Client{}
	for _, t := range ts {
		clients[t.name] = loadClient()
		defer clients[t.name].CloseIdleConnections()
	}
	step := func(t target, rate int, stream bool) error {
		// Connections left from an overloaded step would hold thousands
		// of descriptors (both ends are in this process).
		defer clients[t.name].CloseIdleConnections()
		s := runStep(ctx, st, clients[t.name], t, cfg, rate, stream)
		s.SimLatency = lat
		res.Steps = append(res.Steps, s)
		log.Info("bench: step", "sim_latency", lat, "target", t.name, "rate", rate, "stream", stream,
			"p50", s.Latency.P50, "p99", s.Latency.P99, "errors", s.Errors, "first_error", s.FirstError, "cpu_per_request", s.CPUPerRequest)
		return ctx.Err()
	}
	for _, rate := range cfg.Rates {
		for _, t := range ts {
			if err := step(t, rate, false); err != nil {
				return err
			}
		}
	}
	if cfg.StreamRate > 0 {
		for _, t := range ts {
			if err := step(t, cfg.StreamRate, true); err != nil {
				return err
			}
		}
	}
	if !cfg.NoTranslation {
		// What translation adds: weir onto Chat Completions beside the
		// simulator's Chat Completions reached directly.
		tts := st.translatedTargets()
		for _, t := range tts {
			clients[t.name] = loadClient()
			defer clients[t.name].CloseIdleConnections()
		}
		for _, rate := range cfg.Rates {
			for _, t := range tts {
				if err := step(t, rate, false); err != nil {
					return err
				}
			}
		}
		if cfg.StreamRate > 0 {
			for _, t := range tts {
				if err := step(t, cfg.StreamRate, true); err != nil {
					return err
				}
			}
		}
	}
	if !first {
		return nil
	}
	for _, n := range cfg.Streams {
		for _, t := range ts {
			r, err := idleStreams(ctx, t, n, selfMeter{})
			if err != nil {
				return fmt.Errorf("idle streams: %w", err)
			}
			res.Idle = append(res.Idle, r)
			log.Info("bench: idle streams", "target", t.name, "n", n, "opened", r.Opened, "rss_growth", r.RSSGrowth, "peak_growth", r.PeakGrowth)
		}
	}
	if cfg.Workers && len(cfg.asked) > 0 {
		if err := workerIdleStreams(ctx, cfg, st, res); err != nil {
			return fmt.Errorf("idle streams through worker processes: %w", err)
		}
	}
	if cfg.CPUProfile != "" {
		if err := profileStep(ctx, st, clients["weir"], ts[2], cfg); err != nil {
			return err
		}
		res.Profile = fmt.Sprintf("weir only, non-streaming, %d req/s for %v, sim latency %v", cfg.ProfileRate, cfg.Warmup+cfg.Duration, lat)
	}
	return nil
}

func runStep(ctx context.Context, st *stack, c *http.Client, t target, cfg Config, rate int, stream bool) Step {
	quiesce(ctx)
	st.rpc.take()
	before := readCPU()
	s := drive(ctx, realClock{}, c, t, rate, cfg.Warmup, cfg.Duration, stream, cfg.Seed)
	quiesce(ctx)
	cpu := readCPU().sub(before)
	rpc := st.rpc.take()
	out := Step{Target: t.name, Rate: rate, Stream: stream, stepLoad: s.load()}
	if s.Sent > 0 {
		out.CPUPerRequest = cpu.self / time.Duration(s.Sent)
		out.PGCPUPerRequest = cpu.children / time.Duration(s.Sent)
	}
	if t.url == st.dpURL { // through weir, translated or not
		out.Acquire, out.Release = summarize(rpc["Acquire"]), summarize(rpc["Release"])
		out.ReleaseBatch = summarize(rpc["ReleaseBatch"])
	}
	return out
}

// profileStep profiles weir alone at cfg.ProfileRate.
func profileStep(ctx context.Context, st *stack, c *http.Client, t target, cfg Config) error {
	f, err := os.Create(cfg.CPUProfile)
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	defer f.Close()
	if err := pprof.StartCPUProfile(f); err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	drive(ctx, realClock{}, c, t, cfg.ProfileRate, cfg.Warmup, cfg.Duration, false, cfg.Seed)
	pprof.StopCPUProfile()
	return f.Close()
}

// runStorm runs the capacity storm on a stack of its own: on the one the
// steps used, Postgres and the control plane were still ending the idle
// streams' thousands of leases (and vacuuming after them) well into the
// storm's window, and that work was counted as the storm's.
func runStorm(ctx context.Context, cfg Config, res *Results) error {
	st, err := startStack(ctx, cfg.options(cfg.SimLatencies[0]))
	if err != nil {
		return fmt.Errorf("start stack: %w", err)
	}
	defer st.stop()
	r, err := storm(ctx, st, st.targets()[2], cfg.Storm, cfg.StormWindow)
	if err != nil {
		return fmt.Errorf("storm: %w", err)
	}
	res.Storm = &r
	cfg.Logger.Info("bench: storm", "n", r.N, "held", r.Held, "core_percent", r.CorePercent(), "upstream_attempts", r.UpstreamAttempts)
	return nil
}

// workerIdleStreams opens the idle streams through the bare proxy and a
// weir worker each running in a child process, and reads the child's RSS.
func workerIdleStreams(ctx context.Context, cfg Config, st *stack, res *Results) error {
	roles := []struct {
		name string
		env  []string
	}{
		{"bare", []string{"WEIR_BENCH_UPSTREAM=" + st.simURL}},
		{"weir", []string{"WEIR_CONTROLPLANE_URL=" + st.cpURL, "WEIR_DATAPLANE_TOKEN=" + st.dpToken}},
	}
	for _, role := range roles {
		c, err := startChild(ctx, role.name, role.env...)
		if err != nil {
			return err
		}
		t := target{name: role.name, url: c.URL, key: st.key}
		for _, n := range cfg.asked {
			r, err := idleStreams(ctx, t, n, c)
			if err != nil {
				c.stop()
				return err
			}
			r.Process = "worker"
			res.Idle = append(res.Idle, r)
			cfg.Logger.Info("bench: idle streams", "target", role.name, "process", "worker", "n", n, "opened", r.Opened,
				"rss_growth", r.RSSGrowth, "peak_growth", r.PeakGrowth, "heap_growth", r.HeapGrowth, "stack_growth", r.StackGrowth,
				"goroutine_growth", r.GoroutineGrowth)
		}
		c.stop()
	}
	return nil
}
