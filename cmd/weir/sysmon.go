package main

import (
	"os"
	"slices"

	"github.com/weirhq/weir/internal/sysmon"
)

// steadySysmonCommands are the commands that serve requests: each runs
// with Go's monitor thread at a steady poll (internal/sysmon).
var steadySysmonCommands = []string{"dev", "controlplane", "dataplane"}

// steadySysmon re-executes a serving command (os.Args[1]) with the
// monitor's steady poll; any other command runs as it is.
func steadySysmon() {
	if servesRequests(os.Args[1:]) {
		sysmon.Reexec()
	}
}

func servesRequests(args []string) bool {
	return len(args) > 0 && slices.Contains(steadySysmonCommands, args[0])
}
