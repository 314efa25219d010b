// Command weir is the whole of weir in one binary: the control plane, the
// data plane, the all-in-one `weir dev`, the upstream simulator, and the
// operator commands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/weirhq/weir/bench"
	"github.com/weirhq/weir/internal/chaos"
)

func main() {
	// weir bench re-executes this binary as its worker processes.
	bench.ServeChild()
	// weir chaos re-executes it as its control planes, workers and simulator.
	chaos.ServeChild()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], env{getenv: os.Getenv, stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr})
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) && !errors.Is(err, errUsageShown) {
			fmt.Fprintln(os.Stderr, "weir:", err)
		}
		os.Exit(exitCode(err))
	}
}

// env is the process's outside world, passed in so tests can run commands
// in-process.
type env struct {
	getenv func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// errUsageShown means usage text was already printed.
var errUsageShown = errors.New("usage")

func exitCode(err error) int {
	if errors.Is(err, flag.ErrHelp) || errors.Is(err, errUsageShown) {
		return 2
	}
	return 1
}

const usage = `weir pools LLM accounts behind one endpoint for coding agents.

Usage:
  weir dev [--simulate] [--data-dir DIR]   everything in one process on an embedded Postgres
  weir controlplane                        run a control-plane replica (Connect RPC + River jobs)
  weir dataplane                           run a data-plane worker (the agents' endpoint)
  weir migrate                             apply database migrations and exit
  weir secrets rotate [--dry-run]          re-seal credentials under the current WEIR_SECRET_KEY
  weir sim [--listen ADDR] [--script F]    run the upstream simulator
  weir health URL                          exit 0 when URL answers 2xx (container health checks)
  weir bench [--rates R,R] [--duration D]  load harness: weir against a bare proxy (docs/performance.md)
  weir soak [--duration 10m] [--rate 100]  bounded soak under mixed traffic and storms: do goroutines, FDs, memory, leases grow?
  weir holds [--runs N] [--storm 20s]      hold scenarios against a running weir dev --simulate: how long turns wait
  weir chaos [--seeds 1-100] [--duration 15s]  seeded fault runs (kills, pauses, cuts, upstream faults), invariants checked

  weir status                                  the pool at a glance, and what is wrong
  weir accounts add|import|list|get|pause|resume|rm   manage upstream accounts
  weir login claude|codex                      sign in to an account and add it to the pool
  weir keys create|list|revoke                 manage client API keys
  weir routes [--limit N]                      recent requests and where they went
  weir explain REQUEST_ID                      one request's attempts and holds
  weir settings get|set [KEY=VALUE ...]        capacity_hold, request_deadline
  weir aliases list|set|rm                     model aliases (an alias → concrete models)
  weir integrity                               the integrity check's last report
  weir audit [--since D] [--actor A]           who changed what, newest first (admin calls)

Operator commands reach the control plane at --controlplane / WEIR_CONTROLPLANE_URL
with WEIR_ADMIN_TOKEN; next to a running 'weir dev' they need neither.
Run 'weir COMMAND -h' for a command's flags.
`

func run(ctx context.Context, args []string, e env) error {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, usage)
		return errUsageShown
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "dev":
		return runDev(ctx, rest, e)
	case "controlplane":
		return runControlPlane(ctx, rest, e)
	case "dataplane":
		return runDataPlane(ctx, rest, e)
	case "migrate":
		return runMigrate(ctx, rest, e)
	case "secrets":
		return runSecrets(ctx, rest, e)
	case "sim":
		return runSim(ctx, rest, e)
	case "accounts":
		return runAccounts(ctx, rest, e)
	case "keys":
		return runKeys(ctx, rest, e)
	case "routes":
		return runRoutes(ctx, rest, e)
	case "explain":
		return runExplain(ctx, rest, e)
	case "settings":
		return runSettings(ctx, rest, e)
	case "aliases":
		return runAliases(ctx, rest, e)
	case "integrity":
		return runIntegrity(ctx, rest, e)
	case "audit":
		return runAudit(ctx, rest, e)
	case "login":
		return runLogin(ctx, rest, e)
	case "status":
		return runStatus(ctx, rest, e)
	case "health":
		return runHealth(ctx, rest, e)
	case "bench":
		return runBench(ctx, rest, e)
	case "soak":
		return runSoak(ctx, rest, e)
	case "holds":
		return runHolds(ctx, rest, e)
	case "chaos":
		return runChaos(ctx, rest, e)
	case "help", "-h", "--help":
		fmt.Fprint(e.stdout, usage)
		return nil
	}
	fmt.Fprintf(e.stderr, "weir: unknown command %q\n\n%s", cmd, usage)
	return errUsageShown
}
