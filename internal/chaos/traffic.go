package chaos

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/weirhq/weir/internal/sim"
)

// Models of the two surfaces.
const (
	messagesModel  = "claude-sonnet-4-5-20250929"
	responsesModel = "gpt-4.1-mini"
)

// Outcomes of a client request, as the client saw it.
const (
	OutcomeOK        = "ok"        // a 2xx answer, whole
	OutcomeError     = "error"     // an error status, or a stream ending in an error event
	OutcomeCancelled = "cancelled" // the client went away on purpose
	OutcomeRefused   = "refused"   // its worker was down: the connection was refused
	OutcomeCut       = "cut"       // no whole answer: the connection broke (judged by check.go)
	OutcomeTwice     = "twice"     // more than one final event in one stream
)

// Request is one client request and what its client saw.
type Request struct {
	N       int    `json:"n"`
	SHA     string `json:"body_sha256"`
	Model   string `json:"model"`
	Surface string `json:"surface"` // "messages" or "responses"
	Stream  bool   `json:"stream"`
	Session string `json:"session,omitempty"`
	// Worker is the data plane it was sent to, Incarnation which process
	// of it (a restart makes a new one).
	Worker      int `json:"worker"`
	Incarnation int `json:"incarnation"`
	// Cancel is how the client meant to go away: "", "mid_request" (after
	// CancelAfter) or "mid_stream" (after the first delta).
	Cancel      string        `json:"cancel,omitempty"`
	CancelAfter time.Duration `json:"cancel_after,omitempty"`
	// Start and End are from the start of traffic.
	Start time.Duration `json:"start"`
	End   time.Duration `json:"end"`
	// Status and RequestID are the answer's status and Weir-Request-Id
	// (both empty without headers); ErrType its error type or code.
	Status    int    `json:"status,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	ErrType   string `json:"error_type,omitempty"`
	Outcome   string `json:"outcome"`
	// Terminals counts the final events of a stream (message_stop, error,
	// response.completed, response.failed): a whole answer has one.
	Terminals int `json:"terminals"`
	// Output: the client got some of the answer's content.
	Output bool   `json:"output"`
	Detail string `json:"detail,omitempty"`
	// Claim is an error answer's anthropic-ratelimit-unified-
	// representative-claim (an upstream's quota rejection passed on);
	// Final says it carried X-Should-Retry: false (a final usage limit).
	Claim string `json:"claim,omitempty"`
	Final bool   `json:"final,omitempty"`
}

// Retryable says whether the request failed in a way a held request
// could have been spared: an overload, unavailability or rate limit,
// not a refusal of the request itself.
func (q Request) Retryable() bool {
	if q.Outcome != OutcomeError {
		return false
	}
	switch q.Status {
	case 429, 500, 502, 503, 504, 529:
		return true
	case 200: // an error event in the stream
		return true
	}
	return false
}

func (q Request) String() string {
	s := fmt.Sprintf("req %d %s %s", q.N, q.Surface, q.Outcome)
	if q.Stream {
		s = fmt.Sprintf("req %d %s stream %s", q.N, q.Surface, q.Outcome)
	}
	if q.Status != 0 {
		s += fmt.Sprintf(" %d", q.Status)
	}
	if q.ErrType != "" {
		s += " " + q.ErrType
	}
	if q.Claim != "" {
		s += " claim " + q.Claim
	}
	if q.Final {
		s += " final"
	}
	s += fmt.Sprintf(" worker %d.%d %s→%s", q.Worker, q.Incarnation, fmtRel(q.Start), fmtRel(q.End))
	if q.Cancel != "" {
		s += " cancel " + q.Cancel
	}
	if q.Session != "" {
		s += " session"
	}
	if q.RequestID != "" {
		s += " " + q.RequestID
	}
	if q.Detail != "" {
		s += " (" + q.Detail + ")"
	}
	return s
}

// traffic is the agents: Clients loops, each sending one request after
// another to a worker that is up.
type traffic struct {
	seed    uint64
	key     string
	start   time.Time
	workers []*slot
	clients map[string]*http.Client // per worker URL: a restarted worker is a new one

	mu   sync.Mutex
	reqs []Request
	n    int
}

func (t *traffic) client(url string) *http.Client {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.clients[url]
	if !ok {
		c = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 5 * time.Second}}
		t.clients[url] = c
	}
	return c
}

// run keeps clients loops busy until ctx ends, then waits for the
// requests in flight.
func (t *traffic) run(ctx context.Context, clients int) {
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(t.seed, uint64(i)+1))
			for ctx.Err() == nil {
				t.one(r)
				select {
				case <-ctx.Done():
				case <-time.After(time.Duration(r.IntN(60)) * time.Millisecond):
				}
			}
		})
	}
	wg.Wait()
}

// requestTimeout bounds one request: the hold budget and then some.
const requestTimeout = 45 * time.Second

// one sends one request drawn from r and records it.
func (t *traffic) one(r *rand.Rand) {
	t.mu.Lock()
	t.n++
	n := t.n
	t.mu.Unlock()
	q := Request{N: n, Surface: "messages", Model: messagesModel, Stream: r.IntN(10) < 6}
	if r.IntN(100) < 35 {
		q.Surface, q.Model = "responses", responsesModel
	}
	marker := fmt.Sprintf("chaos seed %d request %d %016x", t.seed, n, r.Uint64())
	sessionInBody := false
	if r.IntN(10) < 3 {
		q.Session = fmt.Sprintf("chaos-%d-session-%d", t.seed, r.IntN(6))
		sessionInBody = r.IntN(2) == 0
	}
	if x := r.IntN(100); x < 6 {
		q.Cancel, q.CancelAfter = "mid_request", time.Duration(20+r.IntN(400))*time.Millisecond
	} else if x < 12 && q.Stream {
		q.Cancel = "mid_stream"
	}
	body := requestBody(q, marker, sessionInBody)
	sum := sha256.Sum256(body)
	q.SHA = hex.EncodeToString(sum[:])

	// A worker that is up, as a load balancer would pick.
	var p *proc
	for range 2 * len(t.workers) {
		w := r.IntN(len(t.workers))
		if p, q.Incarnation = t.workers[w].current(); p != nil {
			q.Worker = w
			break
		}
	}
	q.Start = time.Since(t.start)
	if p == nil {
		q.Outcome, q.Detail, q.End = OutcomeRefused, "no worker up", q.Start
		t.record(q)
		return
	}
	t.send(p.URL, body, &q, sessionInBody)
	q.End = time.Since(t.start)
	t.record(q)
}

func (t *traffic) record(q Request) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reqs = append(t.reqs, q)
}

// shift moves the times recorded so far d earlier: the start moved d
// later.
func (t *traffic) shift(d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.reqs {
		t.reqs[i].Start -= d
		t.reqs[i].End -= d
	}
}

func (t *traffic) requests() []Request {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Request(nil), t.reqs...)
}

// requestBody is q's body, carrying marker (so that its SHA-256 is its
// own) and, when sessionInBody, its session: Claude Code's
// metadata.user_id or Codex's prompt_cache_key.
func requestBody(q Request, marker string, sessionInBody bool) []byte {
	m := map[string]any{"model": q.Model}
	if q.Stream {
		m["stream"] = true
	}
	if q.Surface == "messages" {
		m["max_tokens"] = 256
		m["messages"] = []map[string]string{{"role": "user", "content": marker}}
		if q.Session != "" && sessionInBody {
			m["metadata"] = map[string]string{"user_id": "user_chaos_account__session_" + q.Session}
		}
	} else {
		m["input"] = marker
		if q.Session != "" && sessionInBody {
			m["prompt_cache_key"] = q.Session
		}
	}
	b, _ := json.Marshal(m)
	return b
}

// send makes the request and reads its answer into q.
func (t *traffic) send(url string, body []byte, q *Request, sessionInBody bool) {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	var cancelled atomic.Bool
	cancelNow := func() { cancelled.Store(true); cancel() }
	if q.Cancel == "mid_request" {
		timer := time.AfterFunc(q.CancelAfter, func() { cancelNow() })
		defer timer.Stop()
	}
	path := "/v1/messages"
	if q.Surface == "responses" {
		path = "/v1/responses"
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if q.Surface == "messages" {
		req.Header.Set("X-Api-Key", t.key)
		req.Header.Set("Anthropic-Version", "2023-06-01")
		if q.Stream {
			req.Header.Set(sim.StreamHeader, fmt.Sprintf("%dx%s", simDeltas, simDeltaDelay))
		}
		if q.Session != "" && !sessionInBody {
			req.Header.Set("X-Claude-Code-Session-Id", q.Session)
		}
	} else {
		req.Header.Set("Authorization", "Bearer "+t.key)
		if q.Session != "" && !sessionInBody {
			req.Header.Set("Session_id", q.Session)
		}
	}
	res, err := t.client(url).Do(req)
	if err != nil {
		t.transportFailure(q, err, cancelled.Load())
		return
	}
	defer res.Body.Close()
	q.Status, q.RequestID = res.StatusCode, res.Header.Get("Weir-Request-Id")
	if res.StatusCode != http.StatusOK {
		q.Claim = res.Header.Get("Anthropic-Ratelimit-Unified-Representative-Claim")
		q.Final = res.Header.Get("X-Should-Retry") == "false"
		b, err := io.ReadAll(io.LimitReader(res.Body, 64<<10))
		if err != nil {
			t.transportFailure(q, err, cancelled.Load())
			return
		}
		q.Outcome, q.ErrType, q.Terminals = OutcomeError, errorType(b), 1
		return
	}
	if !q.Stream {
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.transportFailure(q, err, cancelled.Load())
			return
		}
		if !json.Valid(b) {
			q.Outcome, q.Detail = OutcomeCut, "a 200 whose body is not JSON"
			return
		}
		q.Outcome, q.Terminals, q.Output = OutcomeOK, 1, true
		return
	}
	t.readStream(res.Body, q, cancelNow, &cancelled)
}

// readStream reads an event stream to its end, counting final events.
func (t *traffic) readStream(body io.Reader, q *Request, cancelNow func(), cancelled *atomic.Bool) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var failed bool
	for sc.Scan() {
		line := sc.Text()
		ev, ok := strings.CutPrefix(line, "event: ")
		if !ok {
			if d, ok := strings.CutPrefix(line, "data: "); ok && failed && q.ErrType == "" {
				q.ErrType = errorType([]byte(d))
			}
			continue
		}
		switch ev {
		case "content_block_delta", "response.output_text.delta":
			if !q.Output {
				q.Output = true
				if q.Cancel == "mid_stream" {
					cancelNow()
				}
			}
		case "message_stop", "response.completed":
			q.Terminals++
		case "error", "response.failed":
			q.Terminals++
			failed = true
		}
	}
	switch {
	case cancelled.Load():
		q.Outcome = OutcomeCancelled
	case q.Terminals > 1:
		q.Outcome = OutcomeTwice
	case q.Terminals == 1 && failed:
		q.Outcome = OutcomeError
	case q.Terminals == 1:
		q.Outcome = OutcomeOK
	default:
		q.Outcome, q.Detail = OutcomeCut, "stream ended without a final event"
		if err := sc.Err(); err != nil {
			q.Detail += ": " + short(err)
		}
	}
}

func (t *traffic) transportFailure(q *Request, err error, cancelled bool) {
	switch {
	case cancelled:
		q.Outcome = OutcomeCancelled
	case errors.Is(err, syscall.ECONNREFUSED):
		q.Outcome = OutcomeRefused
	default:
		q.Outcome, q.Detail = OutcomeCut, short(err)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			q.Detail = "client timeout: " + q.Detail
		}
	}
}

func short(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 && len(s) > 80 {
		s = s[i+2:]
	}
	return s
}

// errorType reads an Anthropic or OpenAI error body's type (or code).
func errorType(b []byte) string {
	var e struct {
		Error struct {
			Type string `json:"type"`
			Code string `json:"code"`
		} `json:"error"`
		Response struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		} `json:"response"`
	}
	if json.Unmarshal(b, &e) != nil {
		return ""
	}
	switch {
	case e.Error.Type != "":
		return e.Error.Type
	case e.Error.Code != "":
		return e.Error.Code
	}
	return e.Response.Error.Code
}

// prime sends one request of each surface through every worker until it
// is answered (up to 15 s each): the keys are verified and cached, the
// workers know their control plane. Priming requests are recorded like
// the rest, before the start.
func (t *traffic) prime(ctx context.Context) error {
	r := rand.New(rand.NewPCG(t.seed, 0))
	for w, s := range t.workers {
		for _, surface := range []string{"messages", "responses"} {
			deadline := time.Now().Add(15 * time.Second)
			for {
				p, inc := s.current()
				t.mu.Lock()
				t.n++
				q := Request{N: t.n, Surface: surface, Model: messagesModel, Worker: w, Incarnation: inc}
				t.mu.Unlock()
				if surface == "responses" {
					q.Model = responsesModel
				}
				body := requestBody(q, fmt.Sprintf("chaos seed %d priming %d %016x", t.seed, q.N, r.Uint64()), false)
				sum := sha256.Sum256(body)
				q.SHA = hex.EncodeToString(sum[:])
				q.Start = time.Since(t.start)
				t.send(p.URL, body, &q, false)
				q.End = time.Since(t.start)
				t.record(q)
				if q.Outcome == OutcomeOK {
					break
				}
				if time.Now().After(deadline) || ctx.Err() != nil {
					return fmt.Errorf("priming worker %d: %s", w, q)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
	}
	return nil
}
