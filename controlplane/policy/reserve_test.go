package policy

import (
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestRouteReserve: the pool-liveness reserve is a soft demotion in the
// one partition with near-limit, released near the weekly reset, and never
// a reason not to serve.
func TestRouteReserve(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	for _, tc := range []struct {
		name  string
		cands []Candidate
		want  string
	}{
		{"low weekly headroom is held back while others can serve",
			[]Candidate{c("low", weekly(0.85, day)), c("fresh", weekly(0.3, 5*day))}, "fresh,low"},
		{"exactly the reserve's headroom is not held",
			[]Candidate{c("edge", weekly(0.8, day)), c("fresh", weekly(0.3, 5*day))}, "edge,fresh"},
		{"released within the release horizon: use it or lose it",
			[]Candidate{c("low", weekly(0.85, 11*time.Hour)), c("fresh", weekly(0.3, 5*day))}, "low,fresh"},
		{"held just outside the release horizon",
			[]Candidate{c("low", weekly(0.85, 13*time.Hour)), c("fresh", weekly(0.3, 5*day))}, "fresh,low"},
		{"behind unknown accounts too",
			[]Candidate{c("low", weekly(0.85, day)), c("unknown")}, "unknown,low"},
		{"the only account still serves",
			[]Candidate{c("low", weekly(0.85, 3*day))}, "low"},
		{"serves when every other account is full, cooling or tried",
			[]Candidate{c("low", weekly(0.85, 3*day)), c("full", live(4), weekly(0.1, day)), c("cool", cooling(time.Hour, true)), c("tried", weekly(0.1, day))}, "low"},
		{"one partition with near limit, by when each stops being demoted",
			[]Candidate{
				c("reserve3d", weekly(0.85, 3*day)),                          // released at 3d-12h
				c("near5h", weekly(0.2, 6*day), fiveHour(0.95, 2*time.Hour)), // near until 2h; weekly 0.2 not reserved
				c("near7d", weekly(0.95, 2*day)),                             // near until 2d
				c("reserve1d", weekly(0.85, day)),                            // released at 12h
				c("fresh", weekly(0.5, 6*day)),
			}, "fresh,near5h,reserve1d,near7d,reserve3d"},
		{"a near-limit weekly window is not released by the horizon",
			[]Candidate{c("near", weekly(0.95, 6*time.Hour)), c("fresh", weekly(0.3, 5*day))}, "fresh,near"},
		{"an expired weekly reading holds nothing",
			[]Candidate{c("stale", weekly(0.85, -time.Minute)), c("fresh", weekly(0.3, 5*day))}, "fresh,stale"},
		{"session affinity and priority still come first",
			[]Candidate{c("low", prio(1), weekly(0.85, 3*day)), c("fresh", weekly(0.3, 5*day))}, "low,fresh"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := RouteRequest{Model: "claude-sonnet-4-5", Exclude: map[uuid.UUID]bool{c("tried").Account.ID: true}}
			order, none := Route(tc.cands, req, epoch)
			if none != nil {
				t.Fatalf("no account: %v %q", none.Reason, none.Message)
			}
			if got := labelsOf(order); got != tc.want {
				t.Errorf("order %s, want %s", got, tc.want)
			}
		})
	}
}
