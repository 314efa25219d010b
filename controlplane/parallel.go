package controlplane

import (
	"errors"
	"sync"
)

// forEachBounded runs f on every item, at most n at a time, and returns how
// many items f reported done and every error, joined. The periodic jobs use
// it to bound their upstream calls per run.
func forEachBounded[T any](items []T, n int, f func(T) (bool, error)) (int, error) {
	var (
		mu   sync.Mutex
		done int
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, max(n, 1))
	)
	for _, it := range items {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ok, err := f(it)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			if ok {
				done++
			}
		})
	}
	wg.Wait()
	return done, errors.Join(errs...)
}
