// Package policy is the control plane's pure decisions: routing (Route,
// QuotaBlock: which accounts may serve a request and in what order, or
// why none), Decide (what an attempt's outcome calls for, the 429 ladder
// included), the overload breaker's arithmetic (AfterOverload), the
// usage forecast (ForecastWindow), recovery from a quota cooldown
// (Recovered) and the banked-reset decision (DecideBankedReset). Each is a
// function of its inputs and the time it is given; nothing here reads a
// clock, a database or the network.
//
// The inputs are this package's own plain structs (Candidate, Account,
// Cooldown, Gate, Facts, Breaker, Reading, Sample, BankedInput); the
// control plane converts its stored rows into them, one function per type
// (controlplane/policyinputs.go), and applies the Effects Decide returns.
//
// What it may import: the standard library (but net/http: nothing here
// speaks HTTP), github.com/google/uuid for account ids, gen/weir/v1 and
// protobuf's well-known types, because types.proto is the project's one
// vocabulary (states, cooldown reasons, outcome classes, actions) and the
// outputs are its messages (NoAccount, QuotaBlock, Unreachable, Forecast),
// as is the Outcome a worker reports, which Decide reads as it is (a copy
// would carry the same fields one for one), and internal packages that are
// pure themselves (failpolicy, backoff, vocab). Never the database
// (controlplane/db, pgx), River, connect or the control plane itself;
// imports_test.go checks it.
package policy
