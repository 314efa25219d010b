package sim

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// TestMaxTokens: max_tokens out of range or not an integer gets the real
// API's 400, naming the field, and uses up no fault.
func TestMaxTokens(t *testing.T) {
	t.Parallel()
	tests := []struct{ value, message string }{
		{"1000000000000", "max_tokens: 1000000000000 > 128000, which is the maximum allowed number of output tokens for " + sonnet},
		{"-1", "max_tokens: Input should be greater than or equal to 1"},
		{"0", "max_tokens: Input should be greater than or equal to 1"},
		{"1.5", "max_tokens: Input should be a valid integer, got a number with a fractional part"},
		{`"64"`, "max_tokens: Input should be a valid integer"},
		{"null", "max_tokens: Input should be a valid integer"},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{})
			if err := b.sim.AddFaults("key-a", Fault{Kind: FaultOverloaded}); err != nil {
				t.Fatal(err)
			}
			body := `{"model":"` + sonnet + `","max_tokens":` + tt.value + `,"messages":[{"role":"user","content":"hi"}]}`
			resp, data := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), body)
			wantError(t, resp, data, 400, "invalid_request_error", tt.message)
			if a := b.nextAttempt(t); a.Outcome != outcomeInvalidRequest {
				t.Errorf("attempt %+v", a)
			}
			// The fault is still queued.
			if resp, _ := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, false)); resp.StatusCode != 529 {
				t.Errorf("next request: %d, want the queued 529", resp.StatusCode)
			}
		})
	}
	for _, ok := range []string{"1", "1e3", "128000"} {
		b := setup(t, Config{})
		body := `{"model":"` + sonnet + `","max_tokens":` + ok + `,"messages":[{"role":"user","content":"hi"}]}`
		if resp, data := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), body); resp.StatusCode != 200 {
			t.Errorf("max_tokens %s: %d %s", ok, resp.StatusCode, data)
		}
	}
}

// TestMisbehaviourStreams: each misbehaviour cuts or spoils a stream at
// its point: before output right after message_start, after output after
// the deltas.
func TestMisbehaviourStreams(t *testing.T) {
	t.Parallel()
	tests := []struct {
		fault Fault
		// want is in the body; deltas the content_block_delta events
		// before it.
		want   string
		deltas int
		cut    bool // the connection is reset
	}{
		{Fault{Kind: FaultResetBeforeOutput}, "event: message_start", 0, true},
		{Fault{Kind: FaultResetAfterOutput, AfterDeltas: 3}, "", 3, true},
		{Fault{Kind: FaultMalformedBeforeOutput}, "this line is no server-sent event\n\n", 0, false},
		{Fault{Kind: FaultMalformedAfterOutput, Malformed: MalformedNonJSONData}, "event: content_block_delta\ndata: this is not JSON\n\n", 2, false},
		{Fault{Kind: FaultMalformedBeforeOutput, Malformed: MalformedBrokenJSON}, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"cut\n\n", 0, false},
		{Fault{Kind: FaultMalformedBeforeOutput, Malformed: MalformedNoEventName}, "\n\ndata: {\"type\":\"ping\"}\n\n", 0, false},
		{Fault{Kind: FaultOversizedLineAfterOutput, Size: 1 << 20}, "event: content_block_delta\n" + `data: {"text":"` + strings.Repeat("a", 1<<20) + "\"}\n\n", 2, false},
	}
	for _, tt := range tests {
		t.Run(tt.fault.Kind+"/"+tt.fault.Malformed, func(t *testing.T) {
			t.Parallel()
			b := setup(t, Config{})
			if err := b.sim.AddFaults("key-a", tt.fault); err != nil {
				t.Fatal(err)
			}
			resp, err := b.send(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, true))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			data, err := io.ReadAll(resp.Body)
			if tt.cut != (err != nil) {
				t.Fatalf("read error %v, want a cut connection: %v", err, tt.cut)
			}
			i := len(data)
			if tt.want != "" {
				i = bytes.Index(data, []byte(tt.want))
			}
			if i < 0 {
				t.Fatalf("body has no %.60q: %.300q", tt.want, data)
			}
			if n := bytes.Count(data[:i], []byte("event: content_block_delta")); n != tt.deltas {
				t.Errorf("%d deltas before it, want %d", n, tt.deltas)
			}
			if a := b.nextAttempt(t); a.Outcome != tt.fault.Kind || a.Status != 200 {
				t.Errorf("attempt %+v", a)
			}
		})
	}
}

// TestMisbehaviourBodies: the non-streamed forms.
func TestMisbehaviourBodies(t *testing.T) {
	t.Parallel()
	t.Run("reset after half the promised length", func(t *testing.T) {
		t.Parallel()
		b := setup(t, Config{})
		b.sim.AddFaults("key-a", Fault{Kind: FaultResetBeforeOutput}) //nolint:errcheck // valid
		resp, err := b.send(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, false))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err == nil || resp.ContentLength <= 0 || int64(len(data)) != resp.ContentLength/2 {
			t.Errorf("read %d of %d bytes, err %v; want half, then an error", len(data), resp.ContentLength, err)
		}
	})
	t.Run("longer than its length", func(t *testing.T) {
		t.Parallel()
		b := setup(t, Config{})
		b.sim.AddFaults("key-a", Fault{Kind: FaultBodyLongerThanLength, Size: 16}) //nolint:errcheck // valid
		resp, err := b.send(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, false))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		if err != nil || !bytes.HasPrefix(data, []byte(`{"id":"msg_`)) || int64(len(data)) != resp.ContentLength {
			t.Errorf("body %q (%v), want the whole message of its Content-Length", data, err)
		}
	})
	t.Run("huge", func(t *testing.T) {
		t.Parallel()
		b := setup(t, Config{})
		b.sim.AddFaults("key-a", Fault{Kind: FaultHugeBody, Size: 3 << 20, Status: 500}) //nolint:errcheck // valid
		resp, data := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, false))
		if resp.StatusCode != 500 || resp.ContentLength != -1 || len(data) != 3<<20 {
			t.Errorf("status %d, length %d, %d bytes; want 500, none, 3 MiB", resp.StatusCode, resp.ContentLength, len(data))
		}
	})
	t.Run("no headers", func(t *testing.T) {
		t.Parallel()
		b := setup(t, Config{})
		b.sim.AddFaults("key-a", Fault{Kind: FaultNoHeaders}) //nolint:errcheck // valid
		done := make(chan error, 1)
		go func() {
			_, err := b.send(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, false))
			done <- err
		}()
		if a := b.nextAttempt(t); a.Outcome != FaultNoHeaders {
			t.Errorf("attempt %+v", a)
		}
		select {
		case err := <-done:
			t.Fatalf("answered: %v", err)
		default:
		}
		b.ts.CloseClientConnections()
		if err := <-done; err == nil {
			t.Error("a response came")
		}
	})
}

func TestMisbehaviourValidation(t *testing.T) {
	t.Parallel()
	for _, f := range []Fault{
		{Kind: FaultHugeBody, Status: 99},
		{Kind: FaultRateLimit, Size: 10},
		{Kind: FaultResetAfterOutput, Malformed: MalformedGarbage},
		{Kind: FaultMalformedAfterOutput, Malformed: "nonsense"},
		{Kind: FaultHugeBody, Size: -1},
	} {
		if err := (Script{Accounts: []AccountScript{{Name: "a", Credential: keyA, Faults: []Fault{f}}}}).Validate(); err == nil {
			t.Errorf("%+v passed validation", f)
		}
	}
}
