// Package defaults holds the runtime settings' defaults that both planes
// apply: a control plane serves them to workers until an operator sets
// them, and a worker uses them until it has heard from a control plane.
// Defined once, so that the two cannot drift.
package defaults

import "time"

const (
	// CapacityHold is how long a request may be held for capacity to
	// return (the capacity_hold setting).
	CapacityHold = 20 * time.Minute
	// UnreachableHold is how long a request is held while every
	// candidate's upstream is unreachable (unreachable_hold).
	UnreachableHold = 30 * time.Second
	// RequestDeadline bounds a request's whole life in weir, holds
	// included (request_deadline).
	RequestDeadline = 25 * time.Minute
	// BodyBuffer and BodyBufferPerKey bound the request-body bytes one
	// worker buffers at once, in all and per client key
	// (body_buffer_bytes, body_buffer_per_key_bytes): thirty bodies of
	// the 32 MiB maximum, or a thousand held requests of 1 MiB; an eighth
	// of that per key, so that it takes six keys to fill the part of the
	// buffer that keys already holding bodies may use
	// (dataplane/bodybudget.go).
	BodyBuffer       = 1 << 30
	BodyBufferPerKey = 128 << 20
	// LeaseTTL is how long a lease lives without renewal.
	LeaseTTL = 30 * time.Second
)
