// Package bench is weir's load harness (`weir bench`): in one process it
// starts the upstream simulator, a bare httputil.ReverseProxy in front of
// it (the reference for a proxy that does nothing) and a whole weir
// (embedded Postgres, a control plane and a data plane over loopback
// HTTP), drives each with the same open-loop constant-rate load, and
// reports what weir adds: latency over the direct connection and over the
// bare proxy, CPU per request, time to first token and inter-event gaps
// on streams, memory per open idle stream, and the Acquire and Release
// round trips. docs/performance.md explains the method.
package bench
