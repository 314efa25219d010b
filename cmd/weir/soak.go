package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/weirhq/weir/bench"
)

// errSoakFailed means the soak ran and a check failed; the report says
// which.
var errSoakFailed = errors.New("checks failed")

// runSoak runs a bounded soak (package bench) and writes its report.
func runSoak(ctx context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("weir soak", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	duration := fs.Duration("duration", 10*time.Minute, "how long traffic runs")
	rate := fs.Int("rate", 100, "requests per second, all kinds together")
	sample := fs.Duration("sample", 10*time.Second, "time between samples of the process")
	stormEvery := fs.Duration("storm-every", time.Minute, "period of the fault schedule: a 429 burst at a quarter, a capacity storm from the half")
	stormLength := fs.Duration("storm-length", 15*time.Second, "how long each capacity storm lasts (less than half of --storm-every)")
	settle := fs.Duration("settle", 30*time.Second, "longest wait, once traffic ended, for the process to return to its baseline")
	seed := fs.Uint64("seed", 1, "seed for the requests' kinds")
	out := fs.String("out", "", "report file (default bench/results/soak-<UTC timestamp>.md)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("weir soak: unexpected argument %q", fs.Arg(0))
	}
	cfg := bench.SoakConfig{Duration: *duration, Rate: *rate, SampleEvery: *sample, StormEvery: *stormEvery,
		StormLength: *stormLength, Settle: *settle, Seed: *seed, Logger: newLogger(e)}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("weir soak: %w", err)
	}
	path := *out
	if path == "" {
		path = filepath.Join("bench", "results", "soak-"+time.Now().UTC().Format("20060102T150405Z")+".md")
	}
	res, err := bench.RunSoak(ctx, cfg)
	if err != nil {
		return fmt.Errorf("weir soak: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("weir soak: %w", err)
	}
	if err := os.WriteFile(path, []byte(res.Markdown()), 0o644); err != nil {
		return fmt.Errorf("weir soak: write report: %w", err)
	}
	fmt.Fprintf(e.stdout, "%s\nreport in %s\n", res.Summary(), path)
	if failed := res.Failed(); len(failed) > 0 {
		return fmt.Errorf("weir soak: %w: %s (report in %s)", errSoakFailed, strings.Join(failed, "; "), path)
	}
	return nil
}
