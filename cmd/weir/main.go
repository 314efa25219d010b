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
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"

	"github.com/weirhq/weir/bench"
	"github.com/weirhq/weir/internal/bytesize"
	"github.com/weirhq/weir/internal/chaos"
	"github.com/weirhq/weir/internal/gcfloor"
)

func main() {
	// weir bench re-executes this binary as its worker processes.
	bench.ServeChild()
	// weir chaos re-executes it as its control planes, workers and simulator.
	chaos.ServeChild()
	steadySysmon()
	floor, err := gcFloor(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "weir:", err)
		os.Exit(2)
	}
	gcfloor.Start(floor)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	stopProfile := cpuProfile(os.Getenv("WEIR_CPU_PROFILE"))
	err = run(ctx, os.Args[1:], env{getenv: os.Getenv, stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr})
	stopProfile()
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) && !errors.Is(err, errUsageShown) {
			fmt.Fprintln(os.Stderr, err) // prefixed once, by run
		}
		os.Exit(exitCode(err))
	}
}

// defaultGCFloor is the heap below which the garbage collector does not
// run (internal/gcfloor): a process's RSS may reach about this much
// before its first collection, and it saves a data plane at a few hundred
// requests a second most of the collector's CPU.
const defaultGCFloor = 64 << 20

// gcFloor is the heap floor WEIR_GC_HEAP_FLOOR asks for (0: none), or
// none when GOGC is set: an operator who set the runtime's own knob has
// chosen the pacing.
func gcFloor(getenv func(string) string) (uint64, error) {
	if getenv("GOGC") != "" {
		return 0, nil
	}
	v := getenv("WEIR_GC_HEAP_FLOOR")
	if v == "" {
		return defaultGCFloor, nil
	}
	n, err := bytesize.Parse(v)
	if err != nil {
		return 0, fmt.Errorf("WEIR_GC_HEAP_FLOOR=%q: %w", v, err)
	}
	return uint64(n), nil
}

// cpuProfile writes a CPU profile of the whole process to path (when it
// is set; %p in it is the process id, so that processes sharing the
// variable write files of their own) until the function it returns is
// called: what a process spends, as it runs in production, for go tool
// pprof.
func cpuProfile(path string) (stop func()) {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(strings.ReplaceAll(path, "%p", strconv.Itoa(os.Getpid())))
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "weir: WEIR_CPU_PROFILE:", err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
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

// command is one of the binary's commands: its usage line comes from
// here, and so does its dispatch, so the two cannot disagree.
type command struct {
	name string
	// synopsis is what follows the name in the usage (its subcommands or
	// main flags); summary says what it does.
	synopsis, summary string
	run               func(context.Context, []string, env) error
	// operator: an operator command (the second block of the usage).
	operator bool
	// serves: it serves requests, and runs with Go's monitor thread at a
	// steady poll (sysmon.go).
	serves bool
}

// commands are every command, in the usage's order.
var commands = []command{
	{name: "dev", synopsis: "[--simulate] [--data-dir DIR]", summary: "everything in one process on an embedded Postgres", run: runDev, serves: true},
	{name: "controlplane", summary: "run a control-plane replica (Connect RPC + River jobs)", run: runControlPlane, serves: true},
	{name: "dataplane", summary: "run a data-plane worker (the agents' endpoint)", run: runDataPlane, serves: true},
	{name: "migrate", summary: "apply database migrations and exit", run: runMigrate},
	{name: "secrets", synopsis: "rotate [--dry-run]", summary: "re-seal credentials under the current WEIR_SECRET_KEY", run: runSecrets},
	{name: "sim", synopsis: "[--listen ADDR] [--script F]", summary: "run the upstream simulator", run: runSim},
	{name: "health", synopsis: "URL", summary: "exit 0 when URL answers 2xx (container health checks)", run: runHealth},
	{name: "bench", synopsis: "[apart] [--rates R,R] [--duration D]", summary: "load harness: weir against a bare proxy, apart: each in processes of its own (docs/performance.md)", run: runBench},
	{name: "soak", synopsis: "[--duration 10m] [--rate 100]", summary: "bounded soak under mixed traffic and storms: do goroutines, FDs, memory, leases grow?", run: runSoak},
	{name: "holds", synopsis: "[--runs N] [--storm 20s] [--recovery 15s]", summary: "hold scenarios against a running weir dev --simulate: how long turns wait", run: runHolds},
	{name: "chaos", synopsis: "[--seeds 1-100] [--duration 15s]", summary: "seeded fault runs (kills, pauses, cuts, upstream faults), invariants checked", run: runChaos},

	{name: "status", summary: "the pool at a glance, and what is wrong", run: runStatus, operator: true},
	{name: "accounts", synopsis: "add|import|set|list|get|pause|resume|rm|usage|grants|claim-grant", summary: "manage upstream accounts", run: runAccounts, operator: true},
	{name: "login", synopsis: "claude|codex", summary: "sign in to an account and add it to the pool", run: runLogin, operator: true},
	{name: "keys", synopsis: "create|update|list|revoke", summary: "manage client API keys", run: runKeys, operator: true},
	{name: "teams", synopsis: "create|update|list|rm", summary: "teams of keys and their budgets", run: runTeams, operator: true},
	{name: "routes", synopsis: "[--limit N] [--held | --refusals]", summary: "recent requests and where they went, the ones held now, or the refused ones' counts", run: runRoutes, operator: true},
	{name: "usage", synopsis: "[--by key|account|model|session|day] [--since D] [--cache]", summary: "who used what: tokens, cache hits and cost per key, account, model, session and day", run: runUsage, operator: true},
	{name: "prices", synopsis: "list|set|rm", summary: "the prices usage is counted at (a dated table, an operator's over it)", run: runPrices, operator: true},
	{name: "explain", synopsis: "REQUEST_ID", summary: "one request's attempts and holds", run: runExplain, operator: true},
	{name: "settings", synopsis: "get|set|history [KEY=VALUE ...]", summary: "runtime settings: holds, deadline, quota answers, metered accounts, body buffer", run: runSettings, operator: true},
	{name: "aliases", synopsis: "list|set|rm", summary: "model aliases (an alias → concrete models)", run: runAliases, operator: true},
	{name: "integrity", summary: "the integrity check's last report", run: runIntegrity, operator: true},
	{name: "audit", synopsis: "[--since D] [--actor A]", summary: "who changed what, newest first (admin calls)", run: runAudit, operator: true},
	{name: "notify", synopsis: "add|list|test|remove", summary: "webhook and Slack notifications: targets, deliveries, a test", run: runNotify, operator: true},
}

// usage is the binary's usage text, made from commands.
var usage = func() string {
	var b strings.Builder
	b.WriteString("weir pools LLM accounts behind one endpoint for coding agents.\n\nUsage:\n")
	width := 0
	for _, c := range commands {
		width = max(width, len(c.name)+1+len(c.synopsis))
	}
	width = min(width, 44) // a longer synopsis pushes its summary on
	operator := false
	for _, c := range commands {
		if c.operator && !operator {
			operator = true
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "  weir %-*s  %s\n", width, strings.TrimSpace(c.name+" "+c.synopsis), c.summary)
	}
	b.WriteString(`
Operator commands reach the control plane at --controlplane / WEIR_CONTROLPLANE_URL
with WEIR_ADMIN_TOKEN; next to a running 'weir dev' they need neither.
Run 'weir COMMAND -h' for a command's flags.
`)
	return b.String()
}()

// prefixed is a command's error as it is printed: "weir NAME: …" once,
// whether the command named itself ("weir settings set: …") or not.
func prefixed(name string, err error) error {
	if err == nil || errors.Is(err, flag.ErrHelp) || errors.Is(err, errUsageShown) {
		return err
	}
	if strings.HasPrefix(err.Error(), "weir "+name) {
		return err
	}
	return fmt.Errorf("weir %s: %w", name, err)
}

func run(ctx context.Context, args []string, e env) error {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, usage)
		return errUsageShown
	}
	cmd, rest := args[0], args[1:]
	for _, c := range commands {
		if c.name == cmd {
			return prefixed(c.name, c.run(ctx, rest, e))
		}
	}
	if cmd == "help" || cmd == "-h" || cmd == "--help" {
		fmt.Fprint(e.stdout, usage)
		return nil
	}
	fmt.Fprintf(e.stderr, "weir: unknown command %q\n\n%s", cmd, usage)
	return errUsageShown
}
