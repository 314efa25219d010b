package sim

import (
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
}

// attemptLog is a bounded ring of attempts, oldest first.
type attemptLog struct {
	mu    sync.Mutex
	buf   []Attempt
	start int // index of the oldest attempt once buf is full
}

func (l *attemptLog) add(a Attempt) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) < maxAttempts {
		l.buf = append(l.buf, a)
		return
	}
	l.buf[l.start] = a
	l.start = (l.start + 1) % maxAttempts
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
	l.buf, l.start = nil, 0
}

// Attempts returns a copy of the attempt log, oldest first.
func (s *Server) Attempts() []Attempt {
	return s.attempts.list()
}
