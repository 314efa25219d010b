package main

import (
	"errors"
	"flag"
	"strings"
	"testing"
)

// TestUsageFromCommands: the usage lists every command of the table, and
// every subcommand a group's synopsis names is one the group runs (asked
// for its flags, it shows them instead of the group's usage).
func TestUsageFromCommands(t *testing.T) {
	t.Parallel()
	for _, c := range commands {
		if !strings.Contains(usage, "weir "+c.name) {
			t.Errorf("usage lacks %q", c.name)
		}
		first, _, _ := strings.Cut(c.synopsis, " ")
		if !strings.Contains(first, "|") || c.name == "login" {
			continue // not a group of subcommands
		}
		for _, sub := range strings.Split(first, "|") {
			e, _, errOut := testEnv(nil, "")
			err := run(t.Context(), []string{c.name, sub, "-h"}, e)
			if errors.Is(err, errUsageShown) || !errors.Is(err, flag.ErrHelp) {
				t.Errorf("weir %s %s -h: %v (%s); the synopsis names a subcommand the group does not run", c.name, sub, err, errOut.String())
			}
		}
	}
	e, _, errOut := testEnv(nil, "")
	if err := run(t.Context(), []string{"nope"}, e); !errors.Is(err, errUsageShown) || !strings.Contains(errOut.String(), `unknown command "nope"`) {
		t.Errorf("an unknown command: %v, %q", err, errOut.String())
	}
}
