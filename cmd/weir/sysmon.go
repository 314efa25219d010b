package main

import (
	"os"
	"slices"

	"github.com/weirhq/weir/internal/sysmon"
)

// steadySysmon re-executes a command that serves requests (os.Args[1])
// with Go's monitor thread at a steady poll (internal/sysmon); any other
// command runs as it is.
func steadySysmon() {
	if servesRequests(os.Args[1:]) {
		sysmon.Reexec()
	}
}

// servesRequests says whether args name a command that serves requests.
func servesRequests(args []string) bool {
	return len(args) > 0 && slices.ContainsFunc(commands, func(c command) bool { return c.serves && c.name == args[0] })
}
