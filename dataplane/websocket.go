package dataplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// The Responses WebSocket transport: Codex (with supports_websockets on
// its provider) opens GET /v1/responses as a WebSocket and sends one
// text message per response, {"type":"response.create", …the POST body's
// fields}; the server answers each with the stream's events, one JSON
// text message per event, until response.completed, and the connection
// stays open for the next. A failure before any output is one wrapped
// error event, {"type":"error","status":S,"error":{…},"headers":{…}},
// which Codex reads as the HTTP answer S with those headers and body.
//
// Each message goes through the same path as a POST: key check, routing,
// holds, failover, usage limits, route event. The worker is the
// WebSocket's only end: upstreams are always spoken to over HTTP.

// isWebSocket says whether r asks to upgrade to a WebSocket.
func isWebSocket(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// wsHandshakeHeaders are the handshake's own; they do not belong to the
// requests made over the connection.
var wsHandshakeHeaders = []string{"Upgrade", "Connection", "Sec-Websocket-Key", "Sec-Websocket-Version",
	"Sec-Websocket-Extensions", "Sec-Websocket-Protocol"}

// A connection's messages are bounded like HTTP bodies: each is read
// frame by frame into a buffer whose every growth is reserved first in
// the worker's body buffer (bodybudget.go), under the handshake's key,
// within the idle and overall body timeouts (bodyClock); the reservation
// is the request's and is let go with its body. A message the buffer
// cannot take is answered (429, 503 or 413, as a wrapped error event)
// at once and the rest of it read and dropped, so the connection serves
// on; one that stops arriving is answered 408 and the connection closed.
// A connection holds at most two messages: one in service and the next,
// read meanwhile. And one key may hold at most MaxWebSocketsPerKey
// connections on a worker: past it the handshake gets a 429.

// serveResponsesWebSocket runs one Responses WebSocket connection.
func (s *Server) serveResponsesWebSocket(w http.ResponseWriter, r *http.Request) {
	requestID := newRequestID()
	refuse := func(reason string, apiErr *apiError, keyID string) {
		s.refusals.add(surfaceResp.name, keyID, reason)
		writeError(w, wireOpenAI, requestID, apiErr)
	}
	// The key is checked before the upgrade, so that a client with a wrong
	// key gets a plain 401 it can show, not a socket that closes.
	secret := clientKey(r)
	if secret == "" {
		refuse(refusalMissingKey, errAuthentication("missing API key: send your weir key as Authorization: Bearer"), "")
		return
	}
	keyHash := hashKey(secret)
	key, err := s.keys.verify(r.Context(), keyHash)
	if err != nil {
		if errors.Is(err, errKeyRejected) {
			refuse(refusalInvalidKey, errAuthentication("invalid API key"), "")
		} else {
			refuse(refusalUnverified, errControlPlane(), "")
		}
		return
	}
	// The handshake's headers go with every request made over the
	// connection: refused once, before the upgrade, as a plain answer.
	if apiErr := checkHeaders(r); apiErr != nil {
		refuse(refusalBadRequest, apiErr, key.id)
		return
	}
	if !s.sockets.open(keyHash, s.cfg.MaxWebSocketsPerKey) {
		refuse(refusalWebSocketLimit, errTooManySockets(s.cfg.MaxWebSocketsPerKey), key.id)
		return
	}
	defer s.sockets.close(keyHash)
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		// Agents connect from anywhere they run; the key, not the origin,
		// is what authenticates.
		InsecureSkipVerify: true,
		// Without context takeover a connection keeps no compressor of its
		// own between messages (with it, a 1.2 MB flate writer and a 32 KB
		// window for its whole life): what it compresses is the events
		// weir sends, most of them deltas too small to compress anyway.
		CompressionMode: websocket.CompressionNoContextTakeover,
	})
	if err != nil {
		return // Accept has answered the client
	}
	defer c.CloseNow() //nolint:errcheck // best effort
	// The library's own bound on a message, past which it closes the
	// connection (1009); the body buffer bounds what is held.
	c.SetReadLimit(s.cfg.MaxBodyBytes)

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	// One reader for the connection's life: it notices a client that left
	// while a response is under way (and cancels it), and reads the next
	// request meanwhile.
	msgs := make(chan wsMessage)
	go func() {
		defer cancel()
		for {
			msg, ok := s.readWSMessage(ctx, c, keyHash, key.id)
			if !ok {
				return
			}
			if msg.data == nil {
				continue // refused, answered already
			}
			select {
			case msgs <- msg:
			case <-ctx.Done():
				msg.hold.release()
				return
			}
		}
	}()
	header := r.Header.Clone()
	for _, h := range wsHandshakeHeaders {
		header.Del(h)
	}
	// The WebSocket beta names this connection's transport, not the HTTP
	// requests weir makes upstream.
	var betas []string
	for _, v := range header.Values("Openai-Beta") {
		if !strings.HasPrefix(strings.TrimSpace(v), "responses_websockets") {
			betas = append(betas, v)
		}
	}
	header.Del("Openai-Beta")
	for _, v := range betas {
		header.Add("Openai-Beta", v)
	}
	hist := &wsHistory{}
	for {
		select {
		case <-ctx.Done():
			c.Close(websocket.StatusNormalClosure, "") //nolint:errcheck // closing
			return
		case msg := <-msgs:
			ok := s.serveWebSocketMessage(ctx, c, r, header, msg, hist)
			msg.hold.release()
			if !ok {
				return
			}
		}
	}
}

// wsMessage is one message read whole, with its reservation.
type wsMessage struct {
	data []byte
	hold *bodyHold
}

// wsSlack is the room a message's buffer keeps past its bytes for the
// envelope's rewrite into the POST body (wsRequestBody), done in place.
const wsSlack = len(`,"stream":true}`)

// readWSMessage reads the connection's next message against the body
// buffer; false when the connection is done (the client left or closed,
// a message too large for the library, or one that stopped arriving,
// answered 408 first). A message the buffer refused is answered here, at
// once, and comes back without data.
func (s *Server) readWSMessage(ctx context.Context, c *websocket.Conn, keyHash, keyID string) (wsMessage, bool) {
	// The wait for a message has no timeout (a connection idles between
	// turns); its bytes, once the first frame came, have the body's.
	mctx, cut := context.WithCancel(ctx)
	defer cut()
	typ, rd, err := c.Reader(mctx)
	if err != nil {
		return wsMessage{}, false
	}
	if typ != websocket.MessageText {
		c.Close(websocket.StatusUnsupportedData, "text messages only") //nolint:errcheck // closing
		return wsMessage{}, false
	}
	clock := s.newBodyClock()
	var mu sync.Mutex
	answered := false
	timer := time.AfterFunc(time.Until(clock.next()), func() {
		// Stopped arriving, or trickled past the overall bound: answer,
		// then cut the read, which closes the connection (a message half
		// read leaves nothing to serve on).
		mu.Lock()
		if !answered {
			answered = true
			s.refusals.add(surfaceResp.name, keyID, refusalBodyTimeout)
			wctx, done := context.WithTimeout(ctx, 5*time.Second)
			sendAPIError(wctx, c, newRequestID(), clock.err()) //nolint:errcheck // closing anyway
			done()
		}
		mu.Unlock()
		cut()
	})
	defer timer.Stop()
	pr := &progressReader{r: rd, progress: func() { timer.Reset(time.Until(clock.next())) }}
	hold := &bodyHold{b: s.bodies, key: keyHash, lim: s.settings.get().body}
	data, err := readGrowing(pr, s.cfg.MaxBodyBytes, wsSlack, hold)
	mu.Lock()
	late := answered // the timer fired as the last bytes came
	answered = true
	mu.Unlock()
	if apiErr := bodyBufferError(err); apiErr != nil && !late {
		hold.release()
		// Answered at once; the rest of the message is read and dropped
		// (within the same timeouts, no byte kept), so that the
		// connection serves on.
		s.refusals.add(surfaceResp.name, keyID, refusalBodyBuffer)
		if sendAPIError(ctx, c, newRequestID(), apiErr) != nil {
			return wsMessage{}, false
		}
		if _, err := io.Copy(io.Discard, pr); err != nil {
			return wsMessage{}, false
		}
		return wsMessage{}, true
	}
	if err != nil || late {
		hold.release()
		return wsMessage{}, false
	}
	return wsMessage{data: data, hold: hold}, true
}

// progressReader calls progress after each read that brought bytes.
type progressReader struct {
	r        io.Reader
	progress func()
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.progress()
	}
	return n, err
}

// errTooManySockets refuses a handshake past the key's connection bound.
func errTooManySockets(limit int) *apiError {
	return &apiError{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "rate_limit_exceeded",
		retryAfter: wsRetry, message: fmt.Sprintf("weir: this weir key already has %d Responses WebSocket connections open "+
			"on this worker, its bound; close one, or send the request over HTTP. It is weir's bound, not the provider's.", limit)}
}

// wsRetry is the Retry-After of a refused handshake: connections close
// as their sessions end.
const wsRetry = 5 * time.Second

// socketCount counts each key's open WebSocket connections.
type socketCount struct {
	mu sync.Mutex
	m  map[string]int // by key hash
}

// open takes one of key's limit connections; false when none is left.
func (sc *socketCount) open(key string, limit int) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.m[key] >= limit {
		return false
	}
	sc.m[key]++
	return true
}

func (sc *socketCount) close(key string) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.m[key]--; sc.m[key] <= 0 {
		delete(sc.m, key)
	}
}

// wsPrereadKey carries a message's body, already read and reserved, to
// readBody (proxy.go), which takes it instead of reading a body.
type wsPrereadKey struct{}

type wsPreread struct {
	body []byte
	hold *bodyHold
	// history is the connection's conversation (wshistory.go).
	history *wsHistory
}

// serveWebSocketMessage serves one response.create; false ends the
// connection.
func (s *Server) serveWebSocketMessage(ctx context.Context, c *websocket.Conn, r *http.Request, header http.Header, msg wsMessage, hist *wsHistory) bool {
	body, model, warmup, err := wsRequestBody(msg.data)
	if err != nil {
		return sendWSError(ctx, c, http.StatusBadRequest, map[string]any{
			"type": "invalid_request_error", "message": err.Error(), "param": nil, "code": nil}, nil) == nil
	}
	if warmup {
		id, err := sendWarmup(ctx, c, model)
		// Codex's first turn continues the warm-up, whose input (its
		// instructions) is the conversation's start.
		hist.add(bytes.Clone(body), id, nil)
		return err == nil
	}
	// The history's own copy: the message's buffer goes back when it is
	// served.
	kept := bytes.Clone(body)
	pctx := context.WithValue(ctx, wsPrereadKey{}, &wsPreread{body: body, hold: msg.hold, history: hist})
	req, err := http.NewRequestWithContext(pctx, http.MethodPost, r.URL.Path, http.NoBody)
	if err != nil {
		return false
	}
	req.ContentLength = int64(len(body))
	req.Header = header.Clone()
	req.Header.Set("Content-Type", "application/json")
	req.RemoteAddr, req.Host = r.RemoteAddr, r.Host
	ww := &wsResponseWriter{ctx: ctx, c: c, header: http.Header{}}
	s.proxyHandler(surfaceResp)(ww, req)
	if err := ww.finish(); err != nil {
		return false
	}
	if id, output, ok := completedResponse(ww.completed); ok {
		hist.add(kept, id, output)
	}
	return ctx.Err() == nil
}

// sendAPIError sends weir's own error as a wrapped error event, in the
// OpenAI format a POST would have got.
func sendAPIError(ctx context.Context, c *websocket.Conn, requestID string, e *apiError) error {
	ww := &wsResponseWriter{ctx: ctx, c: c, header: http.Header{}}
	writeError(ww, wireOpenAI, requestID, e)
	return ww.finish()
}

// wsRequestBody turns a response.create message into the POST body: the
// same top-level fields, less the envelope, streamed. warmup is a message
// with "generate": false, which only prepares a connection (its body is
// the conversation's start all the same). The body is
// made in data's own buffer (wsSlack past its end is room enough), so a
// message costs no second copy of itself.
func wsRequestBody(data []byte) (body []byte, model string, warmup bool, err error) {
	// The envelope's fields are read exactly, as readBody reads the body's
	// (jsonhead.go): a second "type" or a "Generate" could mean one thing
	// here and another upstream. readBody then reads the body made of it.
	var typ string
	var generate *bool
	var modelp *string
	skip := func(dec *json.Decoder) error { return dec.Decode(&skipValue{}) }
	err = scanTop(data, map[string]fieldReader{
		"type":      stringField(&typ, "type"),
		"model":     func(dec *json.Decoder) error { return decodeField(dec, &modelp, "model") },
		"generate":  func(dec *json.Decoder) error { return decodeField(dec, &generate, "generate") },
		"stream_id": skip,
		"stream":    skip,
	})
	var he headError
	switch {
	case errors.Is(err, errNotObject):
		return nil, "", false, errors.New("message must be a JSON object")
	case errors.As(err, &he):
		return nil, "", false, errors.New(strings.Replace(he.Error(), "request body", "message", 1))
	case err != nil:
		return nil, "", false, errors.New("message is not valid JSON: " + jsonErrorText(err))
	}
	if modelp != nil {
		model = *modelp
	}
	if typ != "response.create" {
		return nil, "", false, errors.New(`unsupported event type; send {"type":"response.create", …}`)
	}
	return withoutEnvelope(data), model, generate != nil && !*generate, nil
}

// withoutEnvelope rewrites data, a JSON object scanTop accepted, in
// place: its members less type, stream_id and stream, then
// "stream":true. The members keep their order and bytes. Each kept
// member moves left or stays (it was preceded by at least the '{' or ','
// the output writes), so the copy never overtakes what it reads; the
// one tail it adds may pass data's end by wsSlack at most.
func withoutEnvelope(data []byte) []byte {
	out := data[:0]
	i := bytes.IndexByte(data, '{') + 1
	for {
		i = skipSpace(data, i)
		if i >= len(data) || data[i] == '}' {
			break
		}
		start := i
		keyEnd := stringEnd(data, i)
		var key string
		if err := json.Unmarshal(data[start:keyEnd], &key); err != nil {
			key = "" // scanTop read it; cannot happen
		}
		i = valueEnd(data, skipSpace(data, skipSpace(data, keyEnd)+1))
		member := data[start:i]
		i = skipSpace(data, i)
		if i < len(data) && data[i] == ',' {
			i++
		}
		if key == "type" || key == "stream_id" || key == "stream" {
			continue
		}
		if len(out) == 0 {
			out = append(out, '{')
		} else {
			out = append(out, ',')
		}
		out = append(out, member...) // a forward copy within the same array
	}
	if len(out) == 0 {
		return append(out, `{"stream":true}`...)
	}
	return append(out, `,"stream":true}`...)
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd is the index past the JSON string that starts at b[i].
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// valueEnd is the index past the JSON value that starts at b[i].
func valueEnd(b []byte, i int) int {
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			i = stringEnd(b, i)
			if depth == 0 {
				return i
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i // the enclosing object's end
			}
			if depth--; depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
		i++
	}
	return i
}

// sendWarmup answers a "generate": false message (Codex sends one to
// prepare a new connection): a response that generates nothing. It is
// answered here, not upstream: weir speaks HTTP to the upstream, where a
// warm-up has no meaning, and it would cost an account a request.
func sendWarmup(ctx context.Context, c *websocket.Conn, model string) (id string, err error) {
	id = "resp_" + strings.TrimPrefix(newRequestID(), "weir_")
	resp := map[string]any{"id": id, "object": "response", "created_at": 0, "model": model, "output": []any{}}
	for i, ev := range []struct {
		typ, status string
	}{{"response.created", "in_progress"}, {"response.completed", "completed"}} {
		resp["status"] = ev.status
		if ev.status == "completed" {
			resp["usage"] = map[string]int{"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
		}
		b, _ := json.Marshal(map[string]any{"type": ev.typ, "sequence_number": i, "response": resp})
		if err := c.Write(ctx, websocket.MessageText, b); err != nil {
			return id, err
		}
	}
	return id, nil
}

// sendWSError sends a wrapped error event, which Codex reads as the HTTP
// answer status with these headers and body.
func sendWSError(ctx context.Context, c *websocket.Conn, status int, errObj any, headers map[string]string) error {
	ev := map[string]any{"type": "error", "status": status, "error": errObj}
	if len(headers) > 0 {
		ev["headers"] = headers
	}
	b, _ := json.Marshal(ev)
	return c.Write(ctx, websocket.MessageText, b)
}

// wsResponseWriter takes what the proxy writes for one request and sends
// it over the WebSocket: each SSE event's data as one text message, or a
// plain (error) answer as one wrapped error event.
type wsResponseWriter struct {
	ctx    context.Context
	c      *websocket.Conn
	header http.Header
	status int
	stream bool
	buf    bytes.Buffer
	mu     sync.Mutex
	err    error
	// completed is the data of the response.completed event sent, if
	// one was: the connection's history keeps its output (wsHistory).
	completed []byte
}

func (w *wsResponseWriter) Header() http.Header { return w.header }

func (w *wsResponseWriter) WriteHeader(code int) {
	if w.status != 0 {
		return
	}
	w.status = code
	w.stream = code >= 200 && code < 300 && isEventStream(w.header)
}

func (w *wsResponseWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return 0, w.err
	}
	w.buf.Write(b)
	if w.stream {
		w.err = w.sendEvents()
	}
	return len(b), w.err
}

// FlushError lets http.ResponseController flush: events are sent as they
// complete, so there is nothing left to push, only an error to report.
func (w *wsResponseWriter) FlushError() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// sendEvents sends every complete SSE event in the buffer.
func (w *wsResponseWriter) sendEvents() error {
	for {
		raw := w.buf.Bytes()
		end, next := eventEnd(raw)
		if end < 0 {
			return nil
		}
		data := sseData(raw[:end])
		completed := sseName(raw[:end]) == "response.completed"
		w.buf.Next(next)
		if len(data) == 0 || bytes.Equal(data, []byte("[DONE]")) {
			continue
		}
		if completed {
			w.completed = bytes.Clone(data) // the connection's history keeps its output
		}
		if err := w.c.Write(w.ctx, websocket.MessageText, data); err != nil {
			return err
		}
	}
}

// eventEnd finds the blank line that ends the first event: the event's
// length and where the next begins; -1 when no event is complete.
func eventEnd(b []byte) (end, next int) {
	lf, crlf := bytes.Index(b, []byte("\n\n")), bytes.Index(b, []byte("\r\n\r\n"))
	switch {
	case lf < 0 && crlf < 0:
		return -1, 0
	case crlf >= 0 && (lf < 0 || crlf < lf):
		return crlf, crlf + 4
	}
	return lf, lf + 2
}

// sseName is an event's event: field ("" when it has none): read from the
// event's head, so that no event's data is searched.
func sseName(ev []byte) string {
	for len(ev) > 0 {
		line, rest, _ := bytes.Cut(ev, []byte("\n"))
		if v, ok := bytes.CutPrefix(bytes.TrimSuffix(line, []byte("\r")), []byte("event:")); ok {
			return string(bytes.TrimSpace(v))
		}
		if bytes.HasPrefix(line, []byte("data:")) {
			return "" // Responses streams name an event before its data
		}
		ev = rest
	}
	return ""
}

// sseData joins an event's data: lines.
func sseData(ev []byte) []byte {
	var out [][]byte
	for _, line := range bytes.Split(ev, []byte("\n")) {
		line = bytes.TrimSuffix(line, []byte("\r"))
		if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			out = append(out, bytes.TrimPrefix(v, []byte(" ")))
		}
	}
	return bytes.Join(out, []byte("\n"))
}

// wsExposedHeaders are the answer's headers a wrapped error event carries:
// what Codex reads from an HTTP error.
func wsExposedHeaders(h http.Header) map[string]string {
	out := map[string]string{}
	for k, v := range h {
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "x-codex-") || lk == "retry-after" || lk == "x-should-retry" || lk == "weir-request-id" {
			out[lk] = v[0]
		}
	}
	return out
}

// finish sends what is left once the proxy is done: a plain answer as a
// wrapped error event (or, for a 2xx that was not a stream, its body as
// is); a stream that ended without its last event's blank line, as is.
func (w *wsResponseWriter) finish() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	if w.stream {
		if rest := bytes.TrimSpace(w.buf.Bytes()); len(rest) > 0 {
			if data := sseData(rest); len(data) > 0 {
				return w.c.Write(w.ctx, websocket.MessageText, data)
			}
		}
		return nil
	}
	body := w.buf.Bytes()
	if w.status >= 200 && w.status < 300 {
		return w.c.Write(w.ctx, websocket.MessageText, body)
	}
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	var errObj any = json.RawMessage(body)
	if json.Unmarshal(body, &e) == nil && len(e.Error) > 0 {
		errObj = e.Error
	}
	if !json.Valid(body) {
		errObj = map[string]any{"type": "server_error", "message": strings.TrimSpace(string(body))}
	}
	return sendWSError(w.ctx, w.c, w.status, errObj, wsExposedHeaders(w.header))
}
