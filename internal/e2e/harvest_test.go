package e2e

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/sim"
)

// TestHarvestWeeklyWindows: three subscription accounts whose weekly
// windows reset at different times, under steady load. Traffic goes to the
// account whose week resets soonest; when that week is spent the account
// leaves routing without a 429 reaching the client (the others serve), and
// after its reset it returns once a usage read shows the new window.
func TestHarvestWeeklyWindows(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	// A request costs the simulator 36 tokens (26 in, 10 out): "soon"
	// holds two, the second filling it (the header saturates at 0.99).
	week := func(limit int64, resetIn time.Duration) *sim.Windows {
		return &sim.Windows{
			FiveHour: &sim.Window{Limit: 1_000_000, ResetIn: sim.Duration(3 * time.Hour)},
			SevenDay: &sim.Window{Limit: limit, ResetIn: sim.Duration(resetIn)},
		}
	}
	e := setup(t, options{virtual: v, accounts: []account{
		{label: "late", oauth: true, windows: week(100_000, 100*time.Hour)},
		{label: "mid", oauth: true, windows: week(100_000, 50*time.Hour)},
		{label: "soon", oauth: true, windows: week(50, 20*time.Hour)},
	}})
	refresh := func(label string) {
		t.Helper()
		res, err := e.accounts.RefreshUsage(t.Context(), connect.NewRequest(&weirv1.RefreshUsageRequest{Id: e.ids[label]}))
		if err != nil || !res.Msg.Read || res.Msg.Error != "" {
			t.Fatalf("refresh %s: %v %v", label, res, err)
		}
	}
	for _, l := range []string{"late", "mid", "soon"} {
		refresh(l)
	}

	served := func(n int) []string {
		t.Helper()
		before := len(e.sim.Attempts())
		for range n {
			if r := e.post(false); r.status != http.StatusOK {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			e.leasesReleased()
		}
		var out []string
		for _, a := range e.sim.Attempts()[before:] {
			if a.Status != http.StatusOK {
				t.Errorf("upstream answered %s %d: routing sent into a spent window", a.Account, a.Status)
			}
			out = append(out, a.Account)
		}
		return out
	}
	if got, want := served(5), []string{"soon", "soon", "mid", "mid", "mid"}; !slices.Equal(got, want) {
		t.Fatalf("served by %v, want %v", got, want)
	}
	if st, _ := e.sim.Windows("soon"); st.SevenDay == nil || st.SevenDay.Used < st.SevenDay.Limit {
		t.Fatalf("soon's week %+v, want it spent", st.SevenDay)
	}

	// Past soon's reset its stored reading is no evidence; a read shows
	// the new week and soon serves again.
	v.Advance(20*time.Hour + time.Minute)
	refresh("soon")
	if w := usageWindow(e.account("soon"), "seven_day"); w == nil || w.GetUtilization() != 0 || !w.ResetsAt.AsTime().After(v.Now().Add(6*24*time.Hour)) {
		t.Fatalf("soon's week after the reset: %v", w)
	}
	for _, l := range []string{"late", "mid"} {
		e.change(func() {
			if _, err := e.accounts.PauseAccount(t.Context(), connect.NewRequest(&weirv1.PauseAccountRequest{Id: e.ids[l]})); err != nil {
				t.Fatal(err)
			}
		})
	}
	if got := served(1); !slices.Equal(got, []string{"soon"}) {
		t.Fatalf("served by %v after the reset, want soon", got)
	}
}

func usageWindow(a *weirv1.Account, name string) *weirv1.UsageWindow {
	for _, w := range a.Usage {
		if w.Window == name {
			return w
		}
	}
	return nil
}
