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

	"github.com/weirhq/weir/internal/chaos"
)

// errChaosFailed means the run was made and found violations; the report
// lists them.
var errChaosFailed = errors.New("violations found")

// runChaos runs seeded fault runs (package internal/chaos) and writes
// their report.
func runChaos(ctx context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("weir chaos", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	seeds := fs.String("seeds", "1", "seeds to run: 7, 1-100, 1-10,42")
	duration := fs.Duration("duration", 15*time.Second, "how long traffic runs in each seed (faults end 4 s before)")
	clients := fs.Int("clients", 8, "agents looping requests")
	leaseTTL := fs.Duration("lease-ttl", 8*time.Second, "the control planes' lease TTL (pauses stay under a quarter of it)")
	tolerate := fs.Bool("tolerate-known", false, "do not fail on violations classified as known failures (a request whose worker was killed before it could report it: within 250 ms of the request, or while a fault on the control side held its reports up)")
	out := fs.String("out", "", "report file (default bench/results/chaos-<UTC timestamp>.md)")
	logs := fs.String("logs", "", "keep the processes' logs of seeds with violations in this directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("weir chaos: unexpected argument %q", fs.Arg(0))
	}
	list, err := chaos.ParseSeeds(*seeds)
	if err != nil {
		return fmt.Errorf("weir chaos: %w", err)
	}
	if *duration < 8*time.Second {
		return errors.New("weir chaos: --duration must be at least 8s (1 s warm-up, 4 s quiet at the end)")
	}
	path := *out
	if path == "" {
		path = filepath.Join("bench", "results", "chaos-"+time.Now().UTC().Format("20060102T150405Z")+".md")
	}
	log := newLogger(e)
	r, err := chaos.NewRunner(ctx, log)
	if err != nil {
		return fmt.Errorf("weir chaos: start postgres: %w", err)
	}
	defer r.Close()
	rep := &chaos.Report{Command: "weir chaos " + strings.Join(args, " "), Started: time.Now(), Errors: map[uint64]string{}, Tolerate: *tolerate}
	failed := 0
	for _, seed := range list {
		if ctx.Err() != nil {
			break
		}
		res, err := r.Run(ctx, chaos.Config{Seed: seed, Duration: *duration, Clients: *clients, LeaseTTL: *leaseTTL, LogDir: *logs, Logger: log})
		if err != nil {
			rep.Errors[seed] = err.Error()
			fmt.Fprintf(e.stdout, "seed %d: could not run: %v\n", seed, err)
			continue
		}
		rep.Results = append(rep.Results, res)
		fmt.Fprintf(e.stdout, "seed %d: %s\n", seed, res.Summary())
		if v := res.Failed(*tolerate); len(v) > 0 {
			failed++
			fmt.Fprint(e.stdout, res.Timeline)
		}
		// The report so far, so a long run can be read while it goes.
		rep.Elapsed = time.Since(rep.Started)
		if err := writeChaosReport(path, rep.Markdown()); err != nil {
			return err
		}
	}
	rep.Elapsed = time.Since(rep.Started)
	if err := writeChaosReport(path, rep.Markdown()); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%d seeds, %d with violations; report in %s\n", len(rep.Results), failed, path)
	if failed > 0 || len(rep.Errors) > 0 {
		return fmt.Errorf("weir chaos: %w in %d seeds, %d seeds could not run (report in %s)", errChaosFailed, failed, len(rep.Errors), path)
	}
	return nil
}

func writeChaosReport(path, md string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("weir chaos: %w", err)
	}
	if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
		return fmt.Errorf("weir chaos: write report: %w", err)
	}
	return nil
}
