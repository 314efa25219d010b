package controlplane

import (
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestForEachBounded: at most n items run at once; every item runs, the
// ones done are counted and every error is kept.
func TestForEachBounded(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var (
			mu        sync.Mutex
			now, peak int
		)
		items := []int{1, 2, 3, 4, 5, 6, 7}
		done, err := forEachBounded(items, 3, func(i int) (bool, error) {
			mu.Lock()
			now++
			peak = max(peak, now)
			mu.Unlock()
			time.Sleep(time.Second) // virtual: every running item overlaps
			mu.Lock()
			now--
			mu.Unlock()
			if i%3 == 0 {
				return false, errors.New("item failed")
			}
			return i%2 == 1, nil
		})
		if peak != 3 {
			t.Errorf("%d items ran at once, want 3", peak)
		}
		if done != 3 { // 1, 5, 7 (3 failed)
			t.Errorf("done = %d, want 3", done)
		}
		if err == nil || len(err.(interface{ Unwrap() []error }).Unwrap()) != 2 {
			t.Errorf("errors = %v, want the two failures joined", err)
		}
	})
}
