package clock

import (
	"sync"
	"testing"
	"time"
)

func TestManual(t *testing.T) {
	t.Parallel()
	start := time.Date(2030, time.March, 4, 5, 6, 7, 0, time.UTC)
	c := NewManual(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now %v, want %v", got, start)
	}
	if got := c.Advance(time.Minute); !got.Equal(start.Add(time.Minute)) || !c.Now().Equal(got) {
		t.Fatalf("Advance returned %v, Now %v; want both %v", got, c.Now(), start.Add(time.Minute))
	}
	if c.AdvanceTo(start) || !c.Now().Equal(start.Add(time.Minute)) {
		t.Fatalf("AdvanceTo a past time moved the clock to %v", c.Now())
	}
	if c.AdvanceTo(start.Add(time.Minute)) {
		t.Fatal("AdvanceTo the present reported a move")
	}
	if !c.AdvanceTo(start.Add(time.Hour)) || !c.Now().Equal(start.Add(time.Hour)) {
		t.Fatalf("AdvanceTo a later time: Now %v, want %v", c.Now(), start.Add(time.Hour))
	}
}

// Readers and movers at once: under -race this is the concurrency check,
// and the clock ends where the sum of the moves puts it.
func TestManualConcurrent(t *testing.T) {
	t.Parallel()
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	c := NewManual(start)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				c.Advance(time.Second)
				c.AdvanceTo(c.Now().Add(-time.Second))
				_ = c.Now()
			}
		})
	}
	wg.Wait()
	if got, want := c.Now(), start.Add(800*time.Second); !got.Equal(want) {
		t.Fatalf("Now %v, want %v", got, want)
	}
}
