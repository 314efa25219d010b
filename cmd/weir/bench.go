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
		b, err := os.ReadFile(filepath.Join(*from, "results.json"))
		if err != nil {
			return fmt.Errorf("weir bench: %w", err)
		}
		var old struct{ Results *bench.Results }
		if err := json.Unmarshal(b, &old); err != nil || old.Results == nil {
			return fmt.Errorf("weir bench: %s/results.json is not a weir bench report", *from)
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
