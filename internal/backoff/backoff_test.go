package backoff

import (
	"testing"
	"time"
)

func TestCapped(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{
		{-1, time.Second}, {0, time.Second}, {1, 2 * time.Second}, {3, 8 * time.Second},
		{4, 10 * time.Second}, {1000, 10 * time.Second}, // no overflow past the cap
	} {
		if got := Capped(time.Second, 10*time.Second, tc.n); got != tc.want {
			t.Errorf("Capped(1s, 10s, %d) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

func TestNext(t *testing.T) {
	t.Parallel()
	var d time.Duration
	var got []time.Duration
	for range 8 {
		d = Next(d, 100*time.Millisecond, time.Second)
		got = append(got, d)
	}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000, 1000, 1000}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("waits %v, want %v ms", got, want)
		}
	}
}
