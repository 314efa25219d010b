package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/weirhq/weir/bench"
)

// runHolds runs the hold scenarios (package bench) against a running
// weir dev --simulate, found through its dev.json, and writes the report.
func runHolds(ctx context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("weir holds", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	dataDir := fs.String("data-dir", defaultDataDir(e), "where 'weir dev' keeps dev.json (env WEIR_DATA_DIR)")
	accounts := fs.String("accounts", "demo-api-key,demo-max-1,demo-max-2", "the accounts that serve the model, comma-separated: weir's labels, the simulator's names")
	model := fs.String("model", "claude-sonnet-4-5", "the model every turn asks for")
	agents := fs.Int("agents", 4, "agents running at once")
	turns := fs.Int("turns", 5, "streaming turns per agent, one after another")
	runs := fs.Int("runs", 1, "runs of each scenario")
	storm := fs.Duration("storm", 20*time.Second, "how long the storms of the storm and mixed-pool scenarios last")
	recovery := fs.Duration("recovery", 15*time.Second, "when the partial-recovery scenario's one account recovers")
	timeout := fs.Duration("timeout", 25*time.Minute, "longest a turn may take")
	out := fs.String("out", "", "report file (default: print only)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	d, err := readDevInfo(*dataDir)
	if err != nil {
		return fmt.Errorf("weir holds: read dev.json (is weir dev --simulate running?): %w", err)
	}
	cfg := bench.HoldsConfig{DataplaneURL: d.DataplaneURL, SimulatorURL: d.SimulatorURL, Key: d.ClientKey,
		ControlplaneURL: d.ControlplaneURL, AdminToken: d.AdminToken,
		Accounts: strings.Split(*accounts, ","), Model: *model, Agents: *agents, Turns: *turns, Runs: *runs,
		Storm: *storm, Recovery: *recovery, Timeout: *timeout}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("weir holds: %w", err)
	}
	res, err := bench.RunHolds(ctx, cfg)
	report := bench.HoldsMarkdown(cfg, res)
	fmt.Fprint(e.stdout, report)
	if err != nil {
		return fmt.Errorf("weir holds: %w", err)
	}
	if *out != "" {
		if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
			return fmt.Errorf("weir holds: %w", err)
		}
		return os.WriteFile(*out, []byte(report), 0o644)
	}
	return nil
}
