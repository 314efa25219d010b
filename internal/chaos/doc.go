// Package chaos is the seeded fault run behind `weir chaos`: two control
// planes, three data planes, one Postgres and the simulator, each a
// process of its own, under mixed agent traffic while a schedule drawn
// from a seed kills, restarts, pauses and cuts them and makes the
// simulator's accounts misbehave; afterwards it checks what
// docs/reliability.md promises, from the simulator's attempt log and the
// database rather than from weir's own account of itself.
//
// The parts, each in a file of its own:
//
//   - schedule.go: the fault schedule, a pure function of the seed.
//   - proxy.go: the cuttable TCP proxy between the workers and the control
//     planes and between the control planes and Postgres.
//   - procs.go: the processes (this binary re-executed in a child role).
//   - traffic.go: the agents' requests, each body carrying a marker.
//   - check.go: the invariants, pure functions over what was recorded.
//   - run.go: one seed from start to verdict; report.go the report.
package chaos
