package main

import (
	"os"
	"slices"
	"strings"
	"syscall"
)

// The Go runtime's monitor thread (sysmon, src/runtime/proc.go) sleeps
// until the next timer while every P is idle, and when a goroutine then
// makes a system call it wakes and starts over from its shortest poll:
// 20 µs, doubling only after a millisecond of finding nothing to do. A
// server whose requests come a few milliseconds apart goes idle and wakes
// on every one, so its monitor polls every 20 µs through each request's
// work; weir's control plane, busy in short bursts (report batches,
// claims), spent over a quarter of its CPU in those polls. The runtime
// keeps the monitor out of that sleep, at its settled 10 ms poll, when
// GODEBUG's schedtrace is set; schedtrace is also the period of a line
// the runtime prints on stderr, counted from the machine's boot, so the
// longest period the variable takes (about 24.8 days) prints one line at
// start on a machine up longer than that, and another every 24.8 days.
// The price is the monitor's steady poll of an idle process, 100 wakes a
// second, which left an idle weir dev's CPU where it was: its own timers
// woke it more often (docs/performance.md).
const sysmonGODEBUG = "schedtrace=2147483647"

// steadySysmonCommands are the commands that serve requests: each
// re-executes itself with sysmonGODEBUG.
var steadySysmonCommands = []string{"dev", "controlplane", "dataplane"}

// sysmonEnv returns the environment a serving command (args[0]) is
// re-executed with so that the runtime's monitor polls steadily, or nil
// when it runs as it is: another command, or a GODEBUG that already names
// schedtrace (GODEBUG=schedtrace=0 keeps the runtime's default).
func sysmonEnv(args, environ []string) []string {
	if len(args) == 0 || !slices.Contains(steadySysmonCommands, args[0]) {
		return nil
	}
	out := make([]string, 0, len(environ)+1)
	found := false
	for _, kv := range environ {
		v, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			out = append(out, kv)
			continue
		}
		for _, setting := range strings.Split(v, ",") {
			if strings.HasPrefix(strings.TrimSpace(setting), "schedtrace=") {
				return nil
			}
		}
		found = true
		if v == "" {
			out = append(out, "GODEBUG="+sysmonGODEBUG)
		} else {
			out = append(out, "GODEBUG="+v+","+sysmonGODEBUG)
		}
	}
	if !found {
		out = append(out, "GODEBUG="+sysmonGODEBUG)
	}
	return out
}

// steadySysmon re-executes a serving command with sysmonEnv's environment.
// It returns only when the process runs as it is: the command needs no
// re-execution, or the executable cannot be found or run again (a binary
// replaced on disk under a running service), which leaves the runtime's
// default.
func steadySysmon() {
	environ := sysmonEnv(os.Args[1:], os.Environ())
	if environ == nil {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	_ = syscall.Exec(exe, os.Args, environ) // returns only on failure
}
