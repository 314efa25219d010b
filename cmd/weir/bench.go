package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/weirhq/weir/bench"
)

// runBench runs the load harness (package bench) and writes its report.
func runBench(ctx context.Context, args []string, e env) error {
	if len(args) > 0 && args[0] == "apart" {
		return runBenchApart(ctx, args[1:], e)
	}
	fs := flag.NewFlagSet("weir bench", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	rates := fs.String("rates", "100,250,500,1000,2000", "non-streaming request rates per second, one step each")
	duration := fs.Duration("duration", 10*time.Second, "measured time per step")
	warmup := fs.Duration("warmup", 0, "unmeasured time before each step (default 2s, or a fifth of --duration if less)")
	simLatency := fs.String("sim-latency", "0,50ms", "the simulator's fixed delays before answering; the run repeats for each")
	streamRate := fs.Int("stream-rate", 100, "rate of the streaming step (0: skip it)")
	streams := fs.String("streams", "1000,5000", "counts of concurrent idle streams whose memory is measured (0: skip)")
	out := fs.String("out", "", "results folder (default bench/results/<timestamp>); latest.md is copied next to it")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of an extra weir-only step here")
	profileRate := fs.Int("profile-rate", 250, "rate of the profiled step")
	seed := fs.Uint64("seed", 1, "seed for the streams' shapes")
	from := fs.String("from", "", "run nothing: rewrite the report of the results folder DIR from its results.json")
	stormN := fs.Int("storm", 2000, "requests held in the capacity-storm step (0: skip it)")
	stormWindow := fs.Duration("storm-window", 10*time.Second, "how long the storm's CPU is measured")
	noReuse := fs.Bool("no-lease-reuse", false, "turn the worker's lease reuse off: the reference for what the fast path saves")
	noTranslation := fs.Bool("no-translation", false, "skip the translation steps (a Messages client on OpenAI accounts, beside Chat Completions direct)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("weir bench: unexpected argument %q", fs.Arg(0))
	}
	if *from != "" {
		var old struct{ Results *bench.Results }
		if err := readResults(*from, &old, func() bool { return old.Results != nil }); err != nil {
			return fmt.Errorf("weir bench: %w", err)
		}
		return writeReport(e, bench.NewReport(old.Results), *from)
	}
	cfg := bench.Config{Duration: *duration, Warmup: *warmup, StreamRate: *streamRate, CPUProfile: *cpuProfile,
		ProfileRate: *profileRate, Seed: *seed, Logger: newLogger(e), NoLeaseReuse: *noReuse, NoTranslation: *noTranslation,
		Workers: true}
	if *streamRate == 0 {
		cfg.StreamRate = -1
	}
	var err error
	if cfg.Rates, err = intList(*rates); err != nil {
		return fmt.Errorf("weir bench: --rates: %w", err)
	}
	if cfg.Streams, err = intList(*streams); err != nil {
		return fmt.Errorf("weir bench: --streams: %w", err)
	}
	if len(cfg.Streams) == 0 {
		cfg.Streams = []int{0}
	}
	for _, s := range strings.Split(*simLatency, ",") {
		s = strings.TrimSpace(s)
		if s == "0" {
			s = "0s"
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("weir bench: --sim-latency: %w", err)
		}
		cfg.SimLatencies = append(cfg.SimLatencies, d)
	}
	cfg.Storm, cfg.StormWindow = *stormN, *stormWindow
	if cfg.Storm == 0 {
		cfg.Storm = -1
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("weir bench: %w", err)
	}
	dir := *out
	if dir == "" {
		dir = filepath.Join("bench", "results", time.Now().UTC().Format("20060102T150405Z"))
	}
	if *cpuProfile != "" {
		if err := os.MkdirAll(filepath.Dir(*cpuProfile), 0o755); err != nil {
			return fmt.Errorf("weir bench: %w", err)
		}
	}
	res, err := bench.Run(ctx, cfg)
	if err != nil {
		return fmt.Errorf("weir bench: %w", err)
	}
	return writeReport(e, bench.NewReport(res), dir)
}

// readResults reads dir/results.json into report; ok says it was one.
func readResults(dir string, report any, ok func() bool) error {
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, report); err != nil || !ok() {
		return fmt.Errorf("%s/results.json is not a report of this mode", dir)
	}
	return nil
}

// peerFlags collect repeated --peer specs.
type peerFlags []bench.Peer

func (p *peerFlags) String() string { return "" }
func (p *peerFlags) Set(s string) error {
	peer, err := bench.ParsePeer(s)
	if err != nil {
		return err
	}
	*p = append(*p, peer)
	return nil
}

// runBenchApart runs the apart mode: the simulator, each target and the
// load generator as processes of their own (docs/performance.md).
func runBenchApart(ctx context.Context, args []string, e env) error {
	return runBenchApartWith(ctx, args, e, nil)
}

// runBenchApartWith is runBenchApart with procEnv added to the environment
// of every weir process (a test binary made to run as weir).
func runBenchApartWith(ctx context.Context, args []string, e env, procEnv []string) error {
	fs := flag.NewFlagSet("weir bench apart", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	rates := fs.String("rates", "200,1000", "non-streaming request rates per second, one step per target each")
	duration := fs.Duration("duration", 10*time.Second, "measured time per step")
	warmup := fs.Duration("warmup", 0, "unmeasured time before each step (default 2s, or a fifth of --duration if less)")
	streamRate := fs.Int("stream-rate", 100, "rate of the streaming step (0: skip it)")
	targets := fs.String("targets", "bare,bare-steady,weir-dev,weir-split", "built-in targets: bare, bare-steady, weir-dev, weir-split (\"\" for peers only)")
	var peers peerFlags
	fs.Var(&peers, "peer", "another gateway beside weir: 'name=N,cmd=PROGRAM ARGS,url=URL[,header=Name: value]'; {sim} in cmd is the simulator's URL (repeatable)")
	accounts := fs.Int("accounts", 8, "API-key accounts weir serves from, 1000 concurrent each")
	binary := fs.String("binary", "", "weir binary run as the simulator and the weir targets (default: this one)")
	simListen := fs.String("sim-listen", "", "the simulator's address, for a peer config that names it (default: a free loopback port)")
	seed := fs.Uint64("seed", 1, "seed for the streams' shapes")
	logDir := fs.String("log-dir", "", "keep each process's log and data directory here (default: a temporary directory, removed)")
	out := fs.String("out", "", "results folder (default bench/results/<timestamp>-apart); latest-apart.md is copied next to it")
	from := fs.String("from", "", "run nothing: rewrite the report of the results folder DIR from its results.json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("weir bench apart: unexpected argument %q", fs.Arg(0))
	}
	if *from != "" {
		var old struct{ Results *bench.ApartResults }
		if err := readResults(*from, &old, func() bool { return old.Results != nil }); err != nil {
			return fmt.Errorf("weir bench apart: %w", err)
		}
		return writeApartReport(e, bench.NewApartReport(old.Results), *from)
	}
	cfg := bench.ApartConfig{Duration: *duration, Warmup: *warmup, StreamRate: *streamRate, Seed: *seed, Peers: peers,
		Accounts: *accounts, Binary: *binary, SimAddr: *simListen, LogDir: *logDir, Logger: newLogger(e), Env: procEnv}
	if *streamRate == 0 {
		cfg.StreamRate = -1
	}
	var err error
	if cfg.Rates, err = intList(*rates); err != nil {
		return fmt.Errorf("weir bench apart: --rates: %w", err)
	}
	for _, t := range strings.Split(*targets, ",") {
		if t = strings.TrimSpace(t); t != "" {
			cfg.Targets = append(cfg.Targets, t)
		}
	}
	if len(cfg.Targets) == 0 && len(peers) == 0 {
		return errors.New("weir bench apart: no targets: name some with --targets or --peer")
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("weir bench apart: %w", err)
	}
	dir := *out
	if dir == "" {
		dir = filepath.Join("bench", "results", time.Now().UTC().Format("20060102T150405Z")+"-apart")
	}
	res, err := bench.RunApart(ctx, cfg)
	if err != nil {
		return fmt.Errorf("weir bench apart: %w", err)
	}
	return writeApartReport(e, bench.NewApartReport(res), dir)
}

// writeApartReport writes the results folder and copies its results.md
// and apart.svg to latest-apart.md and latest-apart.svg next to it.
func writeApartReport(e env, rep *bench.ApartReport, dir string) error {
	if err := rep.WriteFiles(dir); err != nil {
		return fmt.Errorf("weir bench apart: write results: %w", err)
	}
	parent := filepath.Dir(filepath.Clean(dir))
	md := rep.Markdown()
	if err := os.WriteFile(filepath.Join(parent, "latest-apart.md"), []byte(md), 0o644); err != nil {
		return fmt.Errorf("weir bench apart: write latest-apart.md: %w", err)
	}
	if err := os.WriteFile(filepath.Join(parent, "latest-apart.svg"), []byte(rep.SVG()), 0o644); err != nil {
		return fmt.Errorf("weir bench apart: write latest-apart.svg: %w", err)
	}
	fmt.Fprintf(e.stdout, "%s\nresults in %s\n", md, dir)
	return nil
}

// writeReport writes the results folder and copies its results.md and
// latency.svg to latest.md and latest.svg next to it (the README shows
// them).
func writeReport(e env, rep *bench.Report, dir string) error {
	if err := rep.WriteFiles(dir); err != nil {
		return fmt.Errorf("weir bench: write results: %w", err)
	}
	md := rep.Markdown()
	parent := filepath.Dir(filepath.Clean(dir))
	if err := os.WriteFile(filepath.Join(parent, "latest.md"), []byte(md), 0o644); err != nil {
		return fmt.Errorf("weir bench: write latest.md: %w", err)
	}
	if svg, err := os.ReadFile(filepath.Join(dir, "latency.svg")); err == nil {
		if err := os.WriteFile(filepath.Join(parent, "latest.svg"), svg, 0o644); err != nil {
			return fmt.Errorf("weir bench: write latest.svg: %w", err)
		}
	}
	fmt.Fprintf(e.stdout, "%s\nresults in %s\n", md, dir)
	return nil
}

// intList parses "1,2,3"; "0" alone is an empty list.
func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return nil, errors.New("must not be negative")
		}
		if n > 0 {
			out = append(out, n)
		}
	}
	return out, nil
}
