package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirhq/weir/internal/sim"
)

// requestKind is one kind of the soak's mixed traffic.
type requestKind struct {
	name   string
	path   string
	stream bool
	// cancel: the client goes away after the first delta.
	cancel bool
	// sessions: a quarter of these carry a session header (affinity).
	sessions bool
	share    float64
}

// requestKinds is the mix; the shares add up to 1.
var requestKinds = []requestKind{
	{name: "messages", path: "/v1/messages", sessions: true, share: 0.35},
	{name: "messages stream", path: "/v1/messages", stream: true, sessions: true, share: 0.25},
	{name: "messages stream, cancelled", path: "/v1/messages", stream: true, cancel: true, share: 0.10},
	{name: "responses", path: "/v1/responses", share: 0.15},
	{name: "responses stream", path: "/v1/responses", stream: true, share: 0.15},
}

// soakSessions is how many sessions the session requests spread over.
const soakSessions = 32

// soakRequestTimeout bounds one request: long enough for a storm's holds.
const soakRequestTimeout = 2 * time.Minute

// soakRequest is request i of a run.
type soakRequest struct {
	kind requestKind
	// session is its session number, 0 for none.
	session int
	pace    sim.StreamPace
}

// pick draws request i's kind, session and stream shape from the seed.
func pick(seed uint64, i int) soakRequest {
	r := rand.New(rand.NewPCG(seed, uint64(i)))
	x := r.Float64()
	k := requestKinds[len(requestKinds)-1]
	for _, c := range requestKinds {
		if x < c.share {
			k = c
			break
		}
		x -= c.share
	}
	q := soakRequest{kind: k, pace: sim.StreamPace{Deltas: 8 + r.IntN(17), Delay: time.Duration(10+r.IntN(11)) * time.Millisecond}}
	if k.sessions && r.IntN(4) == 0 {
		q.session = 1 + r.IntN(soakSessions)
	}
	return q
}

const soakResponsesModel = "gpt-4.1-mini"

var (
	responsesPlain  = []byte(`{"model":"` + soakResponsesModel + `","input":"Say hello."}`)
	responsesStream = []byte(`{"model":"` + soakResponsesModel + `","input":"Say hello.","stream":true}`)
)

// Markers of a stream's first output and of its normal end, per surface.
var (
	responsesDelta = []byte("event: response.output_text.delta")
	responsesDone  = []byte("event: response.completed")
)

// Outcomes of one request as its client saw it.
const (
	outcomeOK        = "ok"
	outcomeCancelled = "cancelled"
	outcomeFailed    = "failed"
)

// reqResult is one request's outcome; a failure says what (its kind, for
// counting) and how (the first one's detail is listed).
type reqResult struct {
	outcome, what, detail string
}

func failed(what, detail string) reqResult {
	return reqResult{outcome: outcomeFailed, what: what, detail: detail}
}

// once sends q through worker w and reads the answer to its end (or, for
// a cancelling stream, to its first delta).
func (s *soak) once(ctx context.Context, w int, q soakRequest) reqResult {
	ctx, cancel := context.WithTimeout(ctx, soakRequestTimeout)
	defer cancel()
	messages := q.kind.path == "/v1/messages"
	body := requestBody(q.kind.stream)
	delta, done := deltaLine, stopLine
	if !messages {
		body, delta, done = responsesPlain, responsesDelta, responsesDone
		if q.kind.stream {
			body = responsesStream
		}
	}
	t := s.targets[w]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url+q.kind.path, bytes.NewReader(body))
	if err != nil {
		return failed("request", err.Error())
	}
	req.Header.Set("Content-Type", "application/json")
	if messages {
		req.Header.Set("X-Api-Key", t.key)
		req.Header.Set("Anthropic-Version", "2023-06-01")
		if q.kind.stream {
			req.Header.Set(sim.StreamHeader, q.pace.String())
		}
	} else {
		req.Header.Set("Authorization", "Bearer "+t.key)
	}
	if q.session > 0 {
		req.Header.Set("X-Claude-Code-Session-Id", fmt.Sprintf("soak-session-%d", q.session))
	}
	res, err := s.clients[w].Do(req)
	if err != nil {
		return failed(transportWhat(ctx, err), err.Error())
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 300))
		return failed("HTTP "+res.Status, strings.TrimSpace(string(b)))
	}
	if !q.kind.stream {
		if _, err := io.Copy(io.Discard, res.Body); err != nil {
			return failed("read body", err.Error())
		}
		return reqResult{outcome: outcomeOK}
	}
	// A stream is read to its end, as an agent does (leaving at the end
	// event would cancel the request in weir's eyes).
	br := bufio.NewReaderSize(res.Body, 4096)
	ended := false
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case bytes.HasPrefix(line, delta) && q.kind.cancel:
			cancel()
			return reqResult{outcome: outcomeCancelled}
		case bytes.HasPrefix(line, done):
			ended = true
		}
		switch {
		case err == bufio.ErrBufferFull:
		case err == io.EOF && ended:
			return reqResult{outcome: outcomeOK}
		case err == io.EOF:
			return failed("stream ended before its end event", "")
		case err != nil:
			return failed(transportWhat(ctx, err)+" mid-stream", err.Error())
		}
	}
}

// transportWhat names a failure before or during the answer.
func transportWhat(ctx context.Context, err error) string {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "transport error"
}

// Tally is what the clients saw.
type Tally struct {
	OK        int `json:"ok"`
	Cancelled int `json:"cancelled"`
	Failed    int `json:"failed"`
	// Served counts the successes per request kind (for the cancelling
	// kind, its cancellations); Sessions those sent with a session header.
	Served   map[string]int `json:"served"`
	Sessions int            `json:"sessions"`
	// StormServed and StormFailed count the requests due during a storm
	// (not those cancelled as planned).
	StormServed int `json:"storm_served"`
	StormFailed int `json:"storm_failed"`
	// Failures lists the failures by kind, most frequent first.
	Failures []Failure `json:"failures"`
}

// Failure is one kind of failure: how many, and the first one's detail.
type Failure struct {
	What  string `json:"what"`
	Count int    `json:"count"`
	First string `json:"first"`
}

type tally struct {
	flight atomic.Int64
	mu     sync.Mutex
	t      Tally
	byWhat map[string]*Failure
}

func newTally() *tally {
	return &tally{t: Tally{Served: map[string]int{}}, byWhat: map[string]*Failure{}}
}

func (t *tally) begin()        { t.flight.Add(1) }
func (t *tally) inFlight() int { return int(t.flight.Load()) }

// add counts a finished request; sent says it was begun (not dropped).
func (t *tally) add(q soakRequest, storm, sent bool, r reqResult) {
	if sent {
		t.flight.Add(-1)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch r.outcome {
	case outcomeOK:
		t.t.OK++
		t.t.Served[q.kind.name]++
		if q.session > 0 {
			t.t.Sessions++
		}
		if storm {
			t.t.StormServed++
		}
	case outcomeCancelled:
		t.t.Cancelled++
		t.t.Served[q.kind.name]++
	default:
		t.t.Failed++
		if storm {
			t.t.StormFailed++
		}
		what := q.kind.name + ": " + r.what
		f := t.byWhat[what]
		if f == nil {
			f = &Failure{What: what, First: r.detail}
			t.byWhat[what] = f
		}
		f.Count++
	}
}

func (t *tally) total() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.t.OK + t.t.Cancelled + t.t.Failed
}

// snapshot copies the tally.
func (t *tally) snapshot() Tally {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.t
	out.Served = make(map[string]int, len(t.t.Served))
	for k, v := range t.t.Served {
		out.Served[k] = v
	}
	out.Failures = nil
	for _, f := range t.byWhat {
		out.Failures = append(out.Failures, *f)
	}
	slices.SortFunc(out.Failures, func(a, b Failure) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), strings.Compare(a.What, b.What))
	})
	return out
}
