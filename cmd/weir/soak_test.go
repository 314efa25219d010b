package main

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSoakSmoke runs `weir soak` for a few seconds with tiny intervals: a
// real weir with two workers, storms and 429 bursts. The report must have
// its sections and a verdict for every check; the leak checks and the
// requests must pass. Three checks depend on timing that a few seconds on
// a starved machine (or under the race detector, where a GC takes a
// second) cannot promise: the memory-growth checks compare medians of
// quarters of the samples, which may be too few to judge, and a 429 burst
// may find no request before the storm that follows clears it. Those
// alone may fail, and the command then exits with its error.
func TestSoakSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Postgres and runs traffic for several seconds")
	}
	out := filepath.Join(t.TempDir(), "soak.md")
	e, stdout, stderr := testEnv(map[string]string{"WEIR_LOG_LEVEL": "warn"}, "")
	err := run(t.Context(), []string{"soak", "--duration", "6s", "--rate", "40", "--sample", "250ms",
		"--storm-every", "3s", "--storm-length", "1400ms", "--settle", "20s", "--out", out}, e)
	if err != nil && !errors.Is(err, errSoakFailed) {
		t.Fatalf("weir soak: %v\nstderr:\n%s", err, stderr)
	}
	b, rerr := os.ReadFile(out)
	if rerr != nil {
		t.Fatalf("report: %v", rerr)
	}
	md := string(b)
	for _, section := range []string{"# weir soak — ", "## Checks", "## Requests", "## What weir did", "## Under traffic", "## Samples", "| baseline |", "| settled ("} {
		if !strings.Contains(md, section) {
			t.Errorf("report has no %q:\n%s", section, md)
		}
	}
	verdict := regexp.MustCompile(`(?m)^\| ([^|]+) \| [^|]+ \| [^|]+ \| (PASS|\*\*FAIL\*\*) \|$`)
	checks := verdict.FindAllStringSubmatch(md, -1)
	if len(checks) != 8 {
		t.Errorf("%d checks with a verdict, want 8:\n%s", len(checks), md)
	}
	timing := map[string]bool{"Go heap in use after GC": true, "RSS": true, "every mechanism ran": true}
	failed := 0
	for _, c := range checks {
		if c[2] == "PASS" {
			continue
		}
		failed++
		if !timing[c[1]] {
			t.Errorf("check %q failed:\n%s", c[1], md)
		}
	}
	if (failed > 0) != (err != nil) {
		t.Errorf("%d checks failed, command returned %v", failed, err)
	}
	if !strings.Contains(stdout.String(), "report in "+out) || !strings.Contains(stdout.String(), "## Checks") {
		t.Errorf("stdout does not show the verdicts and where the report is:\n%s", stdout)
	}
}
