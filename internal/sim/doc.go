// Package sim is an upstream simulator for the Anthropic Messages API.
//
// It speaks the real wire format (headers, error bodies, SSE events; see
// WIRE.md) and maps each request's credential to a named account whose
// behaviour is scripted: queues of faults such as 429s with unified
// rate-limit headers, 529s, overloaded events inside a 200 stream, dropped
// connections and slow headers. weir's tests and `weir dev --simulate` use it
// so that nothing needs the real API.
//
// A Server is an http.Handler serving both the API (/v1/...) and a JSON
// control API under /_sim/ for changing the script and reading the log of
// attempts while it runs.
package sim
