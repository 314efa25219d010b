package policy

import (
	"testing"
	"time"

	"github.com/google/uuid"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// weekly and fiveHour give a Candidate a usage reading: utilization, and
// the window's reset relative to epoch.
func weekly(u float64, reset time.Duration) func(*Candidate) {
	return func(x *Candidate) { x.SevenDay = &Window{Utilization: u, ResetsAt: epoch.Add(reset)} }
}

func fiveHour(u float64, reset time.Duration) func(*Candidate) {
	return func(x *Candidate) { x.FiveHour = &Window{Utilization: u, ResetsAt: epoch.Add(reset)} }
}

func recoveryProbe() func(*Candidate) { return func(x *Candidate) { x.Account.RecoveryProbe = true } }

func TestRouteHarvest(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	for _, tc := range []struct {
		name    string
		cands   []Candidate
		session string
		want    string
	}{
		{"soonest weekly reset first", []Candidate{c("a", weekly(0.2, 5*day)), c("b", weekly(0.5, day)), c("c", weekly(0.1, 3*day))}, "", "b,c,a"},
		{"ties by more weekly headroom", []Candidate{c("a", weekly(0.6, day)), c("b", weekly(0.3, day)), c("c", weekly(0.8, day))}, "", "b,a,c"},
		{"never a 5-hour term", []Candidate{c("a", weekly(0.3, day), fiveHour(0.1, time.Hour)), c("b", weekly(0.3, day), fiveHour(0.8, 10*time.Minute))}, "", "a,b"},
		{"5-hour reading alone is no weekly evidence", []Candidate{c("a", fiveHour(0.1, time.Hour)), c("b", weekly(0.7, 6*day))}, "", "b,a"},
		{"unknown after known", []Candidate{c("a"), c("b", weekly(0.7, 6*day)), c("c")}, "", "b,a,c"},
		{"an expired reading is no evidence", []Candidate{c("a", weekly(0.1, -time.Minute)), c("b", weekly(0.7, 6*day))}, "", "b,a"},
		{"near limit last, by when they stop being near", []Candidate{
			c("near7d", weekly(0.95, day)), c("near5h", weekly(0.2, time.Hour), fiveHour(0.92, 2*time.Hour)),
			c("unknown"), c("known", weekly(0.5, 4*day)),
		}, "", "known,unknown,near5h,near7d"},
		{"near limit, soonest out first", []Candidate{c("a", weekly(0.91, 3*day)), c("b", fiveHour(0.9, time.Hour))}, "", "b,a"},
		{"session affinity still first", []Candidate{c("a", weekly(0.1, day)), c("b", weekly(0.95, day)), c("c")}, "b", "b,a,c"},
		{"priority is an override before HARVEST", []Candidate{c("a", weekly(0.1, day)), c("b", prio(1), weekly(0.95, 6*day)), c("c", prio(1))}, "", "c,b,a"},
		{"HARVEST before free share", []Candidate{c("a", live(3), weekly(0.5, day)), c("b", weekly(0.5, 2*day))}, "", "a,b"},
		{"spent leaves routing", []Candidate{c("a", weekly(0.99, day)), c("b", fiveHour(1, time.Hour)), c("c", weekly(0.999, -time.Second)), c("d")}, "", "c,d"},
		{"a recovery probe holds the cap to one", []Candidate{c("a", recoveryProbe(), live(1)), c("b", recoveryProbe())}, "", "b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := RouteRequest{Model: "claude-sonnet-4-5", Exclude: map[uuid.UUID]bool{}}
			if tc.session != "" {
				req.SessionAccount = c(tc.session).Account.ID
			}
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

// TestRouteSpentWindow: an account whose view shows a spent window is
// cooling until the reset (the latest, when both are spent): not
// permanent, retry_at that reset.
func TestRouteSpentWindow(t *testing.T) {
	t.Parallel()
	req := RouteRequest{Model: "m", Exclude: map[uuid.UUID]bool{}}
	for _, tc := range []struct {
		name    string
		cands   []Candidate
		retryAt time.Duration
	}{
		{"weekly spent", []Candidate{c("a", weekly(0.99, 30*time.Hour))}, 30 * time.Hour},
		{"soonest of two accounts", []Candidate{c("a", weekly(1, 30*time.Hour)), c("b", fiveHour(0.995, 2*time.Hour))}, 2 * time.Hour},
		{"both windows spent: the later reset", []Candidate{c("a", weekly(1, 30*time.Hour), fiveHour(1, time.Hour))}, 30 * time.Hour},
		{"spent outlasts a cooldown", []Candidate{c("a", weekly(1, 3*time.Hour), cooling(time.Minute, true))}, 3 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			order, none := Route(tc.cands, req, epoch)
			if none == nil {
				t.Fatalf("got %s, want no account", labelsOf(order))
			}
			if none.Reason != weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING || none.Permanent {
				t.Errorf("%v permanent %v %q", none.Reason, none.Permanent, none.Message)
			}
			if none.RetryAt == nil || !none.RetryAt.AsTime().Equal(epoch.Add(tc.retryAt)) {
				t.Errorf("retry_at %v, want now+%v", none.RetryAt, tc.retryAt)
			}
		})
	}
}
