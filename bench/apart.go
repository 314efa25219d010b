package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// The apart mode (`weir bench apart`) measures weir as users run it: the
// simulator, each target and the load generator are processes of their
// own, and a target's CPU is its whole process tree's, read from /proc.
// The in-process bench (Run) shares one process between all of them and
// bills CPU by difference; it cannot put another gateway beside weir.

// Apart target names; a peer's is its own.
const (
	targetBare       = "bare"
	targetBareSteady = "bare-steady"
	targetWeirDev    = "weir-dev"
	targetWeirSplit  = "weir-split"
)

// apartTargets are the built-in targets, in the order every rate runs them.
var apartTargets = []string{targetBare, targetBareSteady, targetWeirDev, targetWeirSplit}

// ApartConfig is one `weir bench apart` run. Zero values take the
// defaults noted.
type ApartConfig struct {
	// Rates are the non-streaming request rates, each a step per target.
	// Default 200 and 1000.
	Rates []int
	// Duration is how long each step is measured; Warmup runs before it
	// and is left out of its latencies (not of its CPU). Default 10s, and
	// 2s or a fifth of Duration if less.
	Duration, Warmup time.Duration
	// StreamRate is the streaming step's rate. Default 100; negative skips.
	StreamRate int
	// Seed picks each stream's shape. Default 1.
	Seed uint64
	// Targets are the built-in targets run: bare, weir-dev, weir-split.
	// Default all three.
	Targets []string
	// Peers are other gateways run beside them.
	Peers []Peer
	// Accounts is how many API-key accounts weir serves from (each
	// accountCap concurrent). Default 8.
	Accounts int
	// Binary is the weir binary run as the simulator and the weir targets.
	// Default: this executable. The bare proxy and the load generator are
	// always this executable re-executed (it must call ServeChild first).
	Binary string
	// Env is added to the environment of every process run from Binary.
	Env []string
	// SimAddr is the simulator's listen address (a peer whose config
	// names it needs it fixed). Default: a free loopback port.
	SimAddr string
	// LogDir receives each process's output and the data directories.
	// Default: a temporary directory, removed after the run.
	LogDir string
	// Logger reports progress. Default: discard.
	Logger *slog.Logger
}

// Peer is another gateway measured beside weir.
type Peer struct {
	// Name labels it in the report.
	Name string `json:"name"`
	// Cmd starts it: the program, then its arguments; {sim} in any is the
	// simulator's URL.
	Cmd []string `json:"cmd"`
	// URL is where it serves /v1/messages; the harness waits for it to
	// answer before the first step.
	URL string `json:"url"`
	// Header is how a client authenticates to it; empty: x-api-key.
	Header http.Header `json:"-"`
}

// peerKeys are the fields of a peer spec.
var peerKeys = []string{"name", "cmd", "url", "header"}

// ParsePeer reads a peer spec: comma-separated key=value fields name,
// cmd (split on spaces), url and header ("Name: value", repeatable). A
// comma not followed by one of those keys belongs to the value before it.
func ParsePeer(spec string) (Peer, error) {
	var fields [][2]string
	for _, seg := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(seg, "=")
		if ok && slices.Contains(peerKeys, strings.TrimSpace(k)) {
			fields = append(fields, [2]string{strings.TrimSpace(k), v})
			continue
		}
		if len(fields) == 0 {
			return Peer{}, fmt.Errorf("peer %q: want name=…,cmd=…,url=…[,header=…]", spec)
		}
		fields[len(fields)-1][1] += "," + seg
	}
	var p Peer
	for _, f := range fields {
		switch v := strings.TrimSpace(f[1]); f[0] {
		case "name":
			p.Name = v
		case "cmd":
			p.Cmd = strings.Fields(v)
		case "url":
			p.URL = v
		case "header":
			k, hv, ok := strings.Cut(v, ":")
			if !ok || strings.TrimSpace(k) == "" {
				return Peer{}, fmt.Errorf("peer %q: header %q is not Name: value", p.Name, v)
			}
			if p.Header == nil {
				p.Header = http.Header{}
			}
			p.Header.Add(strings.TrimSpace(k), strings.TrimSpace(hv))
		}
	}
	switch {
	case p.Name == "" || len(p.Cmd) == 0 || p.URL == "":
		return Peer{}, fmt.Errorf("peer %q: name, cmd and url are required", spec)
	case slices.Contains(apartTargets, p.Name):
		return Peer{}, fmt.Errorf("peer %q: the name is a built-in target's", p.Name)
	case !strings.HasPrefix(p.URL, "http://") && !strings.HasPrefix(p.URL, "https://"):
		return Peer{}, fmt.Errorf("peer %q: url %q is not http(s)", p.Name, p.URL)
	}
	return p, nil
}

// Validate names the first bad field.
func (c ApartConfig) Validate() error {
	var errs []error
	for _, r := range c.Rates {
		if r <= 0 || r > 100_000 {
			errs = append(errs, fmt.Errorf("bench: Rates: %d is not in 1..100000", r))
		}
	}
	if c.Duration < 0 || c.Warmup < 0 || c.Accounts < 0 {
		errs = append(errs, errors.New("bench: Duration, Warmup and Accounts must not be negative"))
	}
	for _, t := range c.Targets {
		if !slices.Contains(apartTargets, t) {
			errs = append(errs, fmt.Errorf("bench: Targets: %q is not one of %s", t, strings.Join(apartTargets, ", ")))
		}
	}
	names := map[string]bool{}
	for _, p := range c.Peers {
		if names[p.Name] {
			errs = append(errs, fmt.Errorf("bench: Peers: %q twice", p.Name))
		}
		names[p.Name] = true
	}
	return errors.Join(errs...)
}

func (c *ApartConfig) setDefaults() error {
	if len(c.Rates) == 0 {
		c.Rates = []int{200, 1000}
	}
	c.Rates = slices.Sorted(slices.Values(c.Rates))
	if c.Duration == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Warmup == 0 {
		c.Warmup = min(2*time.Second, c.Duration/5)
	}
	if c.StreamRate == 0 {
		c.StreamRate = 100
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if len(c.Targets) == 0 && len(c.Peers) == 0 {
		c.Targets = apartTargets
	}
	// Built-ins in their fixed order, whatever order they were asked in.
	c.Targets = slices.DeleteFunc(slices.Clone(apartTargets), func(t string) bool { return !slices.Contains(c.Targets, t) })
	if c.Accounts == 0 {
		c.Accounts = accountCount
	}
	if c.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		c.Binary = exe
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// ApartStep is one target at one rate.
type ApartStep struct {
	Target string `json:"target"`
	Rate   int    `json:"rate"`
	Stream bool   `json:"stream"`
	stepLoad
	// Served counts the requests answered in full, warm-up included.
	Served int `json:"served"`
	// CPU is the target's whole process tree over the step (warm-up and
	// the wait for idle after it included); CPUPerRequest that over Served.
	CPU           time.Duration `json:"cpu_ns"`
	CPUPerRequest time.Duration `json:"cpu_per_request_ns"`
	// Parts splits CPUPerRequest by process (weir-dev: weir, postgres;
	// weir-split: dataplane, controlplane, postgres).
	Parts map[string]time.Duration `json:"cpu_per_request_parts_ns,omitempty"`
	// The generator's and the simulator's CPU per request served: not
	// billed to the target, reported so they can be compared.
	GeneratorCPUPerRequest time.Duration `json:"generator_cpu_per_request_ns"`
	SimCPUPerRequest       time.Duration `json:"sim_cpu_per_request_ns"`
	// For a target whose Postgres the harness started (weir-split): the
	// transactions that wrote and the WAL bytes written, per request
	// served, over the same span as CPU.
	WriteXactsPerRequest float64 `json:"write_xacts_per_request,omitempty"`
	WALBytesPerRequest   float64 `json:"wal_bytes_per_request,omitempty"`
}

// ApartResults is one apart run.
type ApartResults struct {
	Started   time.Time     `json:"started"`
	Elapsed   time.Duration `json:"elapsed_ns"`
	GoVersion string        `json:"go_version"`
	NumCPU    int           `json:"num_cpu"`
	// LoadBefore and LoadAfter are /proc/loadavg at the start and end: what
	// else the machine was doing.
	LoadBefore string `json:"load_before"`
	LoadAfter  string `json:"load_after"`
	Config     struct {
		Rates      []int         `json:"rates"`
		Duration   time.Duration `json:"duration_ns"`
		Warmup     time.Duration `json:"warmup_ns"`
		StreamRate int           `json:"stream_rate"`
		Seed       uint64        `json:"seed"`
		Accounts   int           `json:"accounts"`
		Targets    []string      `json:"targets"`
		Peers      []Peer        `json:"peers,omitempty"`
	} `json:"config"`
	Steps []ApartStep `json:"steps"`
}

// targetOrder is every target's name in the order the steps ran them.
func (r *ApartResults) targetOrder() []string {
	out := slices.Clone(r.Config.Targets)
	for _, p := range r.Config.Peers {
		out = append(out, p.Name)
	}
	return out
}

// loadAvg is the 1, 5 and 15 minute load averages.
func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

// RunApart runs the apart mode.
func RunApart(ctx context.Context, cfg ApartConfig) (_ *ApartResults, err error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	res := &ApartResults{Started: time.Now().UTC(), GoVersion: runtime.Version(), NumCPU: runtime.NumCPU(), LoadBefore: loadAvg()}
	c := &res.Config
	c.Rates, c.Duration, c.Warmup, c.StreamRate, c.Seed = cfg.Rates, cfg.Duration, cfg.Warmup, cfg.StreamRate, cfg.Seed
	c.Accounts, c.Targets, c.Peers = cfg.Accounts, cfg.Targets, cfg.Peers
	dir := cfg.LogDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "weir-bench-apart-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir) //nolint:errcheck // a temp dir
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	sim, simURL, err := startSim(ctx, cfg, dir)
	if err != nil {
		return nil, fmt.Errorf("simulator: %w", err)
	}
	defer sim.stop()
	a := apartEnv{cfg: cfg, simURL: simURL, dir: dir}
	var targets []*apartTarget
	defer func() {
		for i := len(targets) - 1; i >= 0; i-- {
			targets[i].stop()
		}
	}()
	start := map[string]func(context.Context, apartEnv) (*apartTarget, error){
		targetBare: startBare, targetBareSteady: startBareSteady, targetWeirDev: startWeirDev, targetWeirSplit: startWeirSplit,
	}
	for _, name := range cfg.Targets {
		log.Info("bench apart: starting", "target", name)
		t, err := start[name](ctx, a)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		targets = append(targets, t)
	}
	for _, p := range cfg.Peers {
		log.Info("bench apart: starting", "target", p.Name)
		t, err := startPeer(ctx, a, p)
		if err != nil {
			return nil, fmt.Errorf("peer %s: %w", p.Name, err)
		}
		targets = append(targets, t)
	}
	step := func(t *apartTarget, rate int, stream bool) error {
		s, err := runApartStep(ctx, cfg, t, sim.pid(), rate, stream)
		if err != nil {
			return fmt.Errorf("%s at %d/s: %w", t.name, rate, err)
		}
		res.Steps = append(res.Steps, s)
		log.Info("bench apart: step", "target", t.name, "rate", rate, "stream", stream, "p50", s.Latency.P50, "p99", s.Latency.P99,
			"errors", s.Errors, "first_error", s.FirstError, "cpu_per_request", s.CPUPerRequest)
		return ctx.Err()
	}
	for _, rate := range cfg.Rates {
		for _, t := range targets {
			if err := step(t, rate, false); err != nil {
				return res, err
			}
		}
	}
	if cfg.StreamRate > 0 {
		for _, t := range targets {
			if err := step(t, cfg.StreamRate, true); err != nil {
				return res, err
			}
		}
	}
	res.Elapsed, res.LoadAfter = time.Since(res.Started), loadAvg()
	return res, nil
}

// runApartStep drives one step from a generator process and reads the
// CPU of the target, the simulator and the generator over it.
func runApartStep(ctx context.Context, cfg ApartConfig, t *apartTarget, simPid, rate int, stream bool) (ApartStep, error) {
	// Everything this process started (targets, Postgres, simulator) idle:
	// one step's leftovers are billed to it, not to the next.
	idle := func() time.Duration { return descendantsCPU(os.Getpid()) }
	quiesceOn(ctx, idle)
	before := readProcTable()
	var wBefore pgWrites
	if t.db != "" {
		var err error
		if wBefore, err = pgWritesAt(ctx, t.db); err != nil {
			return ApartStep{}, err
		}
	}
	lr, err := runLoad(ctx, loadJob{URL: t.url, Key: t.key, Header: t.header, Rate: rate, Warmup: cfg.Warmup, Duration: cfg.Duration,
		Stream: stream, Seed: cfg.Seed})
	if err != nil {
		return ApartStep{}, err
	}
	quiesceOn(ctx, idle)
	after := readProcTable()
	var wAfter pgWrites
	if t.db != "" {
		if wAfter, err = pgWritesAt(ctx, t.db); err != nil {
			return ApartStep{}, err
		}
	}
	s := ApartStep{Target: t.name, Rate: rate, Stream: stream, stepLoad: lr.load(), Served: lr.Served}
	per := func(d time.Duration) time.Duration {
		if s.Served == 0 {
			return 0
		}
		return d / time.Duration(s.Served)
	}
	for _, p := range t.parts {
		d := ticksDuration(p.ticks(after) - p.ticks(before))
		s.CPU += d
		if len(t.parts) > 1 {
			if s.Parts == nil {
				s.Parts = map[string]time.Duration{}
			}
			s.Parts[p.name] = per(d)
		}
	}
	s.CPUPerRequest = per(s.CPU)
	if t.db != "" && s.Served > 0 {
		// Less the reading's own transaction.
		s.WriteXactsPerRequest = float64(wAfter.xacts-wBefore.xacts-1) / float64(s.Served)
		s.WALBytesPerRequest = float64(wAfter.wal-wBefore.wal) / float64(s.Served)
	}
	s.GeneratorCPUPerRequest = per(lr.CPU)
	s.SimCPUPerRequest = per(ticksDuration(after.tree(simPid) - before.tree(simPid)))
	return s, nil
}
