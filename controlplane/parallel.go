package controlplane

import (
	"errors"
	"sync"

	"golang.org/x/sync/errgroup"
)

// forEachBounded runs f on every item, at most n at a time, and returns how
// many items f reported done and every error, joined (an error does not
// stop the others). The periodic jobs use it to bound their upstream calls
// per run.
func forEachBounded[T any](items []T, n int, f func(T) (bool, error)) (int, error) {
	var (
		mu   sync.Mutex
		done int
		errs []error
		g    errgroup.Group
	)
	g.SetLimit(max(n, 1))
	for _, it := range items {
		g.Go(func() error {
			ok, err := f(it)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			if ok {
				done++
			}
			return nil
		})
	}
	g.Wait() //nolint:errcheck // every error is kept in errs
	return done, errors.Join(errs...)
}
