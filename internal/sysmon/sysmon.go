// Package sysmon keeps the Go runtime's monitor thread at a steady poll.
//
// The monitor (sysmon, src/runtime/proc.go in the Go source) sleeps until
// the next timer while every P is idle, and when a goroutine then makes a
// system call it wakes and starts over from its shortest poll: 20 µs,
// doubling only after a millisecond of finding nothing to do. A server
// whose requests come a few milliseconds apart goes idle and wakes on
// every one, so its monitor polls every 20 µs through each request's
// work; weir's control plane, busy in short bursts (report batches,
// claims), spent over a quarter of its CPU in those polls. The runtime
// keeps the monitor out of that sleep, at its settled 10 ms poll, when
// GODEBUG's schedtrace is set. schedtrace is also the period of a line
// the runtime prints on stderr, counted from the machine's boot: the
// longest period it takes (about 24.8 days) prints one line at start on a
// machine up longer than that, and another every 24.8 days. The price is
// the monitor's steady poll of an idle process, 100 wakes a second, which
// left an idle weir dev's CPU where it was: its own timers woke it more
// often (docs/performance.md).
//
// A process reads GODEBUG as it starts, so a process that wants the
// setting re-executes itself with it (Reexec).
package sysmon

import (
	"os"
	"strings"
	"syscall"
)

// Setting is the GODEBUG setting that keeps the monitor at a steady poll.
const Setting = "schedtrace=2147483647"

// Env returns environ with Setting added to its GODEBUG, or nil when
// GODEBUG already names schedtrace (GODEBUG=schedtrace=0 keeps the
// runtime's default): an operator's choice stands.
func Env(environ []string) []string {
	out := make([]string, 0, len(environ)+1)
	found := false
	for _, kv := range environ {
		v, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			out = append(out, kv)
			continue
		}
		for setting := range strings.SplitSeq(v, ",") {
			if strings.HasPrefix(strings.TrimSpace(setting), "schedtrace=") {
				return nil
			}
		}
		found = true
		out = append(out, "GODEBUG="+With(v))
	}
	if !found {
		out = append(out, "GODEBUG="+With(""))
	}
	return out
}

// With returns the GODEBUG value godebug with Setting added last: of a
// setting named twice, the runtime takes the last.
func With(godebug string) string {
	if godebug == "" {
		return Setting
	}
	return godebug + "," + Setting
}

// Reexec re-executes this process (the same process id, arguments and
// environment) with Env's environment. It returns only when the process
// runs as it is: GODEBUG names schedtrace already, or the executable
// cannot be found or run again (a binary replaced on disk under a running
// service), which leaves the runtime's default.
func Reexec() {
	environ := Env(os.Environ())
	if environ == nil {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	_ = syscall.Exec(exe, os.Args, environ) // returns only on failure
}
