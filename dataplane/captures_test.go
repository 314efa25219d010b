package dataplane

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Upstream answers kept as raw HTTP/1.1 captures (status line, headers,
// blank line, body) in testdata/captures, built from the wire facts in
// docs/wire.md. What the worker reports for each is in
// testdata/captures/outcomes.json (see reported).

// capture is what the worker must read from one captured answer.
type capture struct {
	file      string
	status    int
	class     weirv1.OutcomeClass // classify(status, "")
	errorType string              // errorTypeOf(body)
	// sent says whether attempt() hands the answer to the client at once
	// (a success, or an error no other account would fix) rather than
	// holding it for a replay.
	sent bool
}

var captures = []capture{
	{file: "429-weekly-rejected.txt", status: 429, class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, errorType: "rate_limit_error"},
	{file: "429-burst.txt", status: 429, class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, errorType: "rate_limit_error"},
	{file: "529-overloaded.txt", status: 529, class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, errorType: "overloaded_error"},
	{file: "503-api-error.txt", status: 503, class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, errorType: "api_error"},
	// The status says success; the stream's error event says overload
	// (relayStream finds it, TestCaptureStreamOverloadedEvent), and that is
	// what the worker reports (outcomes.json).
	{file: "200-stream-overloaded-event.txt", status: 200, class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS},
	{file: "200-api-key-ratelimit.txt", status: 200, class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, sent: true},
	{file: "401-authentication-error.txt", status: 401, class: weirv1.OutcomeClass_OUTCOME_CLASS_AUTH_ERROR, errorType: "authentication_error"},
	{file: "400-invalid-request.txt", status: 400, class: weirv1.OutcomeClass_OUTCOME_CLASS_CLIENT_ERROR, errorType: "invalid_request_error", sent: true},
	// A gateway's own page: no Anthropic headers, no Anthropic body.
	{file: "502-gateway-html.txt", status: 502, class: weirv1.OutcomeClass_OUTCOME_CLASS_GATEWAY_ERROR},
	{file: "429-retry-after-date.txt", status: 429, class: weirv1.OutcomeClass_OUTCOME_CLASS_RATE_LIMITED, errorType: "rate_limit_error"},
}

// reported is one entry of testdata/captures/outcomes.json: the outcome
// attempt() reports to the control plane for a capture, and the capture's
// Date. controlplane/policy/captures_test.go feeds the same file to
// Decide(), so the worker's reading of an answer and the control plane's
// decision on it are checked against one table. TestCapturesThroughAttempt
// checks it against attempt() and rewrites it under -update-captures.
type reported struct {
	Capture   string            `json:"capture"`
	Date      string            `json:"date"`
	Class     string            `json:"class"`
	Status    int32             `json:"status"`
	ErrorType string            `json:"error_type,omitempty"`
	Headers   map[string]string `json:"headers"`
}

var updateCaptures = flag.Bool("update-captures", false, "rewrite testdata/captures/outcomes.json from attempt()'s outcomes")

const outcomesFile = "testdata/captures/outcomes.json"

func readReported(t *testing.T) map[string]reported {
	t.Helper()
	raw, err := os.ReadFile(outcomesFile)
	if err != nil {
		t.Fatal(err)
	}
	var list []reported
	if err := json.Unmarshal(raw, &list); err != nil {
		t.Fatalf("%s: %v", outcomesFile, err)
	}
	out := map[string]reported{}
	for _, r := range list {
		out[r.Capture+".txt"] = r
	}
	return out
}

// readCapture parses a capture; the returned response's body is unread.
func readCapture(t *testing.T, file string) (*http.Response, []byte) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "captures", file))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: body: %v", file, err)
	}
	resp.Body.Close()
	if len(body) == 0 {
		t.Fatalf("%s: empty body", file)
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, body
}

// TestCapturesAreAllListed keeps the table and the directory in step.
func TestCapturesAreAllListed(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("testdata", "captures", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, c := range captures {
		listed[c.file] = true
	}
	inFile := readReported(t)
	if !*updateCaptures && !maps.EqualFunc(listed, inFile, func(bool, reported) bool { return true }) {
		t.Errorf("%s lists %d captures, the table %d", outcomesFile, len(inFile), len(listed))
	}
	if len(files) != len(listed) {
		t.Errorf("%d capture files, %d in the table", len(files), len(listed))
	}
	for _, f := range files {
		if !listed[filepath.Base(f)] {
			t.Errorf("capture %s is not in the table", filepath.Base(f))
		}
	}
}

func TestCaptures(t *testing.T) {
	t.Parallel()
	want := readReported(t)
	for _, c := range captures {
		t.Run(strings.TrimSuffix(c.file, ".txt"), func(t *testing.T) {
			t.Parallel()
			resp, body := readCapture(t, c.file)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
			}
			if got := classify(resp.StatusCode, ""); got != c.class {
				t.Errorf("classify(%d) = %v, want %v", resp.StatusCode, got, c.class)
			}
			if got := errorTypeOf(body); got != c.errorType {
				t.Errorf("errorTypeOf = %q, want %q", got, c.errorType)
			}
			// An error type read from the body never changes a non-2xx class.
			if c.status >= 300 {
				if got := classify(resp.StatusCode, errorTypeOf(body)); got != c.class {
					t.Errorf("classify(%d, %q) = %v, want %v", resp.StatusCode, errorTypeOf(body), got, c.class)
				}
			}
			got, wantHeaders := decisionHeaders(resp.Header), want[c.file].Headers
			if !maps.Equal(got, wantHeaders) {
				for k, v := range wantHeaders {
					if got[k] != v {
						t.Errorf("decision header %s = %q, want %q", k, got[k], v)
					}
				}
				for k, v := range got {
					if _, ok := wantHeaders[k]; !ok {
						t.Errorf("unexpected decision header %s = %q", k, v)
					}
				}
			}
		})
	}
}

// TestCaptureStreamOverloadedEvent: a 200 stream whose first event after
// message_start (and a ping) is an overloaded error reaches the client not
// at all, and is an overload to replay.
func TestCaptureStreamOverloadedEvent(t *testing.T) {
	t.Parallel()
	resp, _ := readCapture(t, "200-stream-overloaded-event.txt")
	s := newTestServer(t)
	rec := httptest.NewRecorder()
	tw := &trackingWriter{ResponseWriter: rec, now: time.Now}
	o := &weirv1.Outcome{Status: int32(resp.StatusCode), Headers: decisionHeaders(resp.Header)}
	res := s.relayStream(t.Context(), tw, resp, &inbound{requestID: "weir_capture", stream: true}, o, idleWatch{}, nil, nil, relayed{})

	if tw.status != 0 || rec.Body.Len() != 0 || len(rec.Header()) != 0 || rec.Flushed {
		t.Errorf("the client got something: status %d headers %v body %q", tw.status, rec.Header(), rec.Body.String())
	}
	if res.outcome.Class != weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED || res.outcome.ErrorType != "overloaded_error" || res.outcome.BytesToClient {
		t.Errorf("outcome %v, want overloaded, nothing sent", res.outcome)
	}
	if res.outcome.GetUsage().GetInputTokens() != 2048 {
		t.Errorf("input tokens %d, want message_start's 2048", res.outcome.GetUsage().GetInputTokens())
	}
	f := res.failure
	if f == nil {
		t.Fatal("no failure held for a replay")
	}
	if f.status != 529 || errorTypeOf(f.body) != "overloaded_error" || f.header.Get("Request-Id") != "req_011CUqTr9kLmNoPqRsTuVwXy" {
		t.Errorf("held failure: %d %v %s", f.status, f.header, f.body)
	}
	// Passed on as is, it is a plain 529 in the Anthropic error shape.
	out := httptest.NewRecorder()
	f.write(out)
	if out.Code != 529 || out.Header().Get("Content-Type") != "application/json" || errorTypeOf(out.Body.Bytes()) != "overloaded_error" {
		t.Errorf("written failure: %d %v %s", out.Code, out.Header(), out.Body.String())
	}
}

// TestCapturesThroughAttempt replays each capture from an upstream server
// through attempt(): the outcome the control plane gets, and whether the
// client got the answer or it was held for a replay.
func TestCapturesThroughAttempt(t *testing.T) {
	t.Parallel()
	want := readReported(t)
	var (
		mu  sync.Mutex
		got []reported
	)
	t.Cleanup(func() {
		if !*updateCaptures || t.Failed() {
			return
		}
		slices.SortFunc(got, func(a, b reported) int { return strings.Compare(a.Capture, b.Capture) })
		raw, err := json.MarshalIndent(got, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(outcomesFile, append(raw, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	for _, c := range captures {
		t.Run(strings.TrimSuffix(c.file, ".txt"), func(t *testing.T) {
			t.Parallel()
			resp, body := readCapture(t, c.file)
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				for k, vs := range resp.Header {
					if k != "Date" && k != "Content-Length" {
						w.Header()[k] = vs
					}
				}
				w.WriteHeader(resp.StatusCode)
				w.Write(body) //nolint:errcheck // test upstream
			}))
			t.Cleanup(up.Close)

			s := newTestServer(t)
			reqBody := `{"model":"claude-sonnet-4-5-20250929","max_tokens":8,"messages":[{"role":"user","content":"hi"}],"stream":true}`
			r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/v1/messages", strings.NewReader(reqBody))
			rec := httptest.NewRecorder()
			tw := &trackingWriter{ResponseWriter: rec, now: time.Now}
			in := &inbound{requestID: "weir_capture", body: []byte(reqBody), stream: true}
			lease := &weirv1.Lease{Id: "l", AccountId: "a", BaseUrl: up.URL, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY, Credential: "sk-ant-api03-capture"}
			res := s.attempt(t.Context(), tw, r, in, lease, 0)
			o := res.outcome

			rep := reported{Capture: strings.TrimSuffix(c.file, ".txt"), Date: resp.Header.Get("Date"),
				Class: o.Class.String(), Status: o.Status, ErrorType: o.ErrorType, Headers: o.Headers}
			mu.Lock()
			got = append(got, rep)
			mu.Unlock()
			if w := want[c.file]; !*updateCaptures && !reflect.DeepEqual(rep, w) {
				t.Errorf("reported %+v\nwant (%s) %+v", rep, outcomesFile, w)
			}
			if o.Status != int32(c.status) {
				t.Errorf("outcome status %d, want %d", o.Status, c.status)
			}
			if o.Duration == nil || o.TimeToFirstByte == nil {
				t.Error("outcome without duration or time to first byte")
			}
			if c.sent {
				if res.failure != nil || tw.status != c.status || !bytes.Equal(rec.Body.Bytes(), body) {
					t.Errorf("want the answer relayed: failure %v, client got %d %q", res.failure, tw.status, rec.Body.String())
				}
				return
			}
			if tw.status != 0 || rec.Body.Len() != 0 || o.BytesToClient {
				t.Errorf("the client got %d %q; the answer must be held for a replay", tw.status, rec.Body.String())
			}
			if res.failure == nil {
				t.Fatal("nothing held")
			}
			if c.status != 200 && (res.failure.status != c.status || !bytes.Equal(res.failure.body, body)) {
				t.Errorf("held %d %q, want the upstream's %d answer verbatim", res.failure.status, res.failure.body, c.status)
			}
		})
	}
}
