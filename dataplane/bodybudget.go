package dataplane

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The body buffer. A worker reads a request's whole body before its first
// attempt and keeps it while the request may still be replayed: through
// failovers and capacity holds, until output starts or the request ends
// (upstream.go replayBody). Unbounded, thirty clients sending 31 MiB each
// and withholding the last byte take a gigabyte for as long as the body
// timeout allows, and a storm's held requests take what they hold. So
// every body's bytes are reserved before they are read, against a bound
// for the whole worker (body_buffer_bytes) and one for each client key
// (body_buffer_per_key_bytes): a body with a Content-Length reserves it
// up front, a chunked one (and a Responses WebSocket message) grows its
// reservation with its buffer. A request that does not fit is refused
// before its bytes are read: 429 when its key holds too much, 503 when
// the worker does; nothing is leased for it.
//
// The rule, with T = body_buffer_bytes and K = body_buffer_per_key_bytes:
//
//   - one key holds at most K (default T/8), so a single key takes an
//     eighth of the worker, never all of it;
//   - the last T/reserveShare of the buffer (a quarter: 256 MiB of the
//     default 1 GiB) is kept for keys that hold nothing on this worker:
//     a request whose key already holds other bytes may reserve only while
//     the total stays within T - T/4, the shared part. A key that holds
//     nothing may use all of T, so its first body fits while bodies of
//     other keys fill the shared part.
//
// Filling the shared part then takes (T - T/4)/K keys (6 at the
// defaults), and filling the reserve on top of it one more key per body
// it holds, each taking at most one body (T/4 ÷ the 32 MiB body limit: 8
// keys): a handful of keys cannot shut every other client out, and a key
// that holds nothing is refused only when the whole buffer is full.
// The per-key bound may exceed the total (an operator's setting): the
// smaller applies, and the reserve rule still holds.

// reserveShare is the fraction (1/reserveShare) of the worker's buffer
// kept for keys that hold nothing.
const reserveShare = 4

// bodyBudget is the worker's account of reserved body bytes.
type bodyBudget struct {
	mu     sync.Mutex
	total  int64
	perKey map[string]int64 // by key hash
	gauge  prometheus.Gauge
	refuse *prometheus.CounterVec // by scope: key or worker
}

func newBodyBudget(m *metrics) *bodyBudget {
	return &bodyBudget{perKey: map[string]int64{}, gauge: m.bodyBuffered, refuse: m.bodyRefused}
}

// bodyLimits are the bounds in force (workerSettings).
type bodyLimits struct{ total, perKey int64 }

// errBodyBuffer refuses a body that does not fit now.
type errBodyBuffer struct {
	scope string // "key", "worker" or "reserve"
	limit int64
}

func (e *errBodyBuffer) Error() string { return "body buffer full: " + e.scope }

// errBodyOverBound refuses a body larger than a bound itself: no wait
// makes it fit.
type errBodyOverBound struct{ limit int64 }

func (e *errBodyOverBound) Error() string { return "body over the buffer bound" }

// reserve adds n bytes for key, within lim, the reservation so far of
// the request being had.
func (b *bodyBudget) reserve(key string, had, n int64, lim bodyLimits) error {
	if had+n > min(lim.total, lim.perKey) {
		b.refuse.WithLabelValues("over_bound").Inc()
		return &errBodyOverBound{limit: min(lim.total, lim.perKey)}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	k := b.perKey[key]
	shared := lim.total - lim.total/reserveShare
	switch {
	case k+n > lim.perKey:
		b.refuse.WithLabelValues("key").Inc()
		return &errBodyBuffer{scope: "key", limit: lim.perKey}
	case b.total+n > lim.total:
		b.refuse.WithLabelValues("worker").Inc()
		return &errBodyBuffer{scope: "worker", limit: lim.total}
	case k > had && b.total+n > shared:
		// The key holds other bodies: the reserve is not for it.
		b.refuse.WithLabelValues("reserve").Inc()
		return &errBodyBuffer{scope: "reserve", limit: shared}
	}
	b.total += n
	b.perKey[key] += n
	b.gauge.Add(float64(n))
	return nil
}

func (b *bodyBudget) release(key string, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total -= n
	if b.perKey[key] -= n; b.perKey[key] <= 0 {
		delete(b.perKey, key)
	}
	b.gauge.Sub(float64(n))
}

// bodyHold is one request's reservation.
type bodyHold struct {
	b   *bodyBudget
	key string
	lim bodyLimits
	mu  sync.Mutex
	n   int64
}

func (h *bodyHold) grow(n int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.b.reserve(h.key, h.n, n, h.lim); err != nil {
		return err
	}
	h.n += n
	return nil
}

// release gives the reservation back; the body's bytes are let go.
func (h *bodyHold) release() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n > 0 {
		h.b.release(h.key, h.n)
		h.n = 0
	}
}

// chunkedStep is the first buffer of a body without a Content-Length;
// each further one doubles it.
const chunkedStep = 64 << 10

// readReserved reads r whole, reserving every byte of its buffer in h
// before it is read: length bytes up front when it is known (≥ 0), else
// a buffer that doubles, each growth reserved before it is made. limit
// is the largest body taken; r is expected to refuse more (an
// http.MaxBytesReader).
func readReserved(r io.Reader, length, limit int64, h *bodyHold) ([]byte, error) {
	if length >= 0 {
		if err := h.grow(length); err != nil {
			return nil, err
		}
		buf := make([]byte, length)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return buf, nil
	}
	return readGrowing(r, limit, 0, h)
}

// readGrowing reads r whole into a buffer that doubles (from
// chunkedStep) while fewer than slack bytes are free past what it holds,
// each growth reserved in h before it is made; the old buffer is let go
// at once. limit is the largest body taken (r refuses more).
func readGrowing(r io.Reader, limit int64, slack int, h *bodyHold) ([]byte, error) {
	var buf []byte
	for {
		if cap(buf)-len(buf) <= slack {
			next := min(max(2*int64(cap(buf)), chunkedStep), limit+1+int64(slack))
			if err := h.grow(next - int64(cap(buf))); err != nil {
				return nil, err
			}
			grown := make([]byte, len(buf), next)
			copy(grown, buf)
			buf = grown
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		switch {
		case errors.Is(err, io.EOF):
			return buf, nil
		case err != nil:
			return nil, err
		}
	}
}

// bodyClock bounds the reading of one body (or WebSocket message): each
// read must bring bytes within idle (BodyIdleTimeout), and the whole body
// come by end (BodyReadTimeout from the start, never renewed). A body
// that stopped arriving is cut in seconds; one that trickles, at the
// overall bound.
type bodyClock struct {
	idle, overall time.Duration
	end           time.Time
	// idleCut: the deadline set last was the idle one.
	idleCut bool
}

func (s *Server) newBodyClock() *bodyClock {
	return &bodyClock{idle: s.cfg.BodyIdleTimeout, overall: s.cfg.BodyReadTimeout, end: time.Now().Add(s.cfg.BodyReadTimeout)}
}

// next is the deadline of the next read, from now. Deadlines are the
// network's, so they are real time, not the injected clock.
func (c *bodyClock) next() time.Time {
	d := time.Now().Add(c.idle)
	if c.idleCut = d.Before(c.end); !c.idleCut {
		d = c.end
	}
	return d
}

// err is the client's answer to a read that passed its deadline.
func (c *bodyClock) err() *apiError {
	if c.idleCut {
		return errBodyIdle(c.idle)
	}
	return errBodyTimeout(c.overall)
}

// deadlineReader sets the connection's read deadline before each read
// of the body.
type deadlineReader struct {
	r     io.Reader
	rc    *http.ResponseController
	clock *bodyClock
}

func (d *deadlineReader) Read(p []byte) (int, error) {
	d.rc.SetReadDeadline(d.clock.next()) //nolint:errcheck // supported: set once before it is used
	return d.r.Read(p)
}

// bodyBufferRetry is the Retry-After of a body the buffer cannot take
// now: bodies are let go as requests start their output, within seconds.
const bodyBufferRetry = 2 * time.Second

// bodyBufferError is the client's answer to a body the buffer refused,
// or nil when err is no such refusal.
func bodyBufferError(err error) *apiError {
	var full *errBodyBuffer
	var over *errBodyOverBound
	switch {
	case errors.As(err, &over):
		return &apiError{status: http.StatusRequestEntityTooLarge, typ: "request_too_large", final: true,
			message: fmt.Sprintf("request body is larger than this weir worker buffers for one request (%d bytes)", over.limit)}
	case !errors.As(err, &full):
		return nil
	case full.scope == "key":
		return &apiError{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "rate_limit_exceeded",
			retryAfter: bodyBufferRetry, message: fmt.Sprintf("weir: this weir key's requests already hold %d bytes of request bodies "+
				"on this worker, its bound; retry in %ss. It is weir's bound, not the provider's.", full.limit, retryAfterSeconds(bodyBufferRetry))}
	case full.scope == "reserve":
		return &apiError{status: http.StatusServiceUnavailable, typ: "overloaded_error", code: "server_is_overloaded",
			retryAfter: bodyBufferRetry, message: fmt.Sprintf("weir: this worker already holds %d bytes of request bodies of keys "+
				"that hold some, its bound for them (the rest is kept for keys that hold none); retry in %ss",
				full.limit, retryAfterSeconds(bodyBufferRetry))}
	}
	return &apiError{status: http.StatusServiceUnavailable, typ: "overloaded_error", code: "server_is_overloaded",
		retryAfter: bodyBufferRetry, message: fmt.Sprintf("weir: this worker already holds %d bytes of request bodies, "+
			"its bound; retry in %ss", full.limit, retryAfterSeconds(bodyBufferRetry))}
}
