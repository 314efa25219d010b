package bench

import (
	"context"
	"testing"
	"time"

	manual "github.com/weirhq/weir/internal/clock"
)

// fakeClock never sleeps: SleepUntil jumps to the due time unless the
// clock is already past it (the sender is late).
type fakeClock struct {
	*manual.Manual
	sleeps int
}

func newFakeClock(start time.Time) *fakeClock { return &fakeClock{Manual: manual.NewManual(start)} }

func (c *fakeClock) SleepUntil(ctx context.Context, t time.Time) bool {
	if c.AdvanceTo(t) {
		c.sleeps++
	}
	return ctx.Err() == nil
}

func TestPlanFiresEachRequestAtItsDueTime(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rate     int
		d        time.Duration
		n        int
		interval time.Duration
	}{
		{100, time.Second, 100, 10 * time.Millisecond},
		{250, 2 * time.Second, 500, 4 * time.Millisecond},
		{2000, 10 * time.Second, 20000, 500 * time.Microsecond},
		{3, time.Second, 3, 333333333},
	} {
		start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		clk := newFakeClock(start)
		p := newPlan(start, tc.rate, tc.d)
		if p.n != tc.n || p.interval != tc.interval {
			t.Fatalf("rate %d over %v: n=%d interval=%v, want %d and %v", tc.rate, tc.d, p.n, p.interval, tc.n, tc.interval)
		}
		var fired []time.Time
		got := p.run(t.Context(), clk, func(i int, due time.Time) {
			if want := start.Add(time.Duration(i) * tc.interval); !due.Equal(want) {
				t.Fatalf("request %d due %v, want %v", i, due, want)
			}
			if clk.Now().Before(due) {
				t.Fatalf("request %d fired at %v, before its due time %v", i, clk.Now(), due)
			}
			fired = append(fired, clk.Now())
		})
		if got != tc.n || len(fired) != tc.n {
			t.Fatalf("fired %d (returned %d), want %d", len(fired), got, tc.n)
		}
		if last := fired[len(fired)-1]; last.Sub(start) >= tc.d {
			t.Errorf("last request at +%v, not within the step's %v", last.Sub(start), tc.d)
		}
	}
}

// An open loop does not wait for slow requests: when the sender falls
// behind, the late requests go out at once and keep their due times, so
// their latency includes the delay.
func TestPlanIsOpenLoop(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := newFakeClock(start)
	p := newPlan(start, 100, time.Second)
	var dues []time.Time
	p.run(t.Context(), clk, func(i int, due time.Time) {
		dues = append(dues, due)
		if i == 10 {
			clk.Advance(55 * time.Millisecond) // the sender stalls
		}
	})
	if len(dues) != 100 {
		t.Fatalf("fired %d, want 100", len(dues))
	}
	for i, d := range dues {
		if want := start.Add(time.Duration(i) * 10 * time.Millisecond); !d.Equal(want) {
			t.Fatalf("request %d due %v, want %v", i, d, want)
		}
	}
	// Requests 11..15 were already late: no sleep for them.
	if clk.sleeps != 100-1-5 {
		t.Errorf("slept %d times, want %d", clk.sleeps, 100-1-5)
	}
}

func TestPlanStopsWithContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	start := time.Now()
	clk := newFakeClock(start)
	p := newPlan(start, 100, time.Second)
	n := p.run(ctx, clk, func(i int, _ time.Time) {
		if i == 41 {
			cancel()
		}
	})
	if n != 42 {
		t.Errorf("fired %d, want 42", n)
	}
}
