// Package clock is time that moves only when told to: the simulator's
// virtual time, and the clock tests inject wherever code asks for Now, so
// that they move it instead of sleeping.
package clock

import (
	"sync"
	"time"
)

// Manual is a clock that stands still until advanced. It is safe for
// concurrent use: the code under test reads it while a test moves it.
type Manual struct {
	mu sync.Mutex
	t  time.Time
}

// NewManual returns a clock standing at t.
func NewManual(t time.Time) *Manual { return &Manual{t: t} }

// Now is the clock's time.
func (c *Manual) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock on by d and returns the new time.
func (c *Manual) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// AdvanceTo moves the clock to t unless it is already there or past it,
// and reports whether it moved. Concurrent waits that each move the clock
// to their own end so never move it back.
func (c *Manual) AdvanceTo(t time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !t.After(c.t) {
		return false
	}
	c.t = t
	return true
}
