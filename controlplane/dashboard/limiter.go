package dashboard

import (
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Failed sign-ins (a wrong admin token, a refused OpenID callback) are
// limited per source (source()): a token bucket of failBurst refilled at
// one per failRefill, so a guesser gets a handful of tries a minute and an
// operator's typo costs nothing. Past it a sign-in is answered 429 before
// the token is even compared. The log gets one WARN line per source per
// failLogEvery with the count of refusals since the last, never one per
// attempt: a guesser cannot flood it.
const (
	failBurst    = 5
	failRefill   = 12 * time.Second // five a minute
	failLogEvery = time.Minute
)

type failSource struct {
	tokens   float64
	refilled time.Time
	// pending refusals not logged yet, since logged.
	pending int
	logged  time.Time
}

// failures is the limiter. Its state is per replica: each replica
// limits what it sees.
type failures struct {
	now func() time.Time
	log *slog.Logger
	mu  sync.Mutex
	by  map[netip.Prefix]*failSource
}

func newFailures(now func() time.Time, log *slog.Logger) *failures {
	return &failures{now: now, log: log, by: map[netip.Prefix]*failSource{}}
}

// refill brings a source's bucket to now.
func (s *failSource) refill(now time.Time) {
	s.tokens = min(failBurst, s.tokens+float64(now.Sub(s.refilled))/float64(failRefill))
	s.refilled = now
}

// allow says whether src may try to sign in; a refusal counts as a
// failure for the log.
func (f *failures) allow(src netip.Prefix) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.by[src]
	if !ok {
		return true
	}
	now := f.now()
	s.refill(now)
	if s.tokens >= 1 {
		return true
	}
	s.pending++
	f.flush(now)
	return false
}

// failed records a failed sign-in of src.
func (f *failures) failed(src netip.Prefix) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	s, ok := f.by[src]
	if !ok {
		s = &failSource{tokens: failBurst, refilled: now}
		f.by[src] = s
	}
	s.refill(now)
	s.tokens = max(0, s.tokens-1)
	s.pending++
	f.flush(now)
}

// flush writes the line of every source whose interval has passed, and
// forgets sources with a full bucket and nothing to log. It runs on each
// failure: with no failures there is nothing new to say.
func (f *failures) flush(now time.Time) {
	for src, s := range f.by {
		if s.pending > 0 && now.Sub(s.logged) >= failLogEvery {
			f.log.LogAttrs(context.Background(), slog.LevelWarn, "dashboard sign-ins refused",
				slog.String("source", src.String()), slog.Int("count", s.pending), slog.Duration("interval", failLogEvery))
			s.pending, s.logged = 0, now
		}
		s.refill(now)
		if s.pending == 0 && s.tokens >= failBurst && now.Sub(s.logged) >= failLogEvery {
			delete(f.by, src)
		}
	}
}

// tooMany answers a sign-in past the limit.
func (h *Handler) tooMany(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Retry-After", "60")
	h.render(w, r, http.StatusTooManyRequests, "login", view{Title: "Sign in",
		Data: h.loginData(Prefix, "Too many failed sign-ins from your address; wait a minute and try again.")})
}
