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

// messageStatus is the status of a non-streamed message with key.
func (b *bundle) messageStatus(t *testing.T, key string) int {
	t.Helper()
	resp, _ := b.call(t, "POST", "/v1/messages", apiKeyHeaders(key), messagesBody(sonnet, false))
	return resp.StatusCode
}

// TestFaultFor: a fault with a duration answers every attempt from its
// first one until the duration has passed on the sim clock, then is
// consumed and the next fault in the queue applies.
func TestFaultFor(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{ManualClock: true})
	status := func() int { return b.messageStatus(t, keyA) }
	// The storm's time starts with its first attempt, not when it is queued.
	b.advance(t, time.Hour)
	if err := b.sim.AddFaults("key-a", Fault{Kind: FaultOverloaded, For: Duration(60 * time.Second)}, Fault{Kind: FaultAPIError}); err != nil {
		t.Fatal(err)
	}
	b.advance(t, 10*time.Minute)
	var got []int
	for _, step := range []time.Duration{0, 0, 59900 * time.Millisecond, 100 * time.Millisecond, 0} {
		b.advance(t, step)
		got = append(got, status())
	}
	if want := []int{529, 529, 529, 500, 200}; !slices.Equal(got, want) {
		t.Errorf("statuses at t=0, 0, 59.9s, 60s, 60s: %v, want %v", got, want)
	}
}

// TestFaultUntil: a fault applies until its time on the sim clock; one
// already past when it is looked at is consumed without answering.
func TestFaultUntil(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{ManualClock: true})
	status := func() int { return b.messageStatus(t, keyA) }
	end := testNow.Add(60 * time.Second)
	if err := b.sim.AddFaults("key-a", Fault{Kind: FaultOverloaded, Until: end}); err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, step := range []time.Duration{0, 59900 * time.Millisecond, 100 * time.Millisecond} {
		b.advance(t, step)
		got = append(got, status())
	}
	if want := []int{529, 529, 200}; !slices.Equal(got, want) {
		t.Errorf("statuses at t=0, 59.9s, 60s: %v, want %v", got, want)
	}
	if err := b.sim.AddFaults("key-a", Fault{Kind: FaultOverloaded, Until: testNow}); err != nil {
		t.Fatal(err)
	}
	if s := status(); s != 200 {
		t.Errorf("a past until: status %d, want 200", s)
	}
}

// TestTimedFaultScript: the script shows a begun For as the Until it ends
// at and leaves out timed faults that are over, so that it can be put back
// as it is; a fault for another model neither starts nor spends a storm.
func TestTimedFaultScript(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{ManualClock: true})
	faults := `[{"kind":"overloaded","for":"60s","model":"` + sonnet + `"},{"kind":"rate_limit","until":"2026-03-04T10:31:00Z"}]`
	if resp, data := b.call(t, "POST", "/_sim/accounts/key-a/faults", nil, faults); resp.StatusCode != 200 {
		t.Fatalf("POST faults: %d %s", resp.StatusCode, data)
	}
	scripted := func() []Fault {
		_, data := b.call(t, "GET", "/_sim/script", nil, "")
		return decode[Script](t, data).Accounts[0].Faults
	}
	if f := scripted(); len(f) != 2 || f[0].For != Duration(time.Minute) || !f[0].Until.IsZero() || f[0].Times != 0 || f[1].Times != 0 {
		t.Errorf("queued: %+v", f)
	}
	// An opus request gets the rate limit and leaves the sonnet storm unbegun.
	if resp, _ := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(opus, false)); resp.StatusCode != 429 {
		t.Errorf("opus: status %d, want 429", resp.StatusCode)
	}
	b.advance(t, 30*time.Second)
	if resp, _ := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, false)); resp.StatusCode != 529 {
		t.Errorf("sonnet: status %d, want 529", resp.StatusCode)
	}
	f := scripted()
	if len(f) != 2 || f[0].For != 0 || !f[0].Until.Equal(testNow.Add(90*time.Second)) {
		t.Errorf("begun: %+v", f)
	}
	// The rate limit's until has passed: only the storm is left.
	b.advance(t, 30*time.Second)
	if f := scripted(); len(f) != 1 || f[0].Kind != FaultOverloaded {
		t.Errorf("after the until: %+v", f)
	}
	if err := (Script{Accounts: []AccountScript{{Name: "a", Credential: "k1", Faults: f}}}).Validate(); err != nil {
		t.Errorf("the shown faults do not validate: %v", err)
	}
}
