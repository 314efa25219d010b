package dataplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"

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

// serveResponsesWebSocket runs one Responses WebSocket connection.
func (s *Server) serveResponsesWebSocket(w http.ResponseWriter, r *http.Request) {
	requestID := newRequestID()
	// The key is checked before the upgrade, so that a client with a wrong
	// key gets a plain 401 it can show, not a socket that closes.
	secret := clientKey(r)
	if secret == "" {
		writeError(w, wireOpenAI, requestID, errAuthentication("missing API key: send your weir key as Authorization: Bearer"))
		return
	}
	if _, err := s.keys.verify(r.Context(), hashKey(secret)); err != nil {
		if errors.Is(err, errKeyRejected) {
			writeError(w, wireOpenAI, requestID, errAuthentication("invalid API key"))
		} else {
			writeError(w, wireOpenAI, requestID, errControlPlane())
		}
		return
	}
	// The handshake's headers go with every request made over the
	// connection: refused once, before the upgrade, as a plain answer.
	if apiErr := checkHeaders(r); apiErr != nil {
		writeError(w, wireOpenAI, requestID, apiErr)
		return
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		// Agents connect from anywhere they run; the key, not the origin,
		// is what authenticates.
		InsecureSkipVerify: true,
		CompressionMode:    websocket.CompressionContextTakeover,
	})
	if err != nil {
		return // Accept has answered the client
	}
	defer c.CloseNow() //nolint:errcheck // best effort
	c.SetReadLimit(s.cfg.MaxBodyBytes)

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	// One reader for the connection's life: it notices a client that left
	// while a response is under way (and cancels it), and queues the next
	// request meanwhile.
	msgs := make(chan []byte)
	go func() {
		defer cancel()
		for {
			typ, data, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ != websocket.MessageText {
				c.Close(websocket.StatusUnsupportedData, "text messages only") //nolint:errcheck // closing
				return
			}
			select {
			case msgs <- data:
			case <-ctx.Done():
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
	for {
		select {
		case <-ctx.Done():
			c.Close(websocket.StatusNormalClosure, "") //nolint:errcheck // closing
			return
		case data := <-msgs:
			if !s.serveWebSocketMessage(ctx, c, r, header, data) {
				return
			}
		}
	}
}

// serveWebSocketMessage serves one response.create; false ends the
// connection.
func (s *Server) serveWebSocketMessage(ctx context.Context, c *websocket.Conn, r *http.Request, header http.Header, data []byte) bool {
	body, model, warmup, err := wsRequestBody(data)
	if err != nil {
		return sendWSError(ctx, c, http.StatusBadRequest, map[string]any{
			"type": "invalid_request_error", "message": err.Error(), "param": nil, "code": nil}, nil) == nil
	}
	if warmup {
		return sendWarmup(ctx, c, model) == nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL.Path, bytes.NewReader(body))
	if err != nil {
		return false
	}
	req.Header = header.Clone()
	req.Header.Set("Content-Type", "application/json")
	req.RemoteAddr, req.Host = r.RemoteAddr, r.Host
	ww := &wsResponseWriter{ctx: ctx, c: c, header: http.Header{}}
	s.proxyHandler(surfaceResp)(ww, req)
	if err := ww.finish(); err != nil {
		return false
	}
	return ctx.Err() == nil
}

// wsRequestBody turns a response.create message into the POST body: the
// same top-level fields, less the envelope, streamed. warmup is a message
// with "generate": false, which only prepares a connection.
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
	if generate != nil && !*generate {
		return nil, model, true, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		return nil, "", false, errors.New("message is not valid JSON")
	}
	delete(fields, "type")
	delete(fields, "stream_id")
	fields["stream"] = json.RawMessage("true")
	body, err = json.Marshal(fields)
	return body, model, false, err
}

// sendWarmup answers a "generate": false message (Codex sends one to
// prepare a new connection): a response that generates nothing. It is
// answered here, not upstream: weir speaks HTTP to the upstream, where a
// warm-up has no meaning, and it would cost an account a request.
func sendWarmup(ctx context.Context, c *websocket.Conn, model string) error {
	id := "resp_" + strings.TrimPrefix(newRequestID(), "weir_")
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
			return err
		}
	}
	return nil
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
		w.buf.Next(next)
		if len(data) == 0 || bytes.Equal(data, []byte("[DONE]")) {
			continue
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
