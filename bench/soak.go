package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/weirhq/weir/internal/sim"
)

// The soak (`weir soak`): a whole weir with two workers under mixed,
// moderate traffic for a bounded time, capacity storms and rate limits
// recurring, while the process is sampled for what grows. Everything but
// Postgres runs in this one process (the load generator, the simulator,
// the control plane and both workers), so a leak in any of them shows.

// SoakConfig is one `weir soak` run. Zero values take the defaults noted.
type SoakConfig struct {
	// Duration is how long traffic runs. Default 10m.
	Duration time.Duration
	// Rate is requests per second, all kinds together. Default 100.
	Rate int
	// SampleEvery spaces the samples taken while traffic runs. Default 10s.
	SampleEvery time.Duration
	// StormEvery is the period of the fault schedule: in each period a
	// burst of 429s on one Anthropic account at a quarter, and a capacity
	// storm (every Anthropic account answering 529) from the half for
	// StormLength. Default 1m.
	StormEvery time.Duration
	// StormLength is how long a storm lasts; less than half StormEvery.
	// Default 15s.
	StormLength time.Duration
	// Settle bounds the wait, after the last request ended, for the
	// process to return to its baseline. Default 30s.
	Settle time.Duration
	// Seed picks each request's kind. Default 1.
	Seed uint64
	// Logger reports progress. Default: discard.
	Logger *slog.Logger

	// leak, for tests, runs as each request is fired: a leak the checks
	// must catch.
	leak func()
}

// Validate names the first bad field.
func (c SoakConfig) Validate() error {
	var errs []error
	if c.Duration < 0 || c.SampleEvery < 0 || c.StormEvery < 0 || c.StormLength < 0 || c.Settle < 0 {
		errs = append(errs, errors.New("soak: Duration, SampleEvery, StormEvery, StormLength and Settle must not be negative"))
	}
	if c.Rate < 0 || c.Rate > 10_000 {
		errs = append(errs, fmt.Errorf("soak: Rate %d is not in 1..10000", c.Rate))
	}
	if c.StormEvery > 0 && c.StormLength >= c.StormEvery/2 {
		errs = append(errs, fmt.Errorf("soak: StormLength %v must be less than half of StormEvery %v", c.StormLength, c.StormEvery))
	}
	if c.SampleEvery > 0 && c.Duration > 0 && c.SampleEvery > c.Duration/8 {
		errs = append(errs, fmt.Errorf("soak: SampleEvery %v leaves fewer than 8 samples in Duration %v", c.SampleEvery, c.Duration))
	}
	return errors.Join(errs...)
}

func (c *SoakConfig) setDefaults() {
	if c.Duration == 0 {
		c.Duration = 10 * time.Minute
	}
	if c.Rate == 0 {
		c.Rate = 100
	}
	if c.SampleEvery == 0 {
		c.SampleEvery = 10 * time.Second
	}
	if c.StormEvery == 0 {
		c.StormEvery = time.Minute
	}
	if c.StormLength == 0 {
		c.StormLength = 15 * time.Second
	}
	if c.Settle == 0 {
		c.Settle = 30 * time.Second
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// The soak's pool: the bench's eight Anthropic API-key accounts and two
// OpenAI ones for /v1/responses.
const soakOpenAI = 2

// rateLimitBurst is the 429 burst on one account each period: a few
// answers with retry-after, so the account cools for that long and
// recovers.
var rateLimitBurst = sim.Fault{Kind: sim.FaultRateLimit, Times: 3, RetryAfter: 5}

// SoakResult is one run, as measured.
type SoakResult struct {
	Started    time.Time     `json:"started"`
	Elapsed    time.Duration `json:"elapsed_ns"`
	GoVersion  string        `json:"go_version"`
	GOMAXPROCS int           `json:"gomaxprocs"`
	Config     SoakConfig    `json:"config"`
	// Baseline is the idle process before traffic (after a few priming
	// requests of every kind); Samples are taken under traffic; Settled
	// is the idle process again once every request ended, SettledAfter
	// that.
	Baseline     Sample        `json:"baseline"`
	Samples      []Sample      `json:"samples"`
	Settled      Sample        `json:"settled"`
	SettledAfter time.Duration `json:"settled_after_ns"`
	// Requests counts what the clients saw.
	Requests Tally `json:"requests"`
	// Storms and RateLimits are the faults the schedule set off.
	Storms     []Window `json:"storms"`
	RateLimits int      `json:"rate_limits"`
	// Exercised counts what weir did, from its metrics.
	Exercised []Count `json:"exercised"`
	Checks    []Check `json:"checks"`
}

// Window is a storm's span, from the start of traffic.
type Window struct {
	From time.Duration `json:"from_ns"`
	To   time.Duration `json:"to_ns"`
}

// Count is one named number.
type Count struct {
	Name  string `json:"name"`
	Value int64  `json:"value"`
}

// Failed says which checks failed.
func (r *SoakResult) Failed() []string {
	var out []string
	for _, c := range r.Checks {
		if !c.Pass {
			out = append(out, c.Name)
		}
	}
	return out
}

// RunSoak runs the soak and judges it. An error means the run could not be
// made; failed checks are in the result.
func RunSoak(ctx context.Context, cfg SoakConfig) (*SoakResult, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	res := &SoakResult{Started: time.Now().UTC(), GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0), Config: cfg}
	if _, err := raiseFileLimit(16384); err != nil {
		return nil, fmt.Errorf("open-file limit: %w", err)
	}
	log.Info("soak: starting stack")
	st, err := startStack(ctx, stackOptions{logger: log, openAI: soakOpenAI})
	if err != nil {
		return nil, fmt.Errorf("start stack: %w", err)
	}
	defer st.stop()
	if _, err := st.startWorker(0); err != nil {
		return nil, fmt.Errorf("second worker: %w", err)
	}
	s := newSoak(st, cfg)
	defer s.closeIdle()
	// The sampler's own connection: weir's pool may be busy for seconds
	// in a storm, and a sample must neither wait for it nor take from it.
	if s.pg, err = pgx.Connect(ctx, st.cluster.URL()); err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	defer s.pg.Close(context.Background()) //nolint:errcheck // teardown

	if err := s.prime(ctx); err != nil {
		return res, err
	}
	if res.Baseline, err = s.settle(ctx, nil, cfg.Settle); err != nil {
		return res, err
	}
	log.Info("soak: baseline", "goroutines", res.Baseline.Goroutines, "fds", res.Baseline.FDs, "heap_inuse", res.Baseline.HeapInuse)

	s.start = time.Now()
	tctx, stopTraffic := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Go(func() { s.faults(tctx) })
	bg.Go(func() { res.Samples = s.sampleEvery(tctx) })
	s.traffic(ctx)
	stopTraffic()
	bg.Wait()
	// A storm still on ends with the traffic; its held requests are
	// served, and waited for.
	st.simSrv.Reset()
	s.requests.Wait()
	if err := ctx.Err(); err != nil {
		return res, err
	}
	trafficEnd := time.Now()
	log.Info("soak: traffic done, settling", "requests", s.tally.total())
	if res.Settled, err = s.settle(ctx, &res.Baseline, cfg.Settle); err != nil {
		return res, err
	}
	res.SettledAfter = time.Since(trafficEnd)
	res.Settled.At = time.Since(s.start)

	res.Requests = s.tally.snapshot()
	res.Storms, res.RateLimits = s.storms, s.rateLimits
	res.Exercised = exercised(st, s)
	res.Checks = judge(res)
	res.Elapsed = time.Since(res.Started)
	return res, nil
}

// soak is one run's state.
type soak struct {
	st    *stack
	cfg   SoakConfig
	start time.Time
	// clients reach each worker, one per worker, round robin.
	clients  []*http.Client
	targets  []target
	requests sync.WaitGroup
	tally    *tally
	// pg is the sampler's connection to Postgres.
	pg *pgx.Conn

	mu         sync.Mutex
	storms     []Window
	rateLimits int
}

func newSoak(st *stack, cfg SoakConfig) *soak {
	s := &soak{st: st, cfg: cfg, tally: newTally()}
	for _, w := range st.workers {
		s.clients = append(s.clients, loadClient())
		s.targets = append(s.targets, target{name: "weir", url: w.url, key: st.key})
	}
	return s
}

// closeIdle closes the idle keep-alive connections of the load clients
// and of the workers' upstream clients: a bounded cache (90 s idle
// timeout), not a leak, which would otherwise hide one in the descriptor
// and goroutine counts.
func (s *soak) closeIdle() {
	for _, c := range s.clients {
		c.CloseIdleConnections()
	}
	for _, w := range s.st.workers {
		w.upstream.CloseIdleConnections()
	}
}

// prime sends one request of every kind through every worker, so the
// baseline has what the first requests start once (connections to the
// control plane, caches, the workers' background loops).
func (s *soak) prime(ctx context.Context) error {
	for w := range s.targets {
		for _, k := range requestKinds {
			for session := range 2 {
				if session > 0 && !k.sessions {
					continue
				}
				q := soakRequest{kind: k, session: session, pace: sim.StreamPace{Deltas: 4, Delay: time.Millisecond}}
				if r := s.once(ctx, w, q); r.outcome == outcomeFailed {
					return fmt.Errorf("soak: the stack does not serve %s: %s %s", k.name, r.what, r.detail)
				}
			}
		}
	}
	return nil
}

// traffic fires requests at cfg.Rate for cfg.Duration, open loop, and
// returns once every one was sent (not answered).
func (s *soak) traffic(ctx context.Context) {
	p := newPlan(s.start, s.cfg.Rate, s.cfg.Duration)
	p.run(ctx, realClock{}, func(i int, due time.Time) {
		if s.cfg.leak != nil {
			s.cfg.leak()
		}
		q := pick(s.cfg.Seed, i)
		storm := s.inStorm(due.Sub(s.start))
		if s.tally.inFlight() >= maxInFlight {
			s.tally.add(q, storm, false, failed("dropped", "too many requests in flight"))
			return
		}
		s.tally.begin()
		s.requests.Go(func() {
			s.tally.add(q, storm, true, s.once(ctx, i%len(s.targets), q))
		})
	})
}

// inStorm says whether a request due at d (from the start) met a storm.
func (s *soak) inStorm(d time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.storms {
		if d >= w.From && (w.To == 0 || d < w.To) {
			return true
		}
	}
	return false
}

// faults runs the fault schedule until ctx ends: in every period, a 429
// burst on one Anthropic account (the next one each period) at a quarter,
// and a storm from the half that fits before the traffic ends.
func (s *soak) faults(ctx context.Context) {
	log := s.cfg.Logger
	period, length := s.cfg.StormEvery, s.cfg.StormLength
	var clk realClock
	for k := 0; ; k++ {
		base := time.Duration(k) * period
		if base+period/4 >= s.cfg.Duration || !clk.SleepUntil(ctx, s.start.Add(base+period/4)) {
			return
		}
		name := accountName(k % accountCount)
		if err := s.st.simSrv.AddFaults(name, rateLimitBurst); err != nil {
			log.Warn("soak: rate limit", "err", err)
		}
		s.mu.Lock()
		s.rateLimits++
		s.mu.Unlock()
		log.Info("soak: rate limit burst", "account", name)
		from := base + period/2
		if from+length > s.cfg.Duration || !clk.SleepUntil(ctx, s.start.Add(from)) {
			return
		}
		if err := s.st.overload(); err != nil {
			log.Warn("soak: storm", "err", err)
			return
		}
		s.mu.Lock()
		s.storms = append(s.storms, Window{From: time.Since(s.start)})
		s.mu.Unlock()
		log.Info("soak: storm", "n", len(s.storms))
		ok := clk.SleepUntil(ctx, s.start.Add(from+length))
		// Reset clears the 429 burst too if it is still queued: it had a
		// quarter period to be met.
		s.st.simSrv.Reset()
		s.mu.Lock()
		s.storms[len(s.storms)-1].To = time.Since(s.start)
		s.mu.Unlock()
		if !ok {
			return
		}
	}
}

// sampleEvery samples the process every cfg.SampleEvery until ctx ends.
func (s *soak) sampleEvery(ctx context.Context) []Sample {
	var out []Sample
	tick := time.NewTicker(s.cfg.SampleEvery)
	defer tick.Stop()
	last := s.tally.snapshot()
	cpu, cpuAt := readCPU(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
		at := time.Since(s.start)
		sm, err := s.sample(ctx, true)
		if err != nil {
			if ctx.Err() == nil {
				s.cfg.Logger.Warn("soak: sample", "err", err)
			}
			continue
		}
		sm.At, sm.Storm = at, s.inStorm(at)
		cpu, cpuAt = sm.cpuSince(cpu, cpuAt), time.Now()
		now := s.tally.snapshot()
		sm.OK, sm.Cancelled, sm.Failed = now.OK-last.OK, now.Cancelled-last.Cancelled, now.Failed-last.Failed
		sm.InFlight = s.tally.inFlight()
		last = now
		out = append(out, sm)
		s.cfg.Logger.Info("soak: sample", "at", at.Round(time.Second), "goroutines", sm.Goroutines, "fds", sm.FDs,
			"heap_inuse", sm.HeapInuse, "rss", sm.RSS, "leases", sm.LiveLeases, "in_flight", sm.InFlight,
			"ok", sm.OK, "failed", sm.Failed, "cpu", sm.CPU, "load", sm.Load)
	}
}

// settle waits, up to d, until the idle process is back within the
// checks' margins of base (no base: until no lease is live), and returns
// the full sample taken then. It polls: nothing announces "idle". The
// full sample must be settled too, or the polling goes on: an idle
// process still runs its periodic work (the routing cache's slices, the
// jobs' polls), which may hold a connection at any one instant; a leak
// holds it until the deadline.
func (s *soak) settle(ctx context.Context, base *Sample, d time.Duration) (Sample, error) {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		s.closeIdle()
		sm, err := s.sample(ctx, false)
		if err != nil {
			return sm, err
		}
		if late := time.Now().After(deadline); settled(sm, base) || late {
			s.closeIdle()
			full, err := s.sample(ctx, true)
			if err != nil || settled(full, base) || late {
				return full, err
			}
		}
		select {
		case <-ctx.Done():
			return sm, ctx.Err()
		case <-tick.C:
		}
	}
}
