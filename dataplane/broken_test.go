package dataplane

import (
	"strings"
	"testing"
)

// TestMalformedEvent: which upstream events are garbage, per wire. Pure.
func TestMalformedEvent(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		in        string
		sf        surface
		malformed bool
	}{
		{"named JSON event", "event: ping\ndata: {\"type\":\"ping\"}\n\n", surfaceMessages, false},
		{"comment only", ": keep-alive\n\n", surfaceMessages, false},
		{"name without data", "event: ping\n\n", surfaceMessages, false},
		{"id and retry fields", "id: 7\nretry: 1000\nevent: ping\ndata: {}\n\n", surfaceMessages, false},
		{"garbage line", "this is no event\n\n", surfaceMessages, true},
		{"garbage among fields", "event: ping\nhello world\ndata: {}\n\n", surfaceMessages, true},
		{"data not JSON", "event: content_block_delta\ndata: not json\n\n", surfaceMessages, true},
		{"broken JSON", "event: content_block_delta\ndata: {\"type\":\"content_bl\n\n", surfaceMessages, true},
		{"no event name on messages", "data: {\"type\":\"ping\"}\n\n", surfaceMessages, true},
		{"no event name on chat", "data: {\"choices\":[]}\n\n", surfaceChat, false},
		{"no event name on responses", "data: {\"type\":\"response.created\"}\n\n", surfaceResp, false},
		{"chat [DONE]", "data: [DONE]\n\n", surfaceChat, false},
		{"data not JSON on chat", "data: nope\n\n", surfaceChat, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			evs, _ := scanAll(t, strings.NewReader(tt.in))
			if len(evs) != 1 {
				t.Fatalf("%d events from %q", len(evs), tt.in)
			}
			if got := malformedEvent(tt.sf, evs[0]); got != tt.malformed {
				t.Errorf("malformed = %v, want %v", got, tt.malformed)
			}
		})
	}
}

// TestPathWire: the error format of a request weir answers without a
// surface, and which paths are clean. Pure.
func TestPathWire(t *testing.T) {
	t.Parallel()
	for p, want := range map[string]wire{
		"/v1/responses": wireOpenAI, "/v1/responses/x": wireOpenAI, "/v1/chat/completions/x": wireOpenAI,
		"/v1/completions": wireOpenAI, "/backend-api/codex/responses": wireOpenAI,
		"/v1/responsesx": wireAnthropic, "/v1/nonexistent": wireAnthropic, "/v1/files": wireAnthropic, "/": wireAnthropic,
	} {
		if got := pathWire(p); got != want {
			t.Errorf("pathWire(%q) = %v, want %v", p, got, want)
		}
	}
	for p, want := range map[string]bool{
		"/v1/messages": true, "/": true, "/v1/messages/": true,
		"/v1/../etc/passwd": false, "/v1/./messages": false, "//v1/messages": false, "/v1/messages/..": false, "": false,
	} {
		if got := canonicalPath(p); got != want {
			t.Errorf("canonicalPath(%q) = %v, want %v", p, got, want)
		}
	}
}
