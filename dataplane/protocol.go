package dataplane

import (
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// streamSignal is what one upstream SSE event means to the relay. Each
// surface's protocol has its own reader (Anthropic messages, OpenAI
// Responses, Chat Completions); the relay only acts on signals.
type streamSignal struct {
	// output: the event carries output, so from it on the stream belongs to
	// the client (events before the first output are held back and may be
	// replayed elsewhere).
	output bool
	// done: the stream finished successfully (message_stop,
	// response.completed, [DONE]).
	done bool
	// failure: the event ends the stream with an error.
	failure *eventFailure
	// usage is what the event reports the answer used (zero: nothing);
	// the relay keeps the latest of each count (usage.merge).
	usage usage
}

// eventFailure is the evidence of an upstream error: an HTTP error body, or
// an error event inside a 200 stream.
type eventFailure struct {
	class weirv1.OutcomeClass
	// errorType is the upstream's own name for the error: the Anthropic
	// error.type, the OpenAI error code (else type), the Google reason.
	errorType string
	// message is the upstream's message, one line, at most 300 bytes.
	message string
	// quota is set when the error says a quota is spent.
	quota *weirv1.QuotaEvidence
	// status is the HTTP status weir answers with when the error arrived
	// as an event and nothing was sent yet.
	status int
}
