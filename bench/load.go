package bench

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/weirhq/weir/internal/sim"
)

const benchModel = "claude-sonnet-4-5-20250929"

// requestBody is a small Messages request.
func requestBody(stream bool) []byte { return requestBodyFor(benchModel, stream) }

// requestBodyFor is requestBody for model.
func requestBodyFor(model string, stream bool) []byte {
	b := `{"model":"` + model + `","max_tokens":64,"messages":[{"role":"user","content":"Say hello."}]`
	if stream {
		b += `,"stream":true`
	}
	return []byte(b + "}")
}

// chatModel is the translation steps' upstream model.
const chatModel = "gpt-4.1"

// chatBody is the Chat Completions request a translated requestBody
// becomes (as weir writes it: its usage asked of a stream).
func chatBody(stream bool) []byte {
	b := `{"model":"` + chatModel + `","max_completion_tokens":64,"messages":[{"role":"user","content":"Say hello."}]`
	if stream {
		b += `,"stream":true,"stream_options":{"include_usage":true}`
	}
	return []byte(b + "}")
}

// bodies are t's request bodies.
func (t target) bodies() (plain, stream []byte) {
	if t.plain != nil {
		return t.plain, t.stream
	}
	return plainBody, streamBody
}

var (
	plainBody  = requestBody(false)
	streamBody = requestBody(true)
)

// maxInFlight bounds one step's open requests: beyond it the target has
// fallen hopelessly behind, and a request is counted as an error instead
// of opening yet more connections.
const maxInFlight = 8000

// requestTimeout bounds one request; a timeout is an error.
const requestTimeout = 30 * time.Second

// loadClient is how the generator reaches one target: HTTP/1.1 like an
// agent, with enough idle connections that steady load reuses them.
func loadClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: maxInFlight,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}}
}

// streamPace is request i's stream shape: 20–64 deltas 10–20 ms apart,
// the same for every target (seeded by the run's seed and i).
func streamPace(seed uint64, i int) sim.StreamPace {
	r := rand.New(rand.NewPCG(seed, uint64(i)))
	return sim.StreamPace{Deltas: 20 + r.IntN(45), Delay: time.Duration(10+r.IntN(11)) * time.Millisecond}
}

// stepSamples is what one step measured; only requests due after the
// warm-up count. The apart mode's generator sends it as JSON.
type stepSamples struct {
	Latency []time.Duration `json:"latency_ns"`        // whole response, from the due time
	TTFB    []time.Duration `json:"ttfb_ns,omitempty"` // streams: first content_block_delta, from the due time
	Gaps    []time.Duration `json:"gaps_ns,omitempty"` // streams: each gap between deltas minus the pace's delay
	Sent    int             `json:"sent"`
	Errors  int64           `json:"errors"`
	// Served counts every request answered in full, warm-up included.
	Served int `json:"served"`
	// FirstError says why the first failed request failed.
	FirstError string `json:"first_error,omitempty"`
	// Measured is how many requests were due after the warm-up.
	Measured int `json:"measured"`
}

// load reduces the samples to what a report shows.
func (s *stepSamples) load() stepLoad {
	return stepLoad{Sent: s.Sent, Measured: s.Measured, Errors: s.Errors, FirstError: s.FirstError,
		Latency: summarize(s.Latency), TTFB: summarize(s.TTFB), Gap: summarize(s.Gaps)}
}

// drive runs one open-loop step against t and waits for its requests.
func drive(ctx context.Context, clk clock, c *http.Client, t target, rate int, warmup, d time.Duration, stream bool, seed uint64) *stepSamples {
	p := newPlan(clk.Now().Add(10*time.Millisecond), rate, warmup+d)
	warm := int(warmup / p.interval)
	out := &stepSamples{Measured: p.n - warm}
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		inFlight atomic.Int64
		errs     atomic.Int64
		served   atomic.Int64
	)
	out.Sent = p.run(ctx, clk, func(i int, due time.Time) {
		if inFlight.Load() >= maxInFlight {
			if i >= warm {
				errs.Add(1)
				mu.Lock()
				out.FirstError = cmp.Or(out.FirstError, "dropped: too many requests in flight")
				mu.Unlock()
			}
			return
		}
		inFlight.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer inFlight.Add(-1)
			var r result
			if stream {
				r = streamOnce(ctx, c, t, due, streamPace(seed, i))
			} else {
				r = plainOnce(ctx, c, t, due)
			}
			if r.ok {
				served.Add(1)
			}
			if i < warm {
				return
			}
			if !r.ok {
				errs.Add(1)
				mu.Lock()
				if out.FirstError == "" {
					out.FirstError = r.err
				}
				mu.Unlock()
				return
			}
			mu.Lock()
			out.Latency = append(out.Latency, r.latency)
			if stream {
				out.TTFB = append(out.TTFB, r.ttfb)
				out.Gaps = append(out.Gaps, r.gaps...)
			}
			mu.Unlock()
		}()
	})
	wg.Wait()
	out.Errors = errs.Load()
	out.Served = int(served.Load())
	return out
}

type result struct {
	ok            bool
	err           string // why not ok
	latency, ttfb time.Duration
	gaps          []time.Duration
}

func newRequest(ctx context.Context, t target, body []byte) (*http.Request, error) {
	path := "/v1/messages"
	if t.chat {
		path = "/v1/chat/completions"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	switch {
	case t.header != nil:
		req.Header.Set("Anthropic-Version", "2023-06-01")
		for k, vs := range t.header {
			req.Header[k] = vs
		}
	case t.chat:
		req.Header.Set("Authorization", "Bearer "+t.key)
	default:
		req.Header.Set("X-Api-Key", t.key)
		req.Header.Set("Anthropic-Version", "2023-06-01")
	}
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}

func plainOnce(ctx context.Context, c *http.Client, t target, due time.Time) result {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	plain, _ := t.bodies()
	req, err := newRequest(ctx, t, plain)
	if err != nil {
		return result{err: err.Error()}
	}
	res, err := c.Do(req)
	if err != nil {
		return result{err: err.Error()}
	}
	_, err = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	switch {
	case err != nil:
		return result{err: "read body: " + err.Error()}
	case res.StatusCode != http.StatusOK:
		return result{err: res.Status}
	}
	return result{ok: true, latency: time.Since(due)}
}

var (
	deltaLine = []byte("event: content_block_delta")
	stopLine  = []byte("event: message_stop")
	// A Chat stream's content chunk (not the role's, whose content is
	// empty) and its end.
	chatDelta = []byte(`"delta":{"content":"`)
	chatStop  = []byte("data: [DONE]")
)

// isDelta and isStop read a stream's line: a content delta, the end.
func (t target) isDelta(line []byte) bool {
	if t.chat {
		return bytes.Contains(line, chatDelta)
	}
	return bytes.HasPrefix(line, deltaLine)
}

func (t target) isStop(line []byte) bool {
	if t.chat {
		return bytes.HasPrefix(line, chatStop)
	}
	return bytes.HasPrefix(line, stopLine)
}

// paced: the simulator paces t's streams as its requests ask. The
// translation steps' streams have its default pace: a translated request
// carries no header of the client's, so neither does its reference.
func (t target) paced() bool { return t.plain == nil }

// streamOnce reads a stream event by event: its time to first token (the
// first content_block_delta) and how much later than the simulator's pace
// each following delta arrived.
func streamOnce(ctx context.Context, c *http.Client, t target, due time.Time, pace sim.StreamPace) result {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	_, body := t.bodies()
	req, err := newRequest(ctx, t, body)
	if err != nil {
		return result{err: err.Error()}
	}
	if t.paced() {
		req.Header.Set(sim.StreamHeader, pace.String())
	} else {
		pace = sim.StreamPace{Deltas: simDeltas, Delay: simDeltaDelay}
	}
	res, err := c.Do(req)
	if err != nil {
		return result{err: err.Error()}
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		io.Copy(io.Discard, res.Body) //nolint:errcheck // an error either way
		return result{err: res.Status}
	}
	r := result{gaps: make([]time.Duration, 0, pace.Deltas)}
	br := bufio.NewReaderSize(res.Body, 4096)
	var last time.Time
	for {
		line, err := br.ReadSlice('\n')
		if t.isDelta(line) {
			now := time.Now()
			if last.IsZero() {
				r.ttfb = now.Sub(due)
			} else {
				r.gaps = append(r.gaps, now.Sub(last)-pace.Delay)
			}
			last = now
		} else if t.isStop(line) {
			r.ok = true
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			if err != io.EOF {
				r.err = "read stream: " + err.Error()
			}
			break
		}
	}
	r.latency = time.Since(due)
	if !r.ok || last.IsZero() {
		r.ok = false
		r.err = cmp.Or(r.err, "stream ended without content or message_stop")
	}
	return r
}
