package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/sim"
)

// The Responses WebSocket transport, as Codex speaks it with
// supports_websockets: one response.create per response on a persistent
// connection, events as text messages, failures before output as wrapped
// error events carrying the HTTP status, headers and body.

func (e *env) dialResponses(key string) (*websocket.Conn, *http.Response, error) {
	url := "ws" + strings.TrimPrefix(e.dpSrv.URL, "http") + "/v1/responses"
	return websocket.Dial(e.t.Context(), url, &websocket.DialOptions{
		HTTPHeader: http.Header{"Authorization": {"Bearer " + key}, "Openai-Beta": {"responses_websockets=2026-02-06"},
			"Session-Id": {"thread-1"}},
	})
}

// readResponse reads one response's events, until response.completed or a
// wrapped error event.
func readResponse(t *testing.T, c *websocket.Conn) []map[string]any {
	t.Helper()
	var evs []map[string]any
	for {
		typ, data, err := c.Read(t.Context())
		if err != nil {
			t.Fatalf("read after %d events: %v", len(evs), err)
		}
		if typ != websocket.MessageText {
			t.Fatalf("message type %v, want text", typ)
		}
		var ev map[string]any
		if err := json.Unmarshal(data, &ev); err != nil {
			t.Fatalf("event %q is not JSON: %v", data, err)
		}
		evs = append(evs, ev)
		if ev["type"] == "response.completed" || ev["type"] == "error" {
			return evs
		}
	}
}

func sendCreate(t *testing.T, c *websocket.Conn, extra string) {
	t.Helper()
	msg := `{"type":"response.create","model":"` + codexModel + `","input":"Say hello."` + extra + `}`
	if err := c.Write(t.Context(), websocket.MessageText, []byte(msg)); err != nil {
		t.Fatal(err)
	}
}

func TestResponsesWebSocket(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: []account{{label: "codex", provider: "codex"}}})
	if _, resp, err := e.dialResponses("weir_wrong"); err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("dial with a wrong key: %v %v, want HTTP 401 before the upgrade", err, resp)
	}
	c, _, err := e.dialResponses(e.key)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow() //nolint:errcheck // test
	// A warm-up ("generate": false) is answered by the worker: nothing to
	// generate, no account spent.
	sendCreate(t, c, `,"generate":false`)
	if evs := readResponse(t, c); len(evs) != 2 || evs[0]["type"] != "response.created" || evs[1]["type"] != "response.completed" {
		t.Fatalf("warm-up: %v", evs)
	}
	if n := len(e.upstream.exchanges()); n != 0 {
		t.Errorf("the warm-up reached the upstream (%d requests)", n)
	}
	for i := range 2 {
		sendCreate(t, c, "")
		evs := readResponse(t, c)
		if evs[0]["type"] != "response.created" || evs[len(evs)-1]["type"] != "response.completed" {
			t.Fatalf("response %d: events %v", i, evs)
		}
		var text strings.Builder
		for _, ev := range evs {
			if ev["type"] == "response.output_text.delta" {
				text.WriteString(ev["delta"].(string))
			}
		}
		if !strings.Contains(text.String(), "weir upstream simulator") {
			t.Errorf("response %d text %q", i, text.String())
		}
	}
	// Each message was one streamed upstream request with the same body
	// fields, less the envelope.
	xs := e.upstream.exchanges()
	if len(xs) != 2 || xs[0].path != "/backend-api/codex/responses" {
		t.Fatalf("upstream exchanges %d", len(xs))
	}
	var body map[string]any
	if err := json.Unmarshal(xs[0].reqBody, &body); err != nil {
		t.Fatal(err)
	}
	if body["stream"] != true || body["type"] != nil || body["model"] != codexModel {
		t.Errorf("upstream body %v", body)
	}
	if h := xs[0].reqHeader; h.Get("Openai-Beta") != "" || h.Get("Upgrade") != "" || h.Get("Sec-Websocket-Key") != "" ||
		h.Get("Session-Id") != "thread-1" {
		t.Errorf("upstream headers %v: the transport's headers must stay behind, the session's go on", h)
	}

	// An unknown event is refused on the connection, which stays usable.
	if err := c.Write(t.Context(), websocket.MessageText, []byte(`{"type":"session.update"}`)); err != nil {
		t.Fatal(err)
	}
	evs := readResponse(t, c)
	if ev := evs[0]; ev["type"] != "error" || ev["status"] != 400.0 {
		t.Errorf("unknown event: %v", ev)
	}
	sendCreate(t, c, "")
	if evs := readResponse(t, c); evs[len(evs)-1]["type"] != "response.completed" {
		t.Errorf("after the refusal: %v", evs)
	}
	e.leasesReleased()
}

// TestResponsesWebSocketUsageLimit: a pool out of quota in the usage_limit
// mode answers the wrapped error event with status 429, the Codex
// rate-limit headers and the usage limit body, which Codex reads as the
// HTTP answer: a final usage limit with its reset.
func TestResponsesWebSocketUsageLimit(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "a", provider: "codex", windows: &sim.Windows{FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(2 * time.Hour)}}},
	}})
	e.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
	c, _, err := e.dialResponses(e.key)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow() //nolint:errcheck // test
	sendCreate(t, c, "")
	evs := readResponse(t, c)
	ev := evs[len(evs)-1]
	if len(evs) != 1 || ev["type"] != "error" || ev["status"] != 429.0 {
		t.Fatalf("events %v, want one wrapped 429", evs)
	}
	errObj, _ := ev["error"].(map[string]any)
	headers, _ := ev["headers"].(map[string]any)
	if errObj["type"] != "usage_limit_reached" || errObj["code"] != "model_cooldown" || errObj["resets_at"] != float64(v.Now().Add(2*time.Hour).Unix()) ||
		headers["x-should-retry"] != "false" || headers["x-codex-primary-used-percent"] != "100" || headers["x-codex-primary-window-minutes"] != "300" {
		t.Errorf("wrapped error %v", ev)
	}
}
