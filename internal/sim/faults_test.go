package sim

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestFaultErrorResponses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		fault      Fault
		status     int
		errType    string
		message    string
		retryAfter string
		retry      string // x-should-retry
	}{
		{Fault{Kind: FaultRateLimit, RetryAfter: 30}, 429, "rate_limit_error", "", "30", "true"},
		{Fault{Kind: FaultRateLimit}, 429, "rate_limit_error", "", "", "true"},
		{Fault{Kind: FaultOverloaded, RetryAfter: 5}, 529, "overloaded_error", "Overloaded", "5", "true"},
		{Fault{Kind: FaultUnavailable, RetryAfter: 7}, 503, "api_error", "Service Unavailable", "7", "true"},
		{Fault{Kind: FaultAPIError}, 500, "api_error", "Internal server error", "", "true"},
		{Fault{Kind: FaultRevoked}, 401, "authentication_error", "invalid x-api-key", "", ""},
		{Fault{Kind: FaultBadRequest}, 400, "invalid_request_error", "", "", ""},
		// Stream-only faults on a non-stream request are a 529.
		{Fault{Kind: FaultOverloadedEvent, RetryAfter: 2}, 529, "overloaded_error", "Overloaded", "2", "true"},
		{Fault{Kind: FaultErrorAfterContent}, 529, "overloaded_error", "Overloaded", "", "true"},
	}
	for _, tt := range tests {
		t.Run(tt.fault.Kind+"/"+strconv.Itoa(tt.fault.RetryAfter), func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{})
			if err := b.sim.AddFaults("key-a", tt.fault); err != nil {
				t.Fatal(err)
			}
			resp, data := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, false))
			wantError(t, resp, data, tt.status, tt.errType, tt.message)
			if got := resp.Header.Get("retry-after"); got != tt.retryAfter {
				t.Errorf("retry-after %q, want %q", got, tt.retryAfter)
			}
			if got := resp.Header.Get("x-should-retry"); got != tt.retry {
				t.Errorf("x-should-retry %q, want %q", got, tt.retry)
			}
			if got := resp.Header.Get("anthropic-ratelimit-unified-status"); got != "" {
				t.Errorf("unified status %q on a fault without unified", got)
			}
			if a := b.nextAttempt(t); a.Outcome != tt.fault.Kind || a.Status != tt.status || a.Account != "key-a" {
				t.Errorf("attempt %+v", a)
			}
			// The fault was used up.
			if resp, data := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, false)); resp.StatusCode != 200 {
				t.Errorf("after the fault: status %d: %s", resp.StatusCode, data)
			}
		})
	}
}

func TestRevokedFaultOAuth(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	if err := b.sim.AddFaults("sub-o", Fault{Kind: FaultRevoked}); err != nil {
		t.Fatal(err)
	}
	resp, data := b.call(t, "POST", "/v1/messages", oauthHeaders(tokO), messagesBody(sonnet, false))
	wantError(t, resp, data, 401, "authentication_error", "OAuth token has been revoked.")
}

func TestRateLimitUnified(t *testing.T) {
	t.Parallel()
	epoch := func(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }
	fiveReset := epoch(time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC))
	sevenReset := epoch(time.Date(2026, 3, 7, 10, 0, 0, 0, time.UTC))
	in90m := epoch(testNow.Add(90 * time.Minute))
	tests := []struct {
		name string
		rej  UnifiedRejection
		want map[string]string // unified header suffix → value; "" means absent
	}{
		{"five hour", UnifiedRejection{Claim: ClaimFiveHour, ResetIn: Duration(90 * time.Minute)}, map[string]string{
			"status": "rejected", "representative-claim": "five_hour", "reset": in90m,
			"5h-status": "rejected", "5h-utilization": "1.0", "5h-reset": in90m,
			"7d-status": "allowed_warning", "7d-utilization": "0.85", "7d-reset": sevenReset,
			"7d_oi-status": "", "fallback-percentage": "0.5",
		}},
		{"seven day, regular reset", UnifiedRejection{Claim: ClaimSevenDay}, map[string]string{
			"status": "rejected", "representative-claim": "seven_day", "reset": sevenReset,
			"5h-status": "allowed", "5h-utilization": "0.3", "5h-reset": fiveReset,
			"7d-status": "rejected", "7d-utilization": "1.0", "7d-reset": sevenReset,
		}},
		// The production capture: weekly at a warning, the overage-included
		// window spent.
		{"overage included", UnifiedRejection{Claim: ClaimSevenDayOverageIncluded, ResetIn: Duration(51811 * time.Second)}, map[string]string{
			"status": "rejected", "representative-claim": "seven_day_overage_included", "reset": epoch(testNow.Add(51811 * time.Second)),
			"7d-status": "allowed_warning", "7d-utilization": "0.85",
			"7d_oi-status": "rejected", "7d_oi-utilization": "1.0", "7d_oi-reset": epoch(testNow.Add(51811 * time.Second)),
		}},
		{"opus, no window headers", UnifiedRejection{Claim: ClaimSevenDayOpus, ResetIn: Duration(90 * time.Minute)}, map[string]string{
			"status": "rejected", "representative-claim": "seven_day_opus", "reset": in90m,
			"5h-status": "allowed", "7d-status": "allowed_warning", "7d_oi-status": "",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{})
			rej := tt.rej
			if err := b.sim.AddFaults("sub-o", Fault{Kind: FaultRateLimit, RetryAfter: 51811, Unified: &rej}); err != nil {
				t.Fatal(err)
			}
			resp, data := b.call(t, "POST", "/v1/messages", oauthHeaders(tokO), messagesBody(sonnet, true))
			wantError(t, resp, data, 429, "rate_limit_error", "")
			for k, v := range tt.want {
				if got := resp.Header.Get("anthropic-ratelimit-unified-" + k); got != v {
					t.Errorf("unified-%s = %q, want %q", k, got, v)
				}
			}
			if resp.Header.Get("retry-after") != "51811" || resp.Header.Get("x-should-retry") != "true" {
				t.Errorf("retry-after %q x-should-retry %q", resp.Header.Get("retry-after"), resp.Header.Get("x-should-retry"))
			}
		})
	}
}

func TestRateLimitBurstAPIKey(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	if err := b.sim.AddFaults("key-a", Fault{Kind: FaultRateLimit, RetryAfter: 20}); err != nil {
		t.Fatal(err)
	}
	resp, data := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, false))
	wantError(t, resp, data, 429, "rate_limit_error", "")
	if got := resp.Header.Get("anthropic-ratelimit-requests-remaining"); got != "0" {
		t.Errorf("requests-remaining %q", got)
	}
	if got, want := resp.Header.Get("anthropic-ratelimit-requests-reset"), testNow.Add(20*time.Second).Format(time.RFC3339); got != want {
		t.Errorf("requests-reset %q, want %q", got, want)
	}
}

func TestStreamFaults(t *testing.T) {
	t.Parallel()
	const errorData = `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
	head := []string{"message_start", "content_block_start", "ping"}
	tests := []struct {
		fault Fault
		want  []string
	}{
		{Fault{Kind: FaultOverloadedEvent}, []string{"message_start", "error"}},
		{Fault{Kind: FaultErrorAfterContent}, append(slices.Clone(head), "content_block_delta", "content_block_delta", "error")},
		{Fault{Kind: FaultErrorAfterContent, AfterDeltas: 5}, append(slices.Clone(head), "content_block_delta", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_delta", "error")},
	}
	for _, tt := range tests {
		t.Run(tt.fault.Kind+"/"+strconv.Itoa(tt.fault.AfterDeltas), func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{})
			if err := b.sim.AddFaults("sub-o", tt.fault); err != nil {
				t.Fatal(err)
			}
			resp, data := b.call(t, "POST", "/v1/messages", oauthHeaders(tokO), messagesBody(sonnet, true))
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" {
				t.Fatalf("status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			if resp.Header.Get("anthropic-ratelimit-unified-status") == "" {
				t.Errorf("200 stream lacks unified headers")
			}
			events, err := readEvents(strings.NewReader(string(data)))
			if err != nil {
				t.Fatalf("parse: %v\n%s", err, data)
			}
			if got := eventNames(events); !slices.Equal(got, tt.want) {
				t.Fatalf("events %v, want %v", got, tt.want)
			}
			if last := events[len(events)-1]; last.data != errorData {
				t.Errorf("error event %s", last.data)
			}
			if a := b.nextAttempt(t); a.Outcome != tt.fault.Kind || a.Status != 200 || !a.Stream {
				t.Errorf("attempt %+v", a)
			}
		})
	}
}

func TestDropConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	if err := b.sim.AddFaults("key-a", Fault{Kind: FaultDropConnection}); err != nil {
		t.Fatal(err)
	}
	resp, err := b.send(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, true))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got a response (status %d), want a transport error", resp.StatusCode)
	}
	if a := b.nextAttempt(t); a.Outcome != FaultDropConnection || a.Status != 0 {
		t.Errorf("attempt %+v", a)
	}
	if got := len(b.sim.Attempts()); got != 1 {
		t.Errorf("%d attempts, want 1 (the client must not have retried)", got)
	}
}

func TestDropMidStream(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	if err := b.sim.AddFaults("key-a", Fault{Kind: FaultDropMidStream, AfterDeltas: 3}, Fault{Kind: FaultDropMidStream}); err != nil {
		t.Fatal(err)
	}

	resp, err := b.send(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, true))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	events, err := readEvents(resp.Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("stream error %v, want unexpected EOF", err)
	}
	if got, want := eventNames(events), streamNames(3)[:6]; !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}

	// Without a stream, the JSON body is cut in half.
	resp, err = b.send(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, false))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !errors.Is(err, io.ErrUnexpectedEOF) || len(data) == 0 {
		t.Errorf("status %d, read %q, error %v; want 200, some bytes and unexpected EOF", resp.StatusCode, data, err)
	}
}

func TestSlowHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	if err := b.sim.AddFaults("key-a", Fault{Kind: FaultSlowHeaders, Delay: Duration(200 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", b.ts.URL+"/v1/messages", strings.NewReader(messagesBody(sonnet, false)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = apiKeyHeaders(keyA)
	resp, err := b.ts.Client().Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got status %d before the delay, want a timeout", resp.StatusCode)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error %v, want the client deadline", err)
	}
	// The handler saw the client go away and stopped instead of answering.
	if a := b.nextAttempt(t); a.Outcome != FaultSlowHeaders || a.Status != statusClientClosed {
		t.Errorf("attempt %+v", a)
	}

	// A client that waits gets the normal reply.
	if err := b.sim.AddFaults("key-a", Fault{Kind: FaultSlowHeaders, Delay: Duration(time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	resp, data := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, true))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if events, err := readEvents(strings.NewReader(string(data))); err != nil || !slices.Equal(eventNames(events), streamNames(8)) {
		t.Errorf("events %v, error %v", eventNames(events), err)
	}
	if a := b.nextAttempt(t); a.Outcome != FaultSlowHeaders || a.Status != 200 {
		t.Errorf("attempt %+v", a)
	}
}

func TestModelScopedFault(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	if err := b.sim.AddFaults("key-a", Fault{Kind: FaultOverloaded, Model: opus}); err != nil {
		t.Fatal(err)
	}
	statuses := []int{}
	for _, model := range []string{sonnet, opus, opus} {
		resp, _ := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(model, false))
		statuses = append(statuses, resp.StatusCode)
	}
	if want := []int{200, 529, 200}; !slices.Equal(statuses, want) {
		t.Errorf("statuses %v, want %v", statuses, want)
	}
}

func TestFaultTimes(t *testing.T) {
	t.Parallel()
	run := func(b *bundle, n int) []int {
		var statuses []int
		for range n {
			resp, _ := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, false))
			statuses = append(statuses, resp.StatusCode)
		}
		return statuses
	}

	b := setup(t, Config{})
	if err := b.sim.AddFaults("key-a", Fault{Kind: FaultOverloaded, Times: 2}, Fault{Kind: FaultAPIError}); err != nil {
		t.Fatal(err)
	}
	if got, want := run(b, 4), []int{529, 529, 500, 200}; !slices.Equal(got, want) {
		t.Errorf("times 2 then once: %v, want %v", got, want)
	}

	b = setup(t, Config{})
	if err := b.sim.AddFaults("key-a", Fault{Kind: FaultUnavailable, Times: -1}, Fault{Kind: FaultAPIError}); err != nil {
		t.Fatal(err)
	}
	if got, want := run(b, 5), []int{503, 503, 503, 503, 503}; !slices.Equal(got, want) {
		t.Errorf("forever: %v, want %v", got, want)
	}
	// Other accounts are not affected.
	if resp, _ := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyB), messagesBody(sonnet, false)); resp.StatusCode != 200 {
		t.Errorf("key-b status %d", resp.StatusCode)
	}
	b.sim.Reset()
	if got, want := run(b, 1), []int{200}; !slices.Equal(got, want) {
		t.Errorf("after Reset: %v, want %v", got, want)
	}
}

func TestScriptedFaults(t *testing.T) {
	t.Parallel()
	sc := testScript()
	sc.Accounts[0].Faults = []Fault{{Kind: FaultRateLimit, Times: 2}}
	b := setup(t, Config{Script: sc})
	var statuses []int
	for range 3 {
		resp, _ := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, false))
		statuses = append(statuses, resp.StatusCode)
	}
	if want := []int{429, 429, 200}; !slices.Equal(statuses, want) {
		t.Errorf("statuses %v, want %v", statuses, want)
	}
}

// TestFaultsDoNotApplyToCountTokens: a token count must not use up a
// fault meant for a message.
func TestFaultsDoNotApplyToCountTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	if err := b.sim.AddFaults("key-a", Fault{Kind: FaultOverloaded}); err != nil {
		t.Fatal(err)
	}
	if resp, _ := b.call(t, "POST", "/v1/messages/count_tokens", apiKeyHeaders(keyA), messagesBody(sonnet, false)); resp.StatusCode != 200 {
		t.Errorf("count_tokens status %d", resp.StatusCode)
	}
	if resp, _ := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, false)); resp.StatusCode != 529 {
		t.Errorf("messages status %d, want the queued 529", resp.StatusCode)
	}
}
