package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/randid"
)

// liveHeap is the heap's live bytes after two collections (the second
// clears the pools' victims).
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestWebSocketFlood: thirty Responses WebSocket connections of one key,
// each sending a 3 MiB message whose last frame never comes, hold at most
// the key's share of the body buffer: the messages that fit are reserved
// (every byte counted by the gauge), the others are answered at once with
// a 429 error event and their bytes dropped as they come. Other keys are
// served meanwhile, over HTTP and over a WebSocket. When the clients
// leave, the reservations and the memory come back.
//
// Not parallel: it measures the process's heap.
func TestWebSocketFlood(t *testing.T) {
	const perKey, total = 16 << 20, 64 << 20
	e := setup(t, options{accounts: []account{{label: "api-1"}, {label: "codex", provider: "codex"}}, bodyIdleTimeout: time.Minute})
	if _, err := e.settings.UpdateSettings(t.Context(), connect.NewRequest(&weirv1.UpdateSettingsRequest{
		Settings:   &weirv1.Settings{BodyBufferBytes: total, BodyBufferPerKeyBytes: perKey},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"body_buffer_bytes", "body_buffer_per_key_bytes"}},
	})); err != nil {
		t.Fatal(err)
	}
	_, srv := e.newDataplane(nil) // reads the settings at start
	e.dpSrv, e.client = srv, srv.Client()
	reg := e.workerRegs[len(e.workerRegs)-1]
	buffered := func() float64 { return metricValue(t, reg, "weir_dataplane_request_body_buffer_bytes", nil) }
	flood := e.restrictedKey(&weirv1.CreateKeyRequest{})
	before := liveHeap()

	const conns, size = 30, 3 << 20
	payload := bytes.Repeat([]byte("a"), size)
	copy(payload, `{"type":"response.create","model":"`+codexModel+`","input":"`)
	events := make(chan map[string]any, conns)
	var clients []*websocket.Conn
	for range conns {
		c, _, err := e.dialResponses(flood)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		w, err := c.Writer(t.Context(), websocket.MessageText)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			w.Write(payload) //nolint:errcheck // the message's last frame never comes
			_, data, err := c.Read(t.Context())
			if err != nil {
				return // held, until the test closes it
			}
			var ev map[string]any
			json.Unmarshal(data, &ev) //nolint:errcheck // checked below
			events <- ev
		}()
	}
	// Each message is either held whole but its end (4 MiB reserved: its
	// buffer doubled from 64 KiB) or refused.
	refused := func() float64 { return e.refusalMetric("body_buffer") }
	eventually(t, "every message held or refused", func() bool {
		return buffered()/(4<<20)+refused() == conns && buffered() == float64(int(buffered())/(4<<20)*(4<<20))
	})
	if got := buffered(); got > perKey || got == 0 {
		t.Errorf("%v bytes reserved, want some and at most the key's %d", got, perKey)
	}
	during := liveHeap()
	for range int(refused()) {
		ev := <-events
		if ev["type"] != "error" || ev["status"] != 429.0 {
			t.Errorf("a refused message's answer: %v, want an error event with status 429", ev)
		}
		if h, _ := ev["headers"].(map[string]any); h["retry-after"] == nil {
			t.Errorf("no retry-after in %v", ev)
		}
	}
	// Other keys are served meanwhile.
	if r := e.post(false); r.status != http.StatusOK {
		t.Errorf("another key over HTTP: %d %s", r.status, r.body)
	}
	c, _, err := e.dialResponses(e.key)
	if err != nil {
		t.Fatal(err)
	}
	sendCreate(t, c, "")
	if evs := readResponse(t, c); evs[len(evs)-1]["type"] != "response.completed" {
		t.Errorf("another key over a WebSocket: %v", evs)
	}
	c.Close(websocket.StatusNormalClosure, "") //nolint:errcheck // test

	for _, c := range clients {
		c.CloseNow() //nolint:errcheck // test
	}
	eventually(t, "the reservations given back", func() bool { return buffered() == 0 })
	payload, clients = nil, nil //nolint:ineffassign // dropped for the heap measured next, whatever the compiler's liveness makes of them
	after := liveHeap()
	t.Logf("live heap: %d MiB before, %d MiB during, %d MiB after", before>>20, during>>20, after>>20)
	// Held whole, thirty messages were 90 MiB and more; bounded, the key's
	// share and the refused connections' small buffers.
	if grew := int64(during) - int64(before); grew > 3*perKey {
		t.Errorf("the heap grew %d MiB during the flood, want about the key's %d MiB share", grew>>20, perKey>>20)
	}
	if kept := int64(after) - int64(before); kept > 8<<20 {
		t.Errorf("%d MiB still live after the clients left", kept>>20)
	}
}

// TestWebSocketConnectionsPerKey: a key holds at most MaxWebSocketsPerKey
// connections on a worker; past it the handshake is a 429 in the OpenAI
// format, counted; other keys are not touched, and a closed connection
// gives its place back.
func TestWebSocketConnectionsPerKey(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "codex", provider: "codex"}}, maxWebSocketsPerKey: 2})
	first, _, err := e.dialResponses(e.key)
	if err != nil {
		t.Fatal(err)
	}
	second, _, err := e.dialResponses(e.key)
	if err != nil {
		t.Fatal(err)
	}
	defer second.CloseNow() //nolint:errcheck // test
	_, resp, err := e.dialResponses(e.key)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a third connection: %v %v, want a 429 with Retry-After before the upgrade", err, resp)
	}
	other, _, err := e.dialResponses(e.restrictedKey(&weirv1.CreateKeyRequest{}))
	if err != nil {
		t.Fatalf("another key: %v", err)
	}
	other.CloseNow() //nolint:errcheck // test
	if n := e.refusalMetric("websocket_limit"); n != 1 {
		t.Errorf("%v refusals counted, want 1", n)
	}
	first.Close(websocket.StatusNormalClosure, "") //nolint:errcheck // test
	eventually(t, "the closed connection's place back", func() bool {
		c, _, err := e.dialResponses(e.key)
		if err == nil {
			c.CloseNow() //nolint:errcheck // test
		}
		return err == nil
	})
}

// TestWebSocketMessageStalls: a message that stops arriving is answered
// 408 (a wrapped error event) at the idle timeout and the connection
// closed; its reservation comes back.
func TestWebSocketMessageStalls(t *testing.T) {
	t.Parallel()
	const idle = 300 * time.Millisecond
	e := setup(t, options{accounts: []account{{label: "codex", provider: "codex"}}, bodyIdleTimeout: idle})
	c, _, err := e.dialResponses(e.key)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow() //nolint:errcheck // test
	w, err := c.Writer(t.Context(), websocket.MessageText)
	if err != nil {
		t.Fatal(err)
	}
	// Larger than the client's write buffer, so that the frame goes out.
	if _, err := w.Write([]byte(`{"type":"response.create","model":"` + codexModel + `","input":"` + strings.Repeat("a", 64<<10))); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, data, err := c.Read(t.Context())
	if err != nil {
		t.Fatalf("no answer to a stalled message: %v", err)
	}
	var ev struct {
		Type   string
		Status int
		Error  struct{ Message string }
	}
	if json.Unmarshal(data, &ev) != nil || ev.Type != "error" || ev.Status != http.StatusRequestTimeout || !strings.Contains(ev.Error.Message, "stopped arriving") {
		t.Errorf("answer %s, want a 408 error event", data)
	}
	if waited := time.Since(start); waited < idle/2 {
		t.Errorf("answered after %v, before the %v idle timeout", waited, idle)
	}
	if _, _, err := c.Read(t.Context()); err == nil {
		t.Error("the connection served on after a message it could not finish")
	}
	eventually(t, "the reservation given back", func() bool {
		return metricValue(t, e.dpReg, "weir_dataplane_request_body_buffer_bytes", nil) == 0
	})
	if n := e.refusalRows(e.keyID, "body_timeout", 1); n != 1 {
		t.Errorf("%d rows for one refusal", n)
	}
}

// TestRefusalFlood: a key limited to 2 requests a minute, hammered over
// HTTP/1.1, over HTTP/2 with streams reset as soon as they are sent, and
// a flood of bad keys: two requests are served and recorded; the
// thousand refused cost a handful of rows (one per worker, interval,
// key and reason), whose counts add up to every refusal.
func TestRefusalFlood(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "api-1"}}})
	key := e.restrictedKey(&weirv1.CreateKeyRequest{RateLimitPerMinute: 2})
	dp, _ := e.newDataplane(nil)
	h2 := httptest.NewUnstartedServer(dp.Handler())
	h2.EnableHTTP2 = true
	h2.StartTLS()
	t.Cleanup(func() { closeServer(h2) })
	h2c := h2.Client()
	if tr, ok := h2c.Transport.(*http.Transport); ok {
		tr.TLSClientConfig = &tls.Config{RootCAs: tr.TLSClientConfig.RootCAs, NextProtos: []string{"h2"}}
		tr.ForceAttemptHTTP2 = true
	}
	start := time.Now()

	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 50 {
				r := e.do(http.MethodPost, "/v1/messages", messagesBody(false), func(r *http.Request) {
					r.Header.Set("X-Api-Key", key)
					if g%2 == 1 {
						r.Header.Set("X-Api-Key", "weir_sk_"+randid.Hex(32))
					}
				})
				mu.Lock()
				statuses[r.status]++
				mu.Unlock()
			}
		})
	}
	// HTTP/2 rapid resets: each stream is cancelled once its request is
	// written, on the one connection.
	for range 4 {
		wg.Go(func() {
			for range 100 {
				ctx, cancel := context.WithCancel(t.Context())
				ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { cancel() }})
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h2.URL+"/v1/messages", strings.NewReader(messagesBody(false)))
				req.Header.Set("X-Api-Key", key)
				if res, err := h2c.Do(req); err == nil {
					if res.ProtoMajor != 2 {
						t.Errorf("protocol %s, want HTTP/2", res.Proto)
					}
					io.Copy(io.Discard, res.Body) //nolint:errcheck // test
					res.Body.Close()
				}
				cancel()
			}
		})
	}
	wg.Wait()
	if statuses[http.StatusOK] > 2 || statuses[http.StatusOK]+statuses[http.StatusTooManyRequests]+statuses[http.StatusUnauthorized] != 400 {
		t.Errorf("answers %v: want at most 2 served, the rest 429 or 401", statuses)
	}
	elapsed := time.Since(start)

	// Every refusal counted reaches the control plane, in a few rows.
	var rows, sum int64
	eventually(t, "every refusal stored", func() bool {
		if err := e.pool.QueryRow(t.Context(), `SELECT count(*), coalesce(sum(count), 0) FROM refusal_counts`).Scan(&rows, &sum); err != nil {
			t.Fatal(err)
		}
		return float64(sum) == e.refusalMetric("")
	})
	if sum < 398 {
		t.Errorf("%d refusals stored, want at least the 398 refused over HTTP/1.1", sum)
	}
	// Intervals of 1 s, at most five reasons (key_rate_limit,
	// invalid_key, canceled, unverified, control_plane), two workers.
	if bound := (int64(elapsed/time.Second) + 2) * 5 * 2; rows > bound {
		t.Errorf("%d rows for %d refusals in %v, want at most %d", rows, sum, elapsed, bound)
	}
	var events int
	if err := e.pool.QueryRow(t.Context(), `SELECT count(*) FROM route_events`).Scan(&events); err != nil {
		t.Fatal(err)
	}
	if events > 2 {
		t.Errorf("%d route events, want the served requests' only (at most 2)", events)
	}
	t.Logf("%d refusals in %v: %d rows; answers %v", sum, elapsed.Round(time.Millisecond), rows, statuses)

}
