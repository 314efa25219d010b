// Package e2e holds weir's end-to-end tests: a real control plane on a real Postgres, real data-plane workers and the upstream simulator, over real HTTP.
package e2e
