package sim

import (
	"context"
	"net/http"
	"sync"
	"time"
)

// maxAttempts bounds the attempt log; older attempts are dropped.
const maxAttempts = 10_000

// Attempt is one API request as the simulator saw it.
type Attempt struct {
	Time time.Time `json:"time"`
	// Account is the account name, or "" when the request did not
	// authenticate.
	Account string `json:"account"`
	Model   string `json:"model"`
	// Path is the request path without its query.
	Path   string `json:"path"`
	Stream bool   `json:"stream"`
	// BodySHA256 is the hex SHA-256 of the request body as received.
	BodySHA256 string `json:"body_sha256"`
	// Outcome is "ok", the fault kind applied, or why the request was
	// refused before any fault: "auth_error", "revoked", "token_expired",
	// "invalid_request", "request_too_large", "not_found", "usage_limit" (a
	// full usage window). Requests to the usage endpoints can also be
	// "rate_limited", to the token endpoints "invalid_grant", and grant
	// claims are logged with their result ("reset", "not_limited", …).
	Outcome string `json:"outcome"`
	// Status is the HTTP status sent: 0 when the connection was dropped
	// before any header, 499 when the client went away during slow_headers.
	Status int `json:"status"`

	// Ended is when the simulator was done with the attempt: its handler
	// returned (the end of its answer is written after that), or it was
	// about to cut the connection (a reset, a dropped connection). Zero
	// while the attempt runs. From Time to Ended the attempt was in flight
	// on its account.
	Ended time.Time `json:"ended,omitzero"`
	// Output is when the attempt first sent output a client may be shown:
	// its first content delta written and flushed (a stream), or its whole
	// successful answer written (no stream). Zero when it sent none; then
	// a gateway may still replay the request elsewhere.
	Output time.Time `json:"output,omitzero"`
	// ClientGone: the client went away before the simulator was done, so
	// Ended is when the simulator noticed, a little after the client left.
	ClientGone bool `json:"client_gone,omitempty"`
	// Usage is what the answer reported it used, as far as it was sent:
	// a stream cut midway has only what came before the cut (a Messages
	// stream its message_start's usage), an answer that reports none
	// (an error, a chat stream that did not ask for its usage) zero.
	Usage Usage `json:"usage,omitzero"`
}

// attemptLog is a bounded ring of attempts, oldest first. Attempt n of a
// generation (n counted from 0 since the last clear) sits at index n %
// maxAttempts while it is kept.
type attemptLog struct {
	mu    sync.Mutex
	buf   []Attempt
	start int // index of the oldest attempt once buf is full
	// total is how many attempts this generation logged; gen counts
	// clears, so that a request logged before one updates nothing after.
	total int64
	gen   int64
}

// add logs a, returning its generation and sequence number for update.
func (l *attemptLog) add(a Attempt) (gen, seq int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	gen, seq = l.gen, l.total
	l.total++
	if len(l.buf) < maxAttempts {
		l.buf = append(l.buf, a)
		return gen, seq
	}
	l.buf[l.start] = a
	l.start = (l.start + 1) % maxAttempts
	return gen, seq
}

// update changes attempt seq of generation gen in place, if it is still
// kept.
func (l *attemptLog) update(gen, seq int64, f func(*Attempt)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if gen != l.gen || seq < l.total-int64(len(l.buf)) || seq >= l.total {
		return
	}
	f(&l.buf[seq%maxAttempts])
}

func (l *attemptLog) list() []Attempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Attempt, 0, len(l.buf))
	out = append(out, l.buf[l.start:]...)
	return append(out, l.buf[:l.start]...)
}

func (l *attemptLog) clear() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf, l.start, l.total = nil, 0, 0
	l.gen++
}

// Attempts returns a copy of the attempt log, oldest first.
func (s *Server) Attempts() []Attempt {
	return s.attempts.list()
}

// attemptTrack follows one HTTP request's attempt, once logged, to its
// end: ServeHTTP makes one per request and carries it in the request's
// context.
type attemptTrack struct {
	logged, ended, output bool
	gen, seq              int64
}

type trackKey struct{}

func trackOf(ctx context.Context) *attemptTrack {
	t, _ := ctx.Value(trackKey{}).(*attemptTrack)
	return t
}

// tracked wraps r so that its attempt, once logged, can be followed.
func tracked(r *http.Request) (*http.Request, *attemptTrack) {
	t := &attemptTrack{}
	return r.WithContext(context.WithValue(r.Context(), trackKey{}, t)), t
}

// logAttempt adds a to the log; the first attempt of a request is the one
// its track follows.
func (x *exchange) logAttempt(a Attempt) {
	gen, seq := x.s.attempts.add(a)
	if t := trackOf(x.r.Context()); t != nil && !t.logged {
		t.logged, t.gen, t.seq = true, gen, seq
	}
}

// endAttempt stamps the request's attempt as ended now, once: r's context
// says whether its client had gone.
func (s *Server) endAttempt(r *http.Request) {
	t := trackOf(r.Context())
	if t == nil || !t.logged || t.ended {
		return
	}
	t.ended = true
	now, gone := s.now(), r.Context().Err() != nil
	s.attempts.update(t.gen, t.seq, func(a *Attempt) { a.Ended, a.ClientGone = now, gone })
}

// outputSent stamps the attempt's first output, once.
func (x *exchange) outputSent() {
	t := trackOf(x.r.Context())
	if t == nil || !t.logged || t.output {
		return
	}
	t.output = true
	now := x.s.now()
	x.s.attempts.update(t.gen, t.seq, func(a *Attempt) { a.Output = now })
}
