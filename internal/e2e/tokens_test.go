package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/internal/sim"
)

// workerReports is a worker's LeaseService transport that keeps what the
// worker tells its control plane about tokens: the final route events it
// reports, by request id, in the order they came, and the outcomes it
// releases (Release and ReleaseBatch).
type workerReports struct {
	next     http.RoundTripper
	mu       sync.Mutex
	events   map[string]*weirv1.RouteEvent
	order    []string
	outcomes []*weirv1.Outcome
}

func newWorkerReports() *workerReports {
	return &workerReports{next: rpcclient.HTTPClient().Transport, events: map[string]*weirv1.RouteEvent{}}
}

func (w *workerReports) RoundTrip(r *http.Request) (*http.Response, error) {
	var msg proto.Message
	switch path.Base(r.URL.Path) {
	case "ReportRoutes":
		msg = &weirv1.ReportRoutesRequest{}
	case "Release":
		msg = &weirv1.ReleaseRequest{}
	case "ReleaseBatch":
		msg = &weirv1.ReleaseBatchRequest{}
	default:
		return w.next.RoundTrip(r)
	}
	// Connect's unary calls carry the message as it is (no envelope, no
	// compression unless asked for).
	body, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if err := proto.Unmarshal(body, msg); err != nil {
		return nil, fmt.Errorf("%s: %w", r.URL.Path, err)
	}
	w.mu.Lock()
	switch m := msg.(type) {
	case *weirv1.ReportRoutesRequest:
		for _, ev := range m.Events {
			if ev.Pending {
				continue
			}
			if _, seen := w.events[ev.RequestId]; !seen {
				w.order = append(w.order, ev.RequestId)
			}
			w.events[ev.RequestId] = ev
		}
	case *weirv1.ReleaseRequest:
		w.outcomes = append(w.outcomes, m.Outcome)
	case *weirv1.ReleaseBatchRequest:
		for _, it := range m.Items {
			if it.Outcome != nil {
				w.outcomes = append(w.outcomes, it.Outcome)
			}
		}
	}
	w.mu.Unlock()
	return w.next.RoundTrip(r)
}

// event waits for the final route event of requestID; "" takes the next
// final event reported that is not in seen (a WebSocket response has no
// request id of its own to show).
func (w *workerReports) event(t *testing.T, requestID string, seen map[string]bool) *weirv1.RouteEvent {
	t.Helper()
	var found *weirv1.RouteEvent
	eventually(t, "the worker's route event "+requestID, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, id := range w.order {
			if (requestID == "" && !seen[id]) || id == requestID {
				found = w.events[id]
				return true
			}
		}
		return false
	})
	seen[found.RequestId] = true
	return found
}

// simUsage is the simulator's logged usage in weir's vocabulary (which it
// shares); nil when the answer reported none.
func simUsage(u sim.Usage) *weirv1.TokenUsage {
	if u == (sim.Usage{}) {
		return nil
	}
	return &weirv1.TokenUsage{InputTokens: int64(u.InputTokens), OutputTokens: int64(u.OutputTokens),
		CacheReadTokens: int64(u.CacheReadTokens), CacheCreationTokens: int64(u.CacheCreationTokens), ReasoningTokens: int64(u.ReasoningTokens)}
}

// generating is whether an upstream path uses tokens: the simulator's log
// also holds the control plane's reads.
func generating(p string) bool {
	return slices.Contains([]string{"/v1/messages", "/v1/messages/count_tokens", "/backend-api/codex/responses", "/v1/responses", "/v1/chat/completions"}, p)
}

// TestTokenUsageCaptured: what the worker reports each request used, per
// attempt and in sum, is what the upstream said, on every wire: Messages
// whole and streamed (prompt cache written, then read), a failover whose
// first attempt failed after message_start, a stream cut after output, a
// token count, an alias (the attempt priced by the model sent upstream);
// Responses over HTTP and over the WebSocket (cached and reasoning
// tokens); Chat Completions whole and streamed, with and without
// include_usage. The outcomes the worker releases carry the same, and
// weir_tokens_total adds them up.
func TestTokenUsageCaptured(t *testing.T) {
	t.Parallel()
	e := setup(t, options{noDataplane: true, accounts: []account{
		{label: "first", priority: 10, faults: []sim.Fault{{Kind: sim.FaultOverloadedEvent}}},
		{label: "second"},
		{label: "codex", provider: "codex"},
		{label: "oai", provider: "openai"},
	}})
	reports := newWorkerReports()
	e.dp, e.dpSrv = e.newDataplane(&http.Client{Transport: reports})
	e.client = e.dpSrv.Client()
	if _, err := e.aliases.SetAlias(t.Context(), connect.NewRequest(&weirv1.SetAliasRequest{
		Alias: "tokens-fast", Targets: []string{"claude-haiku-4-5-20251001"},
	})); err != nil {
		t.Fatal(err)
	}

	seen := map[string]bool{}
	simSeen := 0
	var all []*weirv1.AttemptRecord
	// check compares a request's route event with the simulator's
	// attempts since the last check.
	check := func(what string, ev *weirv1.RouteEvent, session string) {
		t.Helper()
		var atts []sim.Attempt
		eventually(t, what+": its attempts logged", func() bool {
			atts = nil
			for _, a := range e.sim.Attempts()[simSeen:] {
				if generating(a.Path) {
					atts = append(atts, a)
				}
			}
			return len(atts) >= int(ev.Attempts)
		})
		simSeen = len(e.sim.Attempts())
		var recs []*weirv1.AttemptRecord
		for _, r := range ev.AttemptRecords {
			if r.HoldReason == "" {
				recs = append(recs, r)
			}
		}
		if len(recs) != len(atts) {
			t.Fatalf("%s: %d attempt records, the simulator logged %d: %+v", what, len(recs), len(atts), atts)
		}
		var sum *weirv1.TokenUsage
		for i, r := range recs {
			want := simUsage(atts[i].Usage)
			if !proto.Equal(r.Usage, want) || r.Model != atts[i].Model || e.labels[r.AccountId] != atts[i].Account {
				t.Errorf("%s: attempt %d on %s as %q used %v; the simulator logged %s as %q, %v (%s)",
					what, i, e.labels[r.AccountId], r.Model, r.Usage, atts[i].Account, atts[i].Model, want, atts[i].Outcome)
			}
			if want != nil {
				sum = sumUsage(sum, want)
			}
			all = append(all, r)
		}
		if !proto.Equal(ev.Usage, sum) || ev.InputTokens != sum.GetInputTokens() || ev.OutputTokens != sum.GetOutputTokens() {
			t.Errorf("%s: the request used %v (%d in, %d out), its attempts %v", what, ev.Usage, ev.InputTokens, ev.OutputTokens, sum)
		}
		if ev.SessionKey != session {
			t.Errorf("%s: session key %q, want %q", what, ev.SessionKey, session)
		}
	}
	post := func(what, p, body string, edit func(*http.Request)) *weirv1.RouteEvent {
		t.Helper()
		r := e.do(http.MethodPost, p, body, edit)
		if r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", what, r.status, r.body)
		}
		return reports.event(t, r.header.Get("Weir-Request-Id"), seen)
	}
	const session = "tokens-session-1"
	claude := func(r *http.Request) { r.Header.Set("X-Claude-Code-Session-Id", session) }

	// Messages, as Claude Code sends them: caching asked for. The first
	// request's first attempt fails over after message_start.
	for _, stream := range []bool{false, false, true, true} {
		what := fmt.Sprintf("messages stream=%t", stream)
		check(what, post(what, "/v1/messages", cachedBody(model, stream), claude), session)
	}
	// A stream cut after output: what came before the cut.
	for _, label := range []string{"first", "second"} {
		if err := e.sim.AddFaults(label, sim.Fault{Kind: sim.FaultDropMidStream, Model: "claude-opus-4-1-20250805"}); err != nil {
			t.Fatal(err)
		}
	}
	check("messages cut", post("messages cut", "/v1/messages", cachedBody("claude-opus-4-1-20250805", true), claude), session)
	check("count_tokens", post("count_tokens", "/v1/messages/count_tokens", cachedBody(model, false), claude), session)
	check("alias", post("alias", "/v1/messages", cachedBody("tokens-fast", true), claude), session)

	// Responses over HTTP.
	codex := func(r *http.Request) {
		bearer(e.key)(r)
		r.Header.Set("Session-Id", "thread-tokens")
	}
	for _, stream := range []bool{false, true, true} {
		what := fmt.Sprintf("responses stream=%t", stream)
		body := `{"model":"` + codexModel + `","instructions":"Be brief.","input":[{"type":"message","role":"developer","content":"You are Codex."},{"type":"message","role":"user","content":"hi"}],"stream":` + fmt.Sprint(stream) + `}`
		check(what, post(what, "/v1/responses", body, codex), "thread-tokens")
	}
	// Responses over the WebSocket: each message one request.
	c, _, err := e.dialResponses(e.key)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow() //nolint:errcheck // test
	for i := range 2 {
		sendCreate(t, c, `,"instructions":"Be brief."`)
		if evs := readResponse(t, c); evs[len(evs)-1]["type"] != "response.completed" {
			t.Fatalf("websocket response %d: %v", i, evs)
		}
		check(fmt.Sprintf("websocket %d", i), reports.event(t, "", seen), "thread-1")
	}

	// Chat Completions.
	chat := `{"model":"gpt-5","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}]`
	for _, tc := range []struct{ what, tail string }{
		{"chat", `,"stream":false}`},
		{"chat stream with usage", `,"stream":true,"stream_options":{"include_usage":true}}`},
		{"chat stream without usage", `,"stream":true}`},
	} {
		check(tc.what, post(tc.what, "/v1/chat/completions", chat+tc.tail, bearer(e.key)), "")
	}

	// Every field met on the way: cache writes and reads, reasoning, a
	// failed attempt's partial usage, an answer that reported none.
	var written, read, reasoning, failed, none bool
	for _, r := range all {
		u := r.Usage
		written = written || u.GetCacheCreationTokens() > 0
		read = read || u.GetCacheReadTokens() > 0
		reasoning = reasoning || u.GetReasoningTokens() > 0
		failed = failed || (r.Class != weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS && u.GetInputTokens() > 0)
		none = none || u == nil
	}
	if !written || !read || !reasoning || !failed || !none {
		t.Errorf("cache written %t, read %t, reasoning %t, a failed attempt's usage %t, none reported %t: want each", written, read, reasoning, failed, none)
	}

	// The outcomes released carry the same usage, one per attempt.
	var want []string
	total := map[string]int64{}
	for _, a := range e.sim.Attempts() {
		if !generating(a.Path) {
			continue
		}
		if u := simUsage(a.Usage); u != nil {
			want = append(want, usageText(u))
			total["input"] += u.InputTokens
			total["output"] += u.OutputTokens
			total["cache_read"] += u.CacheReadTokens
			total["cache_creation"] += u.CacheCreationTokens
			total["reasoning"] += u.ReasoningTokens
		}
	}
	var got []string
	eventually(t, "every outcome released", func() bool {
		reports.mu.Lock()
		defer reports.mu.Unlock()
		got = nil
		for _, o := range reports.outcomes {
			if o.GetUsage() != nil {
				got = append(got, usageText(o.GetUsage()))
			}
		}
		return len(got) >= len(want)
	})
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("outcomes released with usage\n%s\nthe simulator logged\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for kind, n := range total {
		if m := e.workerMetric("weir_tokens_total", map[string]string{"kind": kind}); m != float64(n) {
			t.Errorf("weir_tokens_total{kind=%q} = %v, the simulator logged %d", kind, m, n)
		}
	}
	if m := e.workerMetric("weir_tokens_total", map[string]string{"provider": "anthropic", "family": "haiku", "kind": "output"}); m == 0 {
		t.Error("the alias's attempt is not counted under its target's family")
	}
}

// cachedBody is a Messages body as Claude Code sends one: a system prompt
// marked for caching, and a conversation.
func cachedBody(m string, stream bool) string {
	return `{"model":"` + m + `","max_tokens":64,"stream":` + fmt.Sprint(stream) +
		`,"system":[{"type":"text","text":"` + strings.Repeat("You are a careful agent. ", 20) + `","cache_control":{"type":"ephemeral"}}]` +
		`,"messages":[{"role":"user","content":"List the files."},{"role":"assistant","content":"README.md"},{"role":"user","content":"Say hello."}]}`
}

// sumUsage adds u to sum (nil: none yet).
func sumUsage(sum, u *weirv1.TokenUsage) *weirv1.TokenUsage {
	if sum == nil {
		sum = &weirv1.TokenUsage{}
	}
	sum.InputTokens += u.InputTokens
	sum.OutputTokens += u.OutputTokens
	sum.CacheReadTokens += u.CacheReadTokens
	sum.CacheCreationTokens += u.CacheCreationTokens
	sum.ReasoningTokens += u.ReasoningTokens
	return sum
}

func usageText(u *weirv1.TokenUsage) string {
	return fmt.Sprintf("in %d out %d read %d created %d reasoning %d", u.GetInputTokens(), u.GetOutputTokens(),
		u.GetCacheReadTokens(), u.GetCacheCreationTokens(), u.GetReasoningTokens())
}
