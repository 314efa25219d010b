package dataplane

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Answers that report usage, one file each in testdata/usage: raw
// HTTP/1.1 answers (status line, headers, blank line, body) written in
// the shapes the providers' API references document for each wire, whole
// and streamed, with the fields of newer API versions (Anthropic's
// cumulative message_delta usage, its null counts, the cache_creation
// breakdown; OpenAI's token details). Each goes through attempt() from a
// real upstream server; the outcome's usage must be the table's.

// usageAnswer is what the worker must report for one recorded answer.
type usageAnswer struct {
	file  string
	sf    surface
	path  string
	want  *weirv1.TokenUsage // nil: the answer reports none
	class weirv1.OutcomeClass
	// held: the answer failed before output and is held for a replay.
	held bool
}

var usageAnswers = []usageAnswer{
	{file: "messages.txt", sf: surfaceMessages, want: &weirv1.TokenUsage{InputTokens: 12, OutputTokens: 311, CacheReadTokens: 20480, CacheCreationTokens: 1536}},
	// message_start has the input and cache counts, message_delta the
	// output.
	{file: "messages-stream.txt", sf: surfaceMessages, want: &weirv1.TokenUsage{InputTokens: 4, OutputTokens: 52, CacheReadTokens: 14337, CacheCreationTokens: 188}},
	// message_delta repeats them, cumulative: a server tool ran, and the
	// input grew from message_start's 2679.
	{file: "messages-stream-cumulative.txt", sf: surfaceMessages, want: &weirv1.TokenUsage{InputTokens: 10682, OutputTokens: 510}},
	// message_delta's counts are null: message_start's stand.
	{file: "messages-stream-nulls.txt", sf: surfaceMessages, want: &weirv1.TokenUsage{InputTokens: 3, OutputTokens: 87, CacheCreationTokens: 2048}},
	// Cut after output: what was delivered, message_start's usage.
	{file: "messages-stream-cut.txt", sf: surfaceMessages, class: weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR,
		want: &weirv1.TokenUsage{InputTokens: 9, OutputTokens: 1, CacheReadTokens: 51200, CacheCreationTokens: 640}},
	// Failed before output: the attempt keeps what its answer reported.
	{file: "messages-stream-overloaded.txt", sf: surfaceMessages, class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, held: true,
		want: &weirv1.TokenUsage{InputTokens: 5, OutputTokens: 1, CacheReadTokens: 30000}},
	{file: "count-tokens.txt", sf: surfaceCount, path: "/v1/messages/count_tokens"},
	// OpenAI counts cached tokens in the input: weir's input is the rest.
	{file: "responses.txt", sf: surfaceResp, want: &weirv1.TokenUsage{InputTokens: 366, OutputTokens: 412, CacheReadTokens: 4864, ReasoningTokens: 256}},
	{file: "responses-stream.txt", sf: surfaceResp, want: &weirv1.TokenUsage{InputTokens: 259, OutputTokens: 1024, CacheReadTokens: 13952, ReasoningTokens: 832}},
	{file: "responses-stream-incomplete.txt", sf: surfaceResp, want: &weirv1.TokenUsage{InputTokens: 900, OutputTokens: 4096, ReasoningTokens: 4096}},
	{file: "responses-stream-failed.txt", sf: surfaceResp, class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, held: true},
	{file: "chat.txt", sf: surfaceChat, want: &weirv1.TokenUsage{InputTokens: 86, OutputTokens: 300, CacheReadTokens: 1920, ReasoningTokens: 192}},
	// stream_options.include_usage: the last chunk before [DONE].
	{file: "chat-stream-usage.txt", sf: surfaceChat, want: &weirv1.TokenUsage{InputTokens: 93, OutputTokens: 55, CacheReadTokens: 1024}},
	// A stream that did not ask reports nothing.
	{file: "chat-stream.txt", sf: surfaceChat},
}

// readUsageAnswer parses one recorded answer.
func readUsageAnswer(t *testing.T, file string) (*http.Response, []byte) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "usage", file))
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
	return resp, body
}

// TestUsageAnswersAreAllListed keeps the table and the directory in step.
func TestUsageAnswersAreAllListed(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("testdata", "usage", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, a := range usageAnswers {
		listed[a.file] = true
	}
	if len(files) != len(listed) {
		t.Errorf("%d files, %d in the table", len(files), len(listed))
	}
	for _, f := range files {
		if !listed[filepath.Base(f)] {
			t.Errorf("%s is not in the table", filepath.Base(f))
		}
	}
}

// TestUsageThroughAttempt replays each recorded answer from an upstream
// server through attempt(): the outcome's usage is every count the
// answer reported, normalized, whole or streamed.
func TestUsageThroughAttempt(t *testing.T) {
	t.Parallel()
	for _, a := range usageAnswers {
		t.Run(strings.TrimSuffix(a.file, ".txt"), func(t *testing.T) {
			t.Parallel()
			resp, body := readUsageAnswer(t, a.file)
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				for k, vs := range resp.Header {
					w.Header()[k] = vs
				}
				w.WriteHeader(resp.StatusCode)
				w.Write(body) //nolint:errcheck // test upstream
			}))
			t.Cleanup(up.Close)

			s := newTestServer(t)
			stream := isEventStream(resp.Header)
			reqBody := `{"model":"m","input":"hi","messages":[{"role":"user","content":"hi"}]}`
			path := a.path
			if path == "" {
				path = map[string]string{surfaceMessages.name: "/v1/messages", surfaceResp.name: "/v1/responses", surfaceChat.name: "/v1/chat/completions"}[a.sf.name]
			}
			r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, path, strings.NewReader(reqBody))
			rec := httptest.NewRecorder()
			tw := &trackingWriter{ResponseWriter: rec, now: time.Now}
			in := &inbound{sf: a.sf, requestID: "weir_usage", body: []byte(reqBody), stream: stream}
			lease := &weirv1.Lease{Id: "l", AccountId: "a", BaseUrl: up.URL, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY, Credential: "sk-usage-test-credential"}
			if a.sf.wire == wireOpenAI {
				lease.Provider, lease.BaseUrl = weirv1.Provider_PROVIDER_OPENAI, up.URL+"/v1"
			}
			res := s.attempt(t.Context(), tw, r, in, lease, 0)
			o := res.outcome
			if !proto.Equal(o.GetUsage(), a.want) {
				t.Errorf("usage %v, want %v", o.GetUsage(), a.want)
			}
			class := a.class
			if class == weirv1.OutcomeClass_OUTCOME_CLASS_UNSPECIFIED {
				class = weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS
			}
			if o.Class != class || (res.failure != nil) != a.held {
				t.Errorf("class %v, held %v; want %v, held %t", o.Class, res.failure, class, a.held)
			}
			// The client got the answer as it came (a cut stream up to its
			// last whole event, and weir's error event after).
			relayed := body
			if class == weirv1.OutcomeClass_OUTCOME_CLASS_STREAM_ERROR {
				relayed = body[:bytes.LastIndex(body, []byte("\n\n"))+2]
			}
			if !a.held && !bytes.HasPrefix(rec.Body.Bytes(), relayed) {
				t.Errorf("the client got %q, not the upstream's answer", rec.Body.String())
			}
		})
	}
}

// TestUsageMerge: the latest nonzero of each count stands.
func TestUsageMerge(t *testing.T) {
	t.Parallel()
	u := usage{input: 10, output: 1, cacheCreation: 2048}
	u.merge(usage{output: 57})
	u.merge(usage{input: 12, cacheRead: 5})
	if want := (usage{input: 12, output: 57, cacheRead: 5, cacheCreation: 2048}); u != want {
		t.Errorf("merged %+v, want %+v", u, want)
	}
	if (usage{}).proto() != nil {
		t.Error("an answer that reported nothing has a usage")
	}
	if got := u.proto(); !proto.Equal(got, &weirv1.TokenUsage{InputTokens: 12, OutputTokens: 57, CacheReadTokens: 5, CacheCreationTokens: 2048}) {
		t.Errorf("proto %v", got)
	}
}

// TestAddUsage: a request's usage is the sum over its attempts, those
// that reported none adding nothing.
func TestAddUsage(t *testing.T) {
	t.Parallel()
	var sum *weirv1.TokenUsage
	for _, u := range []*weirv1.TokenUsage{
		{InputTokens: 5, OutputTokens: 1, CacheReadTokens: 30000},
		nil,
		{InputTokens: 4, OutputTokens: 52, CacheReadTokens: 14337, CacheCreationTokens: 188, ReasoningTokens: 7},
	} {
		sum = addUsage(sum, u)
	}
	want := &weirv1.TokenUsage{InputTokens: 9, OutputTokens: 53, CacheReadTokens: 44337, CacheCreationTokens: 188, ReasoningTokens: 7}
	if !proto.Equal(sum, want) {
		t.Errorf("sum %v, want %v", sum, want)
	}
}

// TestTokensMetric: an attempt's usage adds to weir_tokens_total by
// provider, model family and kind, every kind shown.
func TestTokensMetric(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	m.countTokens("anthropic", modelFamily("claude-sonnet-4-5-20250929"), &weirv1.TokenUsage{InputTokens: 4, OutputTokens: 52, CacheReadTokens: 14337, CacheCreationTokens: 188})
	m.countTokens("anthropic", modelFamily("claude-sonnet-4-5"), &weirv1.TokenUsage{InputTokens: 6, OutputTokens: 8})
	m.countTokens("codex", modelFamily("gpt-5-codex"), &weirv1.TokenUsage{InputTokens: 259, OutputTokens: 1024, CacheReadTokens: 13952, ReasoningTokens: 832})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[[3]string]float64{}
	for _, f := range families {
		if f.GetName() != "weir_tokens_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			l := map[string]string{}
			for _, lp := range mt.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			got[[3]string{l["provider"], l["family"], l["kind"]}] = mt.GetCounter().GetValue()
		}
	}
	if len(got) != 10 {
		t.Errorf("%d series, want 10 (five kinds of two provider and family pairs): %v", len(got), got)
	}
	for _, tc := range []struct {
		provider, family, kind string
		want                   float64
	}{
		{"anthropic", "sonnet", tokenInput, 10},
		{"anthropic", "sonnet", tokenOutput, 60},
		{"anthropic", "sonnet", tokenCacheRead, 14337},
		{"anthropic", "sonnet", tokenCacheCreation, 188},
		{"anthropic", "sonnet", tokenReasoning, 0},
		{"codex", "codex", tokenInput, 259},
		{"codex", "codex", tokenOutput, 1024},
		{"codex", "codex", tokenCacheRead, 13952},
		{"codex", "codex", tokenCacheCreation, 0},
		{"codex", "codex", tokenReasoning, 832},
	} {
		v, ok := got[[3]string{tc.provider, tc.family, tc.kind}]
		if !ok || v != tc.want {
			t.Errorf("weir_tokens_total{%s,%s,%s} = %v (present %t), want %v", tc.provider, tc.family, tc.kind, v, ok, tc.want)
		}
	}
}
