package upstream

import (
	"fmt"
	"testing"
	"time"
)

// epoch is where every test clock starts: whole seconds.
var epoch = time.Date(2030, time.March, 4, 5, 6, 7, 0, time.UTC)

func f64(v float64) *float64 { return &v }

func tm(t time.Time) *time.Time { return &t }

// requireReadings compares readings by window, utilization (to 1e-9) and
// reset instant.
func requireReadings(t *testing.T, got, want []Reading) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d readings %s, want %d %s", len(got), readingsText(got), len(want), readingsText(want))
	}
	for i := range got {
		if g, w := readingText(got[i]), readingText(want[i]); g != w {
			t.Errorf("reading %d: got %s, want %s", i, g, w)
		}
	}
}

func readingText(r Reading) string {
	u, at := "nil", "nil"
	if r.Utilization != nil {
		u = fmt.Sprintf("%.9f", *r.Utilization)
	}
	if r.ResetsAt != nil {
		at = r.ResetsAt.UTC().Format(time.RFC3339Nano)
	}
	return r.Window + " " + u + " " + at
}

func readingsText(rs []Reading) string {
	s := "["
	for i, r := range rs {
		if i > 0 {
			s += ", "
		}
		s += readingText(r)
	}
	return s + "]"
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{"450": 450 * time.Second, "": 0, "soon": 0, "-3": 0, "999999": 30 * time.Minute} {
		if got := retryAfter(in); got != want {
			t.Errorf("retryAfter(%q) = %v, want %v", in, got, want)
		}
	}
}
