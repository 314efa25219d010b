package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/weirhq/weir/dataplane"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/randid"
)

// TestAbsurdMaxTokens: a max_tokens the upstream refuses is the client's
// error. weir does not read max_tokens itself (it knows no model's limit
// and the upstream words the refusal best), so the request takes one
// upstream attempt and the upstream's 400 reaches the client unchanged;
// the account is neither cooled nor failed over from.
func TestAbsurdMaxTokens(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: pair()})
	for i, v := range []string{"1000000000000", "-1", "1.5", `"lots"`} {
		body := `{"model":"` + model + `","max_tokens":` + v + `,"messages":[{"role":"user","content":"hi"}]}`
		r := e.do(http.MethodPost, "/v1/messages", body, nil)
		if r.status != http.StatusBadRequest {
			t.Fatalf("max_tokens %s: status %d: %s", v, r.status, r.body)
		}
		xs := e.upstream.exchanges()
		if len(xs) != i+1 || !bytes.Equal(r.body, xs[i].body) {
			t.Fatalf("max_tokens %s: %d upstream requests, body %s; want one more, passed on unchanged", v, len(xs), r.body)
		}
		if ae := decodeError(t, r.body); ae.Error.Type != "invalid_request_error" || !strings.HasPrefix(ae.Error.Message, "max_tokens: ") {
			t.Errorf("max_tokens %s: error %+v, want invalid_request_error naming max_tokens", v, ae)
		}
		if r.header.Get("Retry-After") != "" {
			t.Errorf("max_tokens %s: Retry-After %q on a client error", v, r.header.Get("Retry-After"))
		}
		ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
		if ev.Status != 400 || ev.Attempts != 1 || ev.AccountId != e.ids["first"] || ev.ErrorType != "invalid_request_error" {
			t.Errorf("max_tokens %s: route event = %v", v, ev)
		}
	}
	for _, a := range e.attempts() {
		if a != "first:invalid_request:400" {
			t.Errorf("attempts = %v, want every one on first, refused", e.attempts())
			break
		}
	}
	if cd := e.account("first").GetCooldown(); cd != nil {
		t.Errorf("first is cooling after a client error: %v", cd)
	}
	e.leasesReleased()
}

// openAIErrorBody checks that body is exactly OpenAI's error shape
// {"error":{"message","type","param","code"}} and returns its type.
func openAIErrorBody(t *testing.T, body []byte) (typ, message string) {
	t.Helper()
	var top map[string]map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || len(top) != 1 || len(top["error"]) != 4 {
		t.Fatalf("not an OpenAI error body: %s", body)
	}
	e := top["error"]
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := e[k]; !ok {
			t.Fatalf("OpenAI error body without %s: %s", k, body)
		}
	}
	json.Unmarshal(e["type"], &typ)        //nolint:errcheck // checked by the caller
	json.Unmarshal(e["message"], &message) //nolint:errcheck // as above
	return typ, message
}

// TestUnknownPathsAndMethods: weir answers a path it does not serve with
// a 404, and a method a path does not take with a 405 and Allow, in the
// wire format of the path (OpenAI's under OpenAI's own resources,
// Anthropic's elsewhere); a path with . or .. segments is a 404, not a
// redirect to somewhere else. Nothing is leased, nothing goes upstream.
func TestUnknownPathsAndMethods(t *testing.T) {
	t.Parallel()
	cpReg := prometheus.NewRegistry()
	e := setup(t, options{accounts: []account{{label: "api-1"}}, cpRegistry: cpReg})
	tests := []struct {
		method, path string
		status       int
		openAI       bool
		allow        string
	}{
		{method: "GET", path: "/v1/messages", status: 405, allow: "POST"},
		{method: "PUT", path: "/v1/messages/count_tokens", status: 405, allow: "POST"},
		{method: "DELETE", path: "/v1/responses", status: 405, openAI: true, allow: "POST"},
		{method: "GET", path: "/v1/chat/completions", status: 405, openAI: true, allow: "POST"},
		{method: "POST", path: "/v1/nonexistent", status: 404},
		{method: "POST", path: "/v1/messages/", status: 404},
		{method: "POST", path: "/v1/responses/resp_123/cancel", status: 404, openAI: true},
		{method: "POST", path: "/v1/completions", status: 404, openAI: true},
		{method: "GET", path: "/v1/../etc/passwd", status: 404},
		{method: "POST", path: "/v1/messages/../messages", status: 404},
		{method: "POST", path: "/v1/responses/../responses", status: 404, openAI: true},
		{method: "POST", path: "//v1/messages", status: 404},
		{method: "POST", path: "/v1/%2e%2e/messages", status: 404},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			t.Parallel()
			r := e.do(tt.method, tt.path, messagesBody(false), nil)
			if r.status != tt.status {
				t.Fatalf("status = %d, want %d: %s", r.status, tt.status, r.body)
			}
			if got := r.header.Get("Allow"); got != tt.allow {
				t.Errorf("Allow = %q, want %q", got, tt.allow)
			}
			if r.header.Get("X-Should-Retry") != "false" {
				t.Errorf("X-Should-Retry = %q, want false", r.header.Get("X-Should-Retry"))
			}
			if tt.openAI {
				if typ, msg := openAIErrorBody(t, r.body); typ != "invalid_request_error" || !strings.Contains(msg, tt.method) {
					t.Errorf("error type %q message %q", typ, msg)
				}
				return
			}
			want := "not_found_error"
			if tt.status == 405 {
				want = "invalid_request_error"
			}
			weirError(t, r, tt.status, want)
		})
	}
	t.Cleanup(func() {
		if n := len(e.sim.Attempts()); n != 0 {
			t.Errorf("simulator saw %d attempts: %v", n, e.attempts())
		}
		if n := metricValue(t, cpReg, "weir_controlplane_acquire_seconds", nil); n != 0 {
			t.Errorf("%v Acquires for requests weir does not serve", n)
		}
	})
}

// servedDataplane runs a worker of its own against e's control plane the
// way the binary does (Server.Serve), on a listener that counts the open
// connections; edit changes its config first.
func servedDataplane(t *testing.T, e *env, edit func(*dataplane.Config)) (url string, open *atomic.Int64) {
	t.Helper()
	cfg := dataplane.Config{ControlPlaneURL: e.cpSrv.URL, Token: e.dpToken, Logger: e.opts.logger(),
		KeyCacheTTL: 50 * time.Millisecond, CapacityHold: -1}
	edit(&cfg)
	dp, err := dataplane.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln, open: new(atomic.Int64)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dp.Serve(ctx, cl) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		dp.Close(cctx)
	})
	return "http://" + ln.Addr().String(), cl.open
}

// countingListener counts the connections it accepted that are not yet
// closed.
type countingListener struct {
	net.Listener
	open *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.open.Add(1)
	return &countedConn{Conn: c, open: l.open}, nil
}

type countedConn struct {
	net.Conn
	open   *atomic.Int64
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.open.Add(-1)
	}
	return c.Conn.Close()
}

// rawRequest writes req on a fresh TCP connection, then stops sending,
// and returns the status of the answer, or 0 when the server closed the
// connection without one. It fails the test when the server leaves the
// connection open for 5s.
func rawRequest(t *testing.T, url, req string) int {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	conn.SetReadDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck // a bound on the test
	br := bufio.NewReader(conn)
	status := 0
	if res, err := http.ReadResponse(br, nil); err == nil {
		io.Copy(io.Discard, res.Body) //nolint:errcheck // only the close matters
		res.Body.Close()
		status = res.StatusCode
	}
	// Whatever the answer, the server must then close the connection.
	_, err = br.ReadByte()
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		t.Fatal("the server kept a stalled connection open for 5s")
	}
	return status
}

// TestSlowLorisHeaders: a client that sends part of its request line and
// headers and stalls is disconnected after ReadHeaderTimeout, without
// holding anything; no request was started for it.
func TestSlowLorisHeaders(t *testing.T) {
	t.Parallel()
	const timeout = 200 * time.Millisecond
	cpReg := prometheus.NewRegistry()
	e := setup(t, options{accounts: []account{{label: "api-1"}}, cpRegistry: cpReg})
	url, open := servedDataplane(t, e, func(c *dataplane.Config) { c.ReadHeaderTimeout = timeout })
	for _, partial := range []string{"POST /v1/mess", "POST /v1/messages HTTP/1.1\r\nHost: weir\r\nX-Api-Key: " + e.key[:8]} {
		start := time.Now()
		// net/http answers a request cut short by the timeout with its
		// own plain-text 400 (no handler ran, so not in a wire format)
		// and closes.
		if status := rawRequest(t, url, partial); status != 0 && status != http.StatusBadRequest {
			t.Errorf("%q: answered %d, want the connection closed", partial, status)
		}
		if took := time.Since(start); took < timeout/2 {
			t.Errorf("%q: closed after %v, before the %v timeout", partial, took, timeout)
		}
	}
	eventually(t, "no connection open", func() bool { return open.Load() == 0 })
	// The server still serves whoever sends a whole request.
	if r := e.doWith(http.DefaultClient, url, http.MethodPost, "/v1/messages", messagesBody(false), nil); r.status != http.StatusOK {
		t.Errorf("a whole request: %d %s", r.status, r.body)
	}
	if got := e.attempts(); len(got) != 1 {
		t.Errorf("attempts = %v, want only the whole request's", got)
	}
}

// TestBadInputLeavesNothing: each bad input, weir's own refusals and the
// upstream's, leaves nothing behind once answered: no lease in flight, no
// open connection on the server, no goroutine more than before. The
// cases are TestBadInput's kinds and this file's.
//
// Not parallel: it counts the process's goroutines, which other tests
// running at the same time would move.
func TestBadInputLeavesNothing(t *testing.T) {
	const timeout = 300 * time.Millisecond
	cpReg := prometheus.NewRegistry()
	e := setup(t, options{accounts: []account{{label: "api-1"}}, cpRegistry: cpReg})
	url, open := servedDataplane(t, e, func(c *dataplane.Config) {
		c.MaxBodyBytes, c.ReadHeaderTimeout, c.BodyReadTimeout = 1<<10, timeout, timeout
	})
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	send := func(method, path, body string, edit func(*http.Request)) func(*testing.T) int {
		return func(t *testing.T) int { return e.doWith(client, url, method, path, body, edit).status }
	}
	big := `{"model":"` + model + `","max_tokens":8,"messages":[{"role":"user","content":"` + strings.Repeat("a", 2<<10) + `"}]}`
	stalled := `{"model":"` + model + `","max_tokens":8,"messages":[]}`
	tests := []struct {
		name     string
		send     func(*testing.T) int
		status   int
		upstream bool
	}{
		{"body not JSON", send("POST", "/v1/messages", "model=claude", nil), 400, false},
		{"body truncated JSON", send("POST", "/v1/messages", `{"model":"`+model+`",`, nil), 400, false},
		{"body not UTF-8", send("POST", "/v1/messages", `{"model":"`+model+"\xe9\"}", nil), 400, false},
		{"model missing", send("POST", "/v1/messages", `{"max_tokens":8}`, nil), 400, false},
		{"body over the limit", send("POST", "/v1/messages", big, nil), 413, false},
		{"body over the limit, chunked", send("POST", "/v1/messages", big, func(r *http.Request) {
			r.Body, r.ContentLength = io.NopCloser(strings.NewReader(big)), -1
		}), 413, false},
		{"no key", send("POST", "/v1/messages", messagesBody(false), func(r *http.Request) { r.Header.Del("X-Api-Key") }), 401, false},
		{"unknown key", send("POST", "/v1/messages", messagesBody(false), func(r *http.Request) { r.Header.Set("X-Api-Key", "weir_sk_"+randid.Hex(32)) }), 401, false},
		{"GET messages", send("GET", "/v1/messages", "", nil), 405, false},
		{"DELETE responses", send("DELETE", "/v1/responses", "", nil), 405, false},
		{"unknown path", send("POST", "/v1/nonexistent", messagesBody(false), nil), 404, false},
		{"dot-dot path", send("GET", "/v1/../etc/passwd", "", nil), 404, false},
		{"absurd max_tokens", send("POST", "/v1/messages", `{"model":"`+model+`","max_tokens":1000000000000,"messages":[{"role":"user","content":"hi"}]}`, nil), 400, true},
		{"stalled body", func(t *testing.T) int {
			return rawRequest(t, url, "POST /v1/messages HTTP/1.1\r\nHost: weir\r\nContent-Type: application/json\r\nX-Api-Key: "+e.key+
				"\r\nAnthropic-Version: 2023-06-01\r\nContent-Length: "+strconv.Itoa(len(stalled))+"\r\n\r\n"+stalled[:10])
		}, 408, false},
		{"slow-loris headers", func(t *testing.T) int {
			return rawRequest(t, url, "POST /v1/messages HTTP/1.1\r\nHost: weir\r\nX-Api-")
		}, 400, false},
	}
	// A good request first, so that what a worker starts once (its pool
	// watch, the keeper, the reporter, the upstream connection) runs
	// before the count.
	if status := send("POST", "/v1/messages", messagesBody(false), nil)(t); status != 200 {
		t.Fatalf("good request: %d", status)
	}
	client.CloseIdleConnections()
	e.leasesReleased()
	eventually(t, "no connection open", func() bool { return open.Load() == 0 })
	base := settledGoroutines()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			acquires := metricValue(t, cpReg, "weir_controlplane_acquire_seconds", nil)
			attempts := len(e.sim.Attempts())
			if status := tt.send(t); status != tt.status {
				t.Fatalf("status = %d, want %d", status, tt.status)
			}
			client.CloseIdleConnections()
			e.leasesReleased()
			eventually(t, "no connection open", func() bool { return open.Load() == 0 })
			var n int
			eventually(t, "goroutines back to "+strconv.Itoa(base), func() bool {
				n = runtime.NumGoroutine()
				return n <= base+goroutineSlack
			})
			upstream := len(e.sim.Attempts()) - attempts
			leased := metricValue(t, cpReg, "weir_controlplane_acquire_seconds", nil) - acquires
			if tt.upstream != (upstream == 1) || upstream > 1 || !tt.upstream && leased != 0 {
				t.Errorf("%d upstream attempts and %v Acquires; upstream expected: %v", upstream, leased, tt.upstream)
			}
		})
	}
}

// goroutineSlack absorbs the runtime's and the pools' own comings and
// goings (a timer's goroutine, a connection being torn down).
const goroutineSlack = 3

// settledGoroutines is the goroutine count once it stopped falling
// (sampled every 20ms, for at most a second).
func settledGoroutines() int {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	n := runtime.NumGoroutine()
	for range 50 {
		<-tick.C
		m := runtime.NumGoroutine()
		if m >= n {
			return n
		}
		n = m
	}
	return n
}

// openBody starts a request on a fresh connection to e's worker: its
// headers with Content-Length length (chunked when length < 0), and the
// first sent bytes of a body that would be that long, then nothing more.
// The connection is closed with the test.
func (e *env) openBody(path, key string, length, sent int) (net.Conn, *bufio.Reader) {
	e.t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.dpSrv.URL, "http://"))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(waitFor)) //nolint:errcheck // a bound on the test, not the behaviour
	auth := "X-Api-Key: " + key + "\r\nAnthropic-Version: 2023-06-01"
	if path != "/v1/messages" {
		auth = "Authorization: Bearer " + key
	}
	framing := "Content-Length: " + strconv.Itoa(length)
	if length < 0 {
		framing = "Transfer-Encoding: chunked"
	}
	head := "POST " + path + " HTTP/1.1\r\nHost: weir\r\nContent-Type: application/json\r\n" + auth + "\r\n" + framing + "\r\n\r\n"
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"` + strings.Repeat("a", max(sent, 64)) + `"}]}`
	if _, err := io.WriteString(conn, head+body[:sent]); err != nil {
		e.t.Fatal(err)
	}
	return conn, bufio.NewReader(conn)
}

// readAnswer reads the answer to a request openBody started.
func readAnswer(t *testing.T, br *bufio.Reader) response {
	t.Helper()
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return response{status: res.StatusCode, header: res.Header, body: b}
}

// TestBodyBuffer: the request-body bytes a worker buffers are bounded per
// key and in all. A body is reserved before it is read (its Content-Length
// at once, a chunked one as its buffer grows), so the clients that send
// large bodies and withhold their end hold at most the bound; the request
// that does not fit gets a 429 (its key's bound) or a 503 (the worker's),
// in its wire format, with Retry-After, before its body is read; nothing
// is leased for it and nothing reaches the upstream. What was reserved is
// given back when the request ends.
func TestBodyBuffer(t *testing.T) {
	t.Parallel()
	cpReg := prometheus.NewRegistry()
	e := setup(t, options{cpRegistry: cpReg, accounts: []account{{label: "api-1"}}})
	const perKey, total = 2 << 20, 3 << 20
	if _, err := e.settings.UpdateSettings(t.Context(), connect.NewRequest(&weirv1.UpdateSettingsRequest{
		Settings:   &weirv1.Settings{BodyBufferBytes: total, BodyBufferPerKeyBytes: perKey},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"body_buffer_bytes", "body_buffer_per_key_bytes"}},
	})); err != nil {
		t.Fatal(err)
	}
	// The worker reads the settings at start; a fresh one is sure to have.
	_, srv := e.newDataplane(nil)
	e.dpSrv, e.client = srv, srv.Client()
	reg := e.workerRegs[len(e.workerRegs)-1]
	buffered := func() float64 { return metricValue(t, reg, "weir_dataplane_request_body_buffer_bytes", nil) }
	refusals := func(scope string) float64 {
		return metricValue(t, reg, "weir_dataplane_request_body_buffer_refusals_total", map[string]string{"scope": scope})
	}
	other := e.restrictedKey(&weirv1.CreateKeyRequest{})
	third := e.restrictedKey(&weirv1.CreateKeyRequest{})

	// Two stalled bodies of one key: 1.5 MiB reserved, then 0.5 MiB more.
	stalled1, _ := e.openBody("/v1/messages", e.key, 1536<<10, 1000)
	eventually(t, "the first body reserved", func() bool { return buffered() == 1536<<10 })
	e.openBody("/v1/messages", e.key, 512<<10, 1000)
	eventually(t, "the second body reserved", func() bool { return buffered() == 2<<20 })

	// The key's next request does not fit its bound: a 429 at once, its
	// body never sent.
	_, br := e.openBody("/v1/messages", e.key, 1000, 0)
	r := readAnswer(t, br)
	if ae := weirError(t, r, http.StatusTooManyRequests, "rate_limit_error"); !strings.Contains(ae.Error.Message, "this weir key's requests already hold") {
		t.Errorf("key bound: %q", ae.Error.Message)
	}
	if r.header.Get("Retry-After") == "" {
		t.Error("key bound: no Retry-After")
	}
	// A chunked body of the key is refused as its buffer grows past the
	// bound, in the OpenAI format on an OpenAI surface.
	conn, br := e.openBody("/v1/responses", e.key, -1, 0)
	go func() {
		chunk := fmt.Sprintf("%x\r\n%s\r\n", 32<<10, strings.Repeat("b", 32<<10))
		for range 64 {
			if _, err := io.WriteString(conn, chunk); err != nil {
				return
			}
		}
	}()
	r = readAnswer(t, br)
	if typ, code, msg := openAIError(t, r, http.StatusTooManyRequests); typ != "rate_limit_exceeded" || code != "rate_limit_exceeded" || !strings.Contains(msg, "weir's bound") {
		t.Errorf("chunked, key bound: %s %s %q", typ, code, msg)
	}

	// Another key fits its own bound, until the worker's is reached.
	e.openBody("/v1/messages", other, 768<<10, 1000)
	eventually(t, "the other key's body reserved", func() bool { return buffered() == 2816<<10 })
	_, br = e.openBody("/v1/chat/completions", third, 512<<10, 0)
	r = readAnswer(t, br)
	if typ, code, msg := openAIError(t, r, http.StatusServiceUnavailable); typ != "server_error" || code != "server_is_overloaded" || !strings.Contains(msg, "this worker already holds") {
		t.Errorf("worker bound: %s %s %q", typ, code, msg)
	}
	if r.header.Get("Retry-After") == "" {
		t.Error("worker bound: no Retry-After")
	}
	// A body larger than a bound by itself can never fit: a 413.
	_, br = e.openBody("/v1/messages", third, perKey+1, 0)
	weirError(t, readAnswer(t, br), http.StatusRequestEntityTooLarge, "request_too_large")

	if refusals("key") != 2 || refusals("worker") != 1 || refusals("over_bound") != 1 {
		t.Errorf("refusals: key %v, worker %v, over_bound %v", refusals("key"), refusals("worker"), refusals("over_bound"))
	}
	if n := metricValue(t, cpReg, "weir_controlplane_acquire_seconds", nil); n != 0 {
		t.Errorf("%v Acquires for bodies never read or refused", n)
	}
	if a := e.sim.Attempts(); len(a) != 0 {
		t.Errorf("the upstream saw %v", a)
	}

	// A client that gives up gives its reservation back; the others keep
	// theirs until they end too.
	stalled1.Close()
	eventually(t, "the first body's reservation back", func() bool { return buffered() == 1280<<10 })
	if r := e.post(false); r.status != http.StatusOK {
		t.Fatalf("a request that fits: %d %s", r.status, r.body)
	}
	// The served request's body goes back as its handler ends, a moment
	// after its answer reached the client.
	eventually(t, "only the stalled bodies reserved after a served request", func() bool { return buffered() == 1280<<10 })
}

// TestBodyBufferReleasedAtOutput: a request's body stays reserved while
// it may still be replayed (its attempt waits for the upstream's answer)
// and is given back when output starts, although the stream runs on.
func TestBodyBufferReleasedAtOutput(t *testing.T) {
	t.Parallel()
	answer, more := make(chan struct{}), make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck // test upstream
		<-answer
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":1}}}\n\n"+ //nolint:errcheck // test upstream
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n")
		w.(http.Flusher).Flush()
		<-more
		io.WriteString(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") //nolint:errcheck // test upstream
	}))
	t.Cleanup(func() { closeServer(upstream) })
	e := setup(t, options{accounts: []account{{label: "held", baseURL: upstream.URL}}})
	buffered := func() float64 { return metricValue(t, e.dpReg, "weir_dataplane_request_body_buffer_bytes", nil) }
	body := messagesBody(true)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.dpSrv.URL+"/v1/messages", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", e.key)
	done := make(chan *http.Response, 1)
	go func() {
		res, err := e.client.Do(req)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	eventually(t, "the body reserved while the attempt waits", func() bool { return buffered() == float64(len(body)) })
	close(answer)
	res := <-done
	if res == nil {
		t.FailNow()
	}
	defer res.Body.Close()
	eventually(t, "the body given back once output started", func() bool { return buffered() == 0 })
	close(more)
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK || !strings.Contains(string(b), "message_stop") {
		t.Errorf("stream: %d %s", res.StatusCode, b)
	}
}

// TestRateLimitBeforeBody: a key over its rate limit is refused before its
// body is read: the 429 comes at once for a request whose body never
// arrives, and nothing is reserved for it.
func TestRateLimitBeforeBody(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "api-1"}}})
	key := e.restrictedKey(&weirv1.CreateKeyRequest{RateLimitPerMinute: 1})
	if r := e.do(http.MethodPost, "/v1/messages", messagesBody(false), func(r *http.Request) { r.Header.Set("X-Api-Key", key) }); r.status != http.StatusOK {
		t.Fatalf("the minute's request: %d %s", r.status, r.body)
	}
	_, br := e.openBody("/v1/messages", key, 31<<20, 1000)
	r := readAnswer(t, br)
	if ae := weirError(t, r, http.StatusTooManyRequests, "rate_limit_error"); !strings.Contains(ae.Error.Message, "request limit (1 per minute)") {
		t.Errorf("message %q", ae.Error.Message)
	}
	if n := metricValue(t, e.dpReg, "weir_dataplane_request_body_buffer_bytes", nil); n != 0 {
		t.Errorf("%v bytes reserved for a body the key may not send", n)
	}
	if a := e.attempts(); len(a) != 1 {
		t.Errorf("attempts %v, want the first request's only", a)
	}
}
