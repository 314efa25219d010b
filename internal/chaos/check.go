package chaos

import (
	"cmp"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/weirhq/weir/internal/sim"
)

// The checks are pure functions of a Record: what the clients saw, the
// simulator's attempt log, the database's route events and live leases,
// and the faults as they were applied. docs/reliability.md ("The chaos
// run") states each invariant exactly; the comments below say how.

// Account is one account of the pool as the harness made it.
type Account struct {
	Name      string `json:"name"`
	Anthropic bool   `json:"anthropic"`
	Cap       int    `json:"cap"`
}

// RouteEvent is a row of route_events.
type RouteEvent struct {
	RequestID string    `json:"request_id"`
	Surface   string    `json:"surface"`
	Model     string    `json:"model"`
	Stream    bool      `json:"stream"`
	Status    int       `json:"status"`
	StartedAt time.Time `json:"started_at"`
}

// Lease is a live row of leases once the run was quiet.
type Lease struct {
	Account   string    `json:"account"`
	RequestID string    `json:"request_id"`
	Acquired  time.Time `json:"acquired_at"`
	Expires   time.Time `json:"expires_at"`
}

// Cooldown is a row of cooldowns once the run was quiet.
type Cooldown struct {
	Account string    `json:"account"`
	Reason  string    `json:"reason"`
	Until   time.Time `json:"until"`
}

// Applied is a scheduled event as it ran: From and To are when it began
// and when its component was back (a process serving again, Postgres
// ready, a blackhole healed, a fault's end); Incarnation, for a kill,
// which process of the component died.
type Applied struct {
	Event       Event         `json:"event"`
	From        time.Duration `json:"from"`
	To          time.Duration `json:"to"`
	Incarnation int           `json:"incarnation,omitempty"`
}

func (a Applied) String() string {
	return fmt.Sprintf("%s (ran %s→%s)", a.Event, fmtRel(a.From), fmtRel(a.To))
}

// Record is everything one seed recorded.
type Record struct {
	Seed  uint64    `json:"seed"`
	Start time.Time `json:"start"` // traffic's start; every Duration is from it
	// Stopped is when traffic stopped; Collected when the attempt log was
	// read.
	Stopped   time.Duration `json:"stopped"`
	Collected time.Duration `json:"collected"`
	Applied   []Applied     `json:"applied"`
	Requests  []Request     `json:"requests"`
	Attempts  []sim.Attempt `json:"attempts"`
	Accounts  []Account     `json:"accounts"`
	Events    []RouteEvent  `json:"route_events"`
	// Leases are those live (expires_at > now()) after the quiet wait.
	Leases   []Lease       `json:"leases"`
	LeaseTTL time.Duration `json:"lease_ttl"`
	// Cooldowns are the accounts' cooldowns at the end; CapacityHold the
	// hold budget.
	Cooldowns    []Cooldown    `json:"cooldowns"`
	CapacityHold time.Duration `json:"capacity_hold"`
}

// Invariant numbers, as docs/reliability.md lists them.
const (
	InvCap         = 1 // no account over its cap
	InvNoReplay    = 2 // nothing replayed after output
	InvSameBody    = 3 // same body and model on every replay
	InvOnce        = 4 // answered once, recorded once
	InvNoLease     = 5 // no live lease once quiet
	InvServable    = 6 // no failure while an account could serve
	InvHeld        = 7 // no 429 while an account could serve, no failure in a storm the budget outlasts
	InvCooled      = 8 // a spent account, once cooled, is left alone
	InvReset       = 9 // a spent account is cooled until the reset it named
	numInvariants  = 9
	cancelGrace    = 100 * time.Millisecond
	healthyStretch = 3 * time.Second
	faultMargin    = 10 * time.Second
	rateMargin     = time.Minute
	restartMargin  = time.Second
)

// InvariantNames are short names, by number.
var InvariantNames = [numInvariants + 1]string{"", "cap", "no replay after output", "same body and model", "answered and recorded once", "no live lease when quiet", "no failure while servable",
	"held while the pool can serve", "a spent account stays cooled", "cooled until the named reset"}

// Known failures: violations weir is known to make, which a run may
// tolerate (Config.TolerateKnown).
const (
	// KnownKilledWorker: a worker killed before it could report the
	// request. Its outbox is in its memory (docs/reliability.md, "What is
	// not covered"): what it had not sent dies with it. It counts as known
	// only when the kill came within reportWindow of the request's end or
	// start, or while a fault on the control side (a control plane killed
	// or paused, its proxy cut or blackholed, Postgres stopped or
	// blackholed) held the worker's reports up; otherwise the worker had
	// time to report, and the missing record is a violation.
	KnownKilledWorker = "worker killed before it could report"
)

// reportWindow is how long a worker may take to report a request when
// the control side is well: its report interval (250 ms) and a call's
// round trip, with room for a loaded machine. reportHeldUp is how long a
// fault on the control side may hold a report up after it ends: the
// report call's timeout (5 s), past which it is sent again.
const (
	reportWindow = 500 * time.Millisecond
	reportHeldUp = 5 * time.Second
)

// Violation is one broken invariant.
type Violation struct {
	Invariant int           `json:"invariant"`
	At        time.Duration `json:"at"`
	What      string        `json:"what"`
	// Known names the known failure it is, "" if none.
	Known string `json:"known,omitempty"`
	// Requests and Accounts are what the timeline shows for it.
	Requests []int    `json:"requests,omitempty"`
	Accounts []string `json:"accounts,omitempty"`
}

func (v Violation) String() string {
	s := fmt.Sprintf("invariant %d (%s) at %s: %s", v.Invariant, InvariantNames[v.Invariant], fmtRel(v.At), v.What)
	if v.Known != "" {
		s += " [known: " + v.Known + "]"
	}
	return s
}

// apiPaths are the paths an attempt on an account serves a request on.
var apiPaths = []string{"/v1/messages", "/v1/responses", "/v1/chat/completions", "/backend-api/codex/responses"}

// view indexes a Record for the checks.
type view struct {
	*Record
	byName  map[string]Account
	bySHA   map[string]*Request
	atts    map[string][]sim.Attempt // request SHA → its attempts, by start
	killed  map[[2]int]time.Duration // worker, incarnation → when killed
	rel     func(time.Time) time.Duration
	control []span // when the control side (Postgres or every control plane) was unusable
	// disturbed is when any fault was on the control side: a control
	// plane killed or paused (a call to it hangs), its proxy cut or
	// blackholed, Postgres stopped, cut or blackholed.
	disturbed []span
	// spent are the accounts spent for the whole run, by name.
	spent map[string]Event
}

func newView(r *Record) *view {
	v := &view{Record: r, byName: map[string]Account{}, bySHA: map[string]*Request{}, atts: map[string][]sim.Attempt{}, killed: map[[2]int]time.Duration{},
		spent: map[string]Event{}}
	v.rel = func(t time.Time) time.Duration { return t.Sub(r.Start) }
	for _, a := range r.Accounts {
		v.byName[a.Name] = a
	}
	for i := range r.Requests {
		v.bySHA[r.Requests[i].SHA] = &r.Requests[i]
	}
	for _, a := range r.Attempts {
		if a.Account != "" && slices.Contains(apiPaths, a.Path) {
			v.atts[a.BodySHA256] = append(v.atts[a.BodySHA256], a)
		}
	}
	for sha := range v.atts {
		slices.SortFunc(v.atts[sha], func(a, b sim.Attempt) int { return a.Time.Compare(b.Time) })
	}
	var pg, cpProxy []span
	cps := map[int][]span{}
	for _, a := range r.Applied {
		s := span{a.From, a.To}
		switch a.Event.Kind {
		case Spent:
			v.spent[r.Accounts[a.Event.Target].Name] = a.Event
		case KillWorker:
			v.killed[[2]int{a.Event.Target, a.Incarnation}] = a.From
		case StopPostgres, BlackholePostgres:
			pg = append(pg, s)
		case BlackholeControlPlanes:
			cpProxy = append(cpProxy, s)
		case KillControlPlane, PauseControlPlane:
			cps[a.Event.Target] = append(cps[a.Event.Target], s)
		}
		switch a.Event.Kind {
		case StopPostgres, BlackholePostgres, CutPostgres, BlackholeControlPlanes, CutControlPlanes, KillControlPlane, PauseControlPlane:
			v.disturbed = append(v.disturbed, s)
		}
	}
	allCP := []span{{-time.Hour, time.Hour}}
	for i := range numControlPlanes {
		allCP = intersect(allCP, union(cps[i]))
	}
	v.control = union(append(append(pg, cpProxy...), allCP...))
	return v
}

// Check runs every invariant over r.
func Check(r *Record) []Violation {
	v := newView(r)
	var out []Violation
	out = append(out, v.checkCap()...)
	out = append(out, v.checkNoReplay()...)
	out = append(out, v.checkSameBody()...)
	out = append(out, v.checkOnce()...)
	out = append(out, v.checkNoLease()...)
	out = append(out, v.checkServable()...)
	out = append(out, v.checkHeld()...)
	out = append(out, v.checkCooled()...)
	out = append(out, v.checkReset()...)
	slices.SortStableFunc(out, func(a, b Violation) int { return cmp.Compare(a.At, b.At) })
	return out
}

// interval is when attempt a was in flight on its account: from when the
// simulator took it to when it was done; one whose client went away ends
// cancelGrace before the simulator noticed (the gateway let go first),
// and one still running at the end of the record runs to Collected.
func (v *view) interval(a sim.Attempt) span {
	from := v.rel(a.Time)
	if a.Ended.IsZero() {
		return span{from, v.Collected}
	}
	to := v.rel(a.Ended)
	if a.ClientGone {
		to = max(from, to-cancelGrace)
	}
	return span{from, to}
}

// inFlight sweeps an account's attempts: the spans where it had at least
// cap in flight, and the first moments it had more.
func (v *view) inFlight(account string, cap int) (atCap []span, over []overage) {
	type edge struct {
		t     time.Duration
		delta int
		sha   string
	}
	var edges []edge
	for _, list := range v.atts {
		for _, a := range list {
			if a.Account != account {
				continue
			}
			s := v.interval(a)
			if s.to <= s.from {
				continue
			}
			edges = append(edges, edge{s.from, 1, a.BodySHA256}, edge{s.to, -1, a.BodySHA256})
		}
	}
	// Ends before starts at the same instant: touching is not overlapping.
	slices.SortFunc(edges, func(a, b edge) int { return cmp.Or(cmp.Compare(a.t, b.t), cmp.Compare(a.delta, b.delta)) })
	n := 0
	var capFrom time.Duration
	live := map[string]int{}
	for _, e := range edges {
		before := n
		n += e.delta
		live[e.sha] += e.delta
		if before < cap && n >= cap {
			capFrom = e.t
		}
		if before >= cap && n < cap {
			atCap = append(atCap, span{capFrom, e.t})
		}
		if n > cap && e.delta > 0 {
			var shas []string
			for sha, k := range live {
				if k > 0 {
					shas = append(shas, sha)
				}
			}
			over = append(over, overage{at: e.t, n: n, shas: shas})
		}
	}
	return atCap, over
}

type overage struct {
	at   time.Duration
	n    int
	shas []string
}

// checkCap: invariant 1. At no instant had an account more attempts in
// flight (interval above) than its max_concurrency.
func (v *view) checkCap() []Violation {
	var out []Violation
	for _, acct := range v.Accounts {
		_, over := v.inFlight(acct.Name, acct.Cap)
		// One violation per run of excess, at its first moment.
		for i, o := range over {
			if i > 0 && over[i-1].n > acct.Cap && o.at-over[i-1].at < time.Second {
				continue
			}
			viol := Violation{Invariant: InvCap, At: o.at, Accounts: []string{acct.Name},
				What: fmt.Sprintf("account %s had %d requests in flight, cap %d", acct.Name, o.n, acct.Cap)}
			for _, sha := range o.shas {
				if q := v.bySHA[sha]; q != nil {
					viol.Requests = append(viol.Requests, q.N)
				}
			}
			slices.Sort(viol.Requests)
			out = append(out, viol)
		}
	}
	return out
}

// checkNoReplay: invariant 2. No attempt of a request started after
// another of its attempts had sent output.
func (v *view) checkNoReplay() []Violation {
	var out []Violation
	for sha, list := range v.atts {
		for _, a := range list {
			if a.Output.IsZero() {
				continue
			}
			for _, b := range list {
				if b.Time.After(a.Output) {
					q := v.bySHA[sha]
					viol := Violation{Invariant: InvNoReplay, At: v.rel(b.Time), Accounts: []string{a.Account, b.Account},
						What: fmt.Sprintf("replayed on %s %s after %s sent output at %s", b.Account, fmtRel(v.rel(b.Time)), a.Account, fmtRel(v.rel(a.Output)))}
					if q != nil {
						viol.Requests = []int{q.N}
					}
					out = append(out, viol)
				}
			}
		}
	}
	return out
}

// checkSameBody: invariant 3. Every attempt on an account carries the
// body (SHA-256) of some client request, and that request's model.
func (v *view) checkSameBody() []Violation {
	var out []Violation
	for sha, list := range v.atts {
		q := v.bySHA[sha]
		for _, a := range list {
			switch {
			case q == nil:
				out = append(out, Violation{Invariant: InvSameBody, At: v.rel(a.Time), Accounts: []string{a.Account},
					What: fmt.Sprintf("an attempt on %s (%s, model %s) carries a body no client sent", a.Account, a.Path, a.Model)})
			case a.Model != q.Model:
				out = append(out, Violation{Invariant: InvSameBody, At: v.rel(a.Time), Accounts: []string{a.Account}, Requests: []int{q.N},
					What: fmt.Sprintf("attempt on %s has model %q, the client asked for %q", a.Account, a.Model, q.Model)})
			}
		}
	}
	return out
}

// killedUnder says when the worker process q was sent to was killed,
// if it was after q started.
// couldNotReport says whether q's worker, killed at killedAt, may not have
// had the time to report q (KnownKilledWorker): the kill came within
// reportWindow of q's start (a request in progress is reported at the
// next interval) or of its end, or while a fault on the control side held
// reports up.
func (v *view) couldNotReport(q *Request, killedAt time.Duration) bool {
	if killedAt-q.Start <= reportWindow || killedAt-q.End <= reportWindow {
		return true
	}
	for _, s := range v.disturbed {
		if s.from <= killedAt && s.to+reportHeldUp >= q.Start {
			return true
		}
	}
	return false
}

func (v *view) killedUnder(q *Request) (time.Duration, bool) {
	k, ok := v.killed[[2]int{q.Worker, q.Incarnation}]
	return k, ok && k >= q.Start-50*time.Millisecond
}

// lateStart is how long after its client went away a worker may still
// start a request (and date its event): the request's head was sent, and
// a loaded machine runs the worker's connection late. With 100 ms, a CI
// run under the race detector, beside other packages' tests, left such
// an event (status 0: nothing was answered) standing for no request.
const lateStart = time.Second

// A taker is a request whose route event nobody saw the id of: cut
// under a killed worker after it reached the upstream (needed: it must
// have one), or abandoned before the headers (it may have one). Its event
// started between from and to.
type taker struct {
	q        *Request
	from, to time.Duration
	killedAt time.Duration
	needed   bool
}

// unseenWindow is q's taker: its event started once q was sent and
// lateStart after it ended at the latest, or after the end of a pause of
// its worker during it (a paused worker starts the request only once it
// runs again, perhaps after its client gave up).
func (v *view) unseenWindow(q *Request, killedAt time.Duration, needed bool) taker {
	end := q.End
	for _, a := range v.Applied {
		if a.Event.Kind == PauseWorker && a.Event.Target == q.Worker && a.From <= q.End && a.To >= q.Start {
			end = max(end, a.To)
		}
	}
	return taker{q: q, from: q.Start - 100*time.Millisecond, to: end + lateStart, killedAt: killedAt, needed: needed}
}

// checkOnce: invariant 4. Every request the client did not abandon got
// exactly one final answer (a status and body, or a stream with one final
// event), unless its worker was killed under it; every request answered
// with a Weir-Request-Id has exactly one route event under it; every
// request whose worker died under it after it reached the simulator has
// one route event the clients never saw an id for (same surface, model
// and stream, started in its taker's window); and no route event is left
// that no client request accounts for.
func (v *view) checkOnce() []Violation {
	var out []Violation
	events := map[string][]RouteEvent{}
	for _, e := range v.Events {
		events[e.RequestID] = append(events[e.RequestID], e)
	}
	claimed := map[string]bool{}
	for i := range v.Requests {
		q := &v.Requests[i]
		if q.RequestID != "" {
			claimed[q.RequestID] = true
		}
	}
	var unclaimed []RouteEvent
	for _, e := range v.Events {
		if !claimed[e.RequestID] && v.rel(e.StartedAt) >= -time.Second {
			unclaimed = append(unclaimed, e)
		}
	}
	slices.SortFunc(unclaimed, func(a, b RouteEvent) int { return a.StartedAt.Compare(b.StartedAt) })
	var takers []taker
	for i := range v.Requests {
		q := &v.Requests[i]
		killedAt, killed := v.killedUnder(q)
		switch q.Outcome {
		case OutcomeTwice:
			out = append(out, Violation{Invariant: InvOnce, At: q.End, Requests: []int{q.N}, What: fmt.Sprintf("request %d got %d final events in one stream", q.N, q.Terminals)})
		case OutcomeCut:
			if !killed {
				out = append(out, Violation{Invariant: InvOnce, At: q.End, Requests: []int{q.N}, What: fmt.Sprintf("request %d got no whole answer from a live worker: %s", q.N, q.Detail)})
			}
		}
		switch {
		case q.RequestID != "":
			if n := len(events[q.RequestID]); n != 1 {
				viol := Violation{Invariant: InvOnce, At: q.End, Requests: []int{q.N}, What: fmt.Sprintf("request %d (%s) has %d route events", q.N, q.RequestID, n)}
				if n == 0 && killed {
					viol.What += fmt.Sprintf("; its worker was killed at %s", fmtRel(killedAt))
					if v.couldNotReport(q, killedAt) {
						viol.Known = KnownKilledWorker
					}
				}
				out = append(out, viol)
			}
		case q.Outcome == OutcomeCut && killed && len(v.atts[q.SHA]) > 0:
			takers = append(takers, v.unseenWindow(q, killedAt, true))
		case q.Outcome == OutcomeCancelled || q.Outcome == OutcomeCut:
			takers = append(takers, v.unseenWindow(q, killedAt, false))
		}
	}
	// Each taker gets the earliest event left that fits its window, in
	// the order the windows end: for intervals and points that greedy
	// order matches as many as any order does, so one request cannot take
	// the event of another whose window is narrower.
	slices.SortStableFunc(takers, func(a, b taker) int { return cmp.Or(cmp.Compare(a.to, b.to), cmp.Compare(a.from, b.from)) })
	for _, tk := range takers {
		q := tk.q
		i := slices.IndexFunc(unclaimed, func(e RouteEvent) bool {
			// An event with no model is of a request refused before its
			// body was read (its key could not be checked): it says nothing
			// of model or stream.
			same := e.Model == q.Model && e.Stream == q.Stream || e.Model == ""
			at := v.rel(e.StartedAt)
			return e.Surface == q.Surface && same && at >= tk.from && at <= tk.to
		})
		if i >= 0 {
			unclaimed = slices.Delete(unclaimed, i, i+1)
			continue
		}
		if tk.needed {
			viol := Violation{Invariant: InvOnce, At: q.End, Requests: []int{q.N},
				What: fmt.Sprintf("request %d reached the upstream, its worker was killed at %s, and no route event stands for it", q.N, fmtRel(tk.killedAt))}
			if v.couldNotReport(q, tk.killedAt) {
				viol.Known = KnownKilledWorker
			}
			out = append(out, viol)
		}
	}
	for _, e := range unclaimed {
		out = append(out, Violation{Invariant: InvOnce, At: v.rel(e.StartedAt),
			What: fmt.Sprintf("route event %s (%s %s, status %d) stands for no client request", e.RequestID, e.Surface, e.Model, e.Status)})
	}
	return out
}

// checkNoLease: invariant 5. Once traffic stopped and the run was quiet
// for a lease TTL and a margin, no lease was live.
func (v *view) checkNoLease() []Violation {
	var out []Violation
	for _, l := range v.Leases {
		out = append(out, Violation{Invariant: InvNoLease, At: v.rel(l.Acquired), Accounts: []string{l.Account},
			What: fmt.Sprintf("lease on %s for %s, acquired %s, still live until %s", l.Account, l.RequestID, fmtRel(v.rel(l.Acquired)), fmtRel(v.rel(l.Expires)))})
	}
	return out
}

// checkServable: invariant 6. No request failed retryably while, for
// healthyStretch in one go during its life, every component was up (no
// scheduled event other than upstream faults in force, nor in the
// restartMargin after a pause of a worker, nor in the lease TTL and the
// restartMargin after any other: a lease orphaned by a kill or a cut
// holds its slot that long), and some account of its surface was free of
// upstream faults (since faultMargin before, rateMargin after a 429) and
// had a slot free the whole time. Not counted: the client's own
// cancellations, requests whose worker was killed or paused during
// them, and requests that already had output (nothing may replay them).
func (v *view) checkServable() []Violation {
	down := v.down()
	acctBad := map[string][]span{}
	for _, a := range v.Applied {
		switch a.Event.Kind {
		case Upstream:
			m := faultMargin
			if a.Event.Fault == "rate_limit" {
				m = rateMargin
			}
			name := v.Accounts[a.Event.Target].Name
			acctBad[name] = append(acctBad[name], span{a.From, a.To + m})
		case Storm:
			for _, acct := range v.Accounts {
				if acct.Anthropic {
					acctBad[acct.Name] = append(acctBad[acct.Name], span{a.From, a.To + faultMargin})
				}
			}
		case Spent:
			name := v.Accounts[a.Event.Target].Name
			acctBad[name] = append(acctBad[name], span{a.From, a.To})
		}
	}
	for _, acct := range v.Accounts {
		atCap, _ := v.inFlight(acct.Name, acct.Cap)
		acctBad[acct.Name] = union(append(acctBad[acct.Name], atCap...))
	}
	var out []Violation
	for i := range v.Requests {
		q := &v.Requests[i]
		if !q.Retryable() || q.Output || q.Cancel != "" {
			continue
		}
		if slices.ContainsFunc(v.atts[q.SHA], func(a sim.Attempt) bool { return !a.Output.IsZero() }) {
			continue
		}
		if v.workerTroubled(q) {
			continue
		}
		life := []span{{q.Start, q.End}}
		good := subtract(life, down)
		for _, acct := range v.Accounts {
			if acct.Anthropic != (q.Surface == "messages") {
				continue
			}
			for _, s := range subtract(good, acctBad[acct.Name]) {
				if s.to-s.from >= healthyStretch {
					out = append(out, Violation{Invariant: InvServable, At: q.End, Requests: []int{q.N}, Accounts: []string{acct.Name},
						What: fmt.Sprintf("request %d failed (%d %s) though %s was healthy with a slot free %s→%s and every component up",
							q.N, q.Status, q.ErrType, acct.Name, fmtRel(s.from), fmtRel(s.to))})
					goto next
				}
			}
		}
	next:
	}
	return out
}

// down is when some component was not up: a scheduled event other than
// an account's (Upstream, Storm, Spent) in force, or in the restartMargin
// after a pause of a worker, or in the lease TTL and the restartMargin
// after any other (a lease orphaned by a kill or a cut holds its slot
// that long).
func (v *view) down() []span {
	var down []span
	for _, a := range v.Applied {
		switch a.Event.Kind {
		case Upstream, Storm, Spent:
		case PauseWorker:
			down = append(down, span{a.From, a.To + restartMargin})
		default:
			down = append(down, span{a.From, a.To + v.LeaseTTL + restartMargin})
		}
	}
	return union(down)
}

// rateLimited says whether q was answered as rate-limited or out of quota
// before any output: a 429 (an upstream's passed on, weir's quota error,
// a final usage limit), or an error event saying so.
func (q *Request) rateLimited() bool {
	if q.Outcome != OutcomeError || q.Output {
		return false
	}
	switch q.ErrType {
	case "rate_limit_error", "rate_limit_exceeded", "usage_limit_reached", "insufficient_quota":
		return true
	}
	return q.Status == http.StatusTooManyRequests
}

// stormSettle is how long after a storm's end a request that failed
// still failed in it: the storm's last 529 was answered just before.
const stormSettle = time.Second

// checkHeld: invariant 7, a pool's verdict over all its accounts. No
// request was answered as rate-limited (rateLimited) unless, when it was
// answered, every account of its surface was out on a 429 of its own:
// spent, or under a rate_limit fault or within rateMargin after one. And
// no Messages request failed during a storm (by stormSettle after it)
// when its hold budget (CapacityHold from its start) outlasted the storm
// by stormSettle, unless something else was down during it (down), its
// worker was killed or paused, it had output or its client cancelled.
func (v *view) checkHeld() []Violation {
	limited := map[string][]span{} // account → when it was out on its own 429
	var storms []span
	for _, a := range v.Applied {
		switch {
		case a.Event.Kind == Spent:
			name := v.Accounts[a.Event.Target].Name
			limited[name] = append(limited[name], span{a.From, a.To})
		case a.Event.Kind == Upstream && a.Event.Fault == "rate_limit":
			name := v.Accounts[a.Event.Target].Name
			limited[name] = append(limited[name], span{a.From, a.To + rateMargin})
		case a.Event.Kind == Storm:
			storms = append(storms, span{a.From, a.To})
		}
	}
	within := func(t time.Duration, ss []span) bool {
		return slices.ContainsFunc(ss, func(s span) bool { return s.from <= t && t <= s.to })
	}
	down := v.down()
	var out []Violation
	for i := range v.Requests {
		q := &v.Requests[i]
		if q.rateLimited() {
			var servable []string
			for _, acct := range v.Accounts {
				if acct.Anthropic == (q.Surface == "messages") && !within(q.End, limited[acct.Name]) {
					servable = append(servable, acct.Name)
				}
			}
			if len(servable) > 0 {
				what := fmt.Sprintf("request %d was answered %d %s", q.N, q.Status, q.ErrType)
				switch {
				case q.Final:
					what += " (a final usage limit)"
				case q.Claim != "":
					what += fmt.Sprintf(" (an upstream's %s rejection passed on)", q.Claim)
				}
				out = append(out, Violation{Invariant: InvHeld, At: q.End, Requests: []int{q.N}, Accounts: servable,
					What: fmt.Sprintf("%s though %s had no 429 of its own", what, strings.Join(servable, ", "))})
			}
			continue
		}
		if q.Surface != "messages" || !q.Retryable() || q.Output || q.Cancel != "" || v.workerTroubled(q) {
			continue
		}
		for _, st := range storms {
			if q.End < st.from || q.End > st.to+stormSettle || q.Start+v.CapacityHold <= st.to+stormSettle {
				continue
			}
			if len(intersect([]span{{q.Start, q.End}}, down)) > 0 {
				continue
			}
			out = append(out, Violation{Invariant: InvHeld, At: q.End, Requests: []int{q.N},
				What: fmt.Sprintf("request %d failed (%d %s) in the storm %s→%s though its hold budget ran to %s",
					q.N, q.Status, q.ErrType, fmtRel(st.from), fmtRel(st.to), fmtRel(q.Start+v.CapacityHold))})
			break
		}
	}
	return out
}

// coolSettle is how long after a spent account's 429 ended another
// attempt on it may still start: the 429's Release, sent on the request
// path as soon as the answer is read, writes the account's cooldown
// within a round trip; the rest is room for a loaded machine.
const coolSettle = time.Second

// spentAttempts are the attempts on a spent account, by start.
func (v *view) spentAttempts(name string) []sim.Attempt {
	var out []sim.Attempt
	for _, list := range v.atts {
		for _, a := range list {
			if a.Account == name {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, func(a, b sim.Attempt) int { return a.Time.Compare(b.Time) })
	return out
}

// checkCooled: invariant 8. Once a spent account's 429 (attempt a) has
// cooled it, it gets no attempt before its reset: an attempt b on it
// that starts more than coolSettle after a ended is a violation, unless
// a's Release may not have been written by then: a fault on the control
// side (disturbed) in force between a's end (less reportHeldUp: a
// Release waits that long before it is sent again) and b's start, or a's
// worker killed or paused between a's start and b's start (its Release
// died with it, or waited), or b's worker paused in that time (its lease
// may predate the cooldown). So each attempt after the first on a spent
// account is one a fault explains, or one of those racing the first
// 429's Release.
func (v *view) checkCooled() []Violation {
	var out []Violation
	for _, name := range slices.Sorted(maps.Keys(v.spent)) {
		list := v.spentAttempts(name)
		for j, b := range list {
			for _, a := range list[:j] {
				if a.Status != http.StatusTooManyRequests || a.Ended.IsZero() || v.rel(a.Ended)+coolSettle >= v.rel(b.Time) || v.releaseMayLag(a, b) {
					continue
				}
				viol := Violation{Invariant: InvCooled, At: v.rel(b.Time), Accounts: []string{name},
					What: fmt.Sprintf("spent account %s was tried at %s, %s after its 429 ended at %s had cooled it",
						name, fmtRel(v.rel(b.Time)), b.Time.Sub(a.Ended).Round(time.Millisecond), fmtRel(v.rel(a.Ended)))}
				for _, x := range []sim.Attempt{a, b} {
					if q := v.bySHA[x.BodySHA256]; q != nil && !slices.Contains(viol.Requests, q.N) {
						viol.Requests = append(viol.Requests, q.N)
					}
				}
				out = append(out, viol)
				break
			}
		}
	}
	return out
}

// releaseMayLag says whether the Release of a spent account's 429 a may
// not have been written when attempt b on the account started (checkCooled).
func (v *view) releaseMayLag(a, b sim.Attempt) bool {
	qa, qb := v.bySHA[a.BodySHA256], v.bySHA[b.BodySHA256]
	if qa == nil || qb == nil {
		return true // invariant 3 names it
	}
	from, ended, to := v.rel(a.Time), v.rel(a.Ended), v.rel(b.Time)
	for _, s := range v.disturbed {
		if s.from <= to && s.to+reportHeldUp >= ended {
			return true
		}
	}
	for _, x := range v.Applied {
		overlaps := x.From <= to && x.To >= from
		switch x.Event.Kind {
		case KillWorker:
			if x.Event.Target == qa.Worker && x.Incarnation == qa.Incarnation && overlaps {
				return true
			}
		case PauseWorker:
			if (x.Event.Target == qa.Worker || x.Event.Target == qb.Worker) && overlaps {
				return true
			}
		}
	}
	return false
}

// resetSlack is how far a spent account's cooldown may end from the reset
// its 429s named: the reset is sent in whole seconds.
const resetSlack = 2 * time.Second

// checkReset: invariant 9. A spent account tried at least once is, at
// the end of the run, cooled for its quota (quota_exhausted) until the
// reset its 429s named: ResetIn after one of them (the latest wins).
// Without a cooldown it is a violation unless every 429 on it came from
// a worker killed after it (its Release died in the worker's outbox).
func (v *view) checkReset() []Violation {
	var out []Violation
	for _, name := range slices.Sorted(maps.Keys(v.spent)) {
		e := v.spent[name]
		var rejected []sim.Attempt
		landed := false
		for _, a := range v.spentAttempts(name) {
			if a.Status != http.StatusTooManyRequests || a.Ended.IsZero() {
				continue
			}
			rejected = append(rejected, a)
			if q := v.bySHA[a.BodySHA256]; q != nil {
				if k, killed := v.killed[[2]int{q.Worker, q.Incarnation}]; !killed || k < v.rel(a.Time) {
					landed = true
				}
			}
		}
		if len(rejected) == 0 {
			continue
		}
		lo := v.rel(rejected[0].Time) + e.ResetIn - resetSlack
		hi := v.rel(rejected[len(rejected)-1].Ended) + e.ResetIn + resetSlack
		i := slices.IndexFunc(v.Cooldowns, func(c Cooldown) bool { return c.Account == name })
		viol := Violation{Invariant: InvReset, At: v.rel(rejected[0].Time), Accounts: []string{name}}
		switch {
		case i < 0 && landed:
			viol.What = fmt.Sprintf("spent account %s answered %d 429s naming a reset %s away, and has no cooldown", name, len(rejected), e.ResetIn)
		case i < 0:
			continue
		case v.Cooldowns[i].Reason != "quota_exhausted":
			viol.What = fmt.Sprintf("spent account %s is cooled for %s, not its quota", name, v.Cooldowns[i].Reason)
		default:
			until := v.rel(v.Cooldowns[i].Until)
			if until >= lo && until <= hi {
				continue
			}
			viol.What = fmt.Sprintf("spent account %s is cooled until %s, its 429s named %s to %s",
				name, fmtRel(until), fmtRel(lo+resetSlack), fmtRel(hi-resetSlack))
		}
		out = append(out, viol)
	}
	return out
}

// workerTroubled says whether q's worker was killed or paused during q.
func (v *view) workerTroubled(q *Request) bool {
	for _, a := range v.Applied {
		if (a.Event.Kind == KillWorker || a.Event.Kind == PauseWorker) && a.Event.Target == q.Worker && a.From <= q.End && a.To >= q.Start {
			return true
		}
	}
	return false
}

// span is a stretch of time from the start of traffic.
type span struct{ from, to time.Duration }

// union merges spans into sorted, disjoint ones.
func union(ss []span) []span {
	ss = slices.Clone(ss)
	slices.SortFunc(ss, func(a, b span) int { return cmp.Compare(a.from, b.from) })
	var out []span
	for _, s := range ss {
		if s.to <= s.from {
			continue
		}
		if n := len(out); n > 0 && s.from <= out[n-1].to {
			out[n-1].to = max(out[n-1].to, s.to)
			continue
		}
		out = append(out, s)
	}
	return out
}

// intersect is where both sorted disjoint lists hold.
func intersect(a, b []span) []span {
	var out []span
	for _, x := range a {
		for _, y := range b {
			if f, t := max(x.from, y.from), min(x.to, y.to); f < t {
				out = append(out, span{f, t})
			}
		}
	}
	return union(out)
}

// subtract is a without b.
func subtract(a, b []span) []span {
	out := slices.Clone(a)
	for _, y := range b {
		var next []span
		for _, x := range out {
			if y.to <= x.from || y.from >= x.to {
				next = append(next, x)
				continue
			}
			if x.from < y.from {
				next = append(next, span{x.from, y.from})
			}
			if y.to < x.to {
				next = append(next, span{y.to, x.to})
			}
		}
		out = next
	}
	return out
}

// Timeline writes what reproduces vs: the schedule as it ran, then each
// request a violation names with its attempts, all from the start.
func Timeline(r *Record, vs []Violation) string {
	v := newView(r)
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %d violations\n", r.Seed, len(vs))
	for _, x := range vs {
		fmt.Fprintf(&b, "  %s\n", x)
	}
	fmt.Fprintf(&b, "schedule as it ran (traffic %s→%s):\n", fmtRel(0), fmtRel(r.Stopped))
	for _, a := range r.Applied {
		fmt.Fprintf(&b, "  %s\n", a)
	}
	seen := map[int]bool{}
	accounts := map[string]bool{}
	for _, x := range vs {
		for _, a := range x.Accounts {
			accounts[a] = true
		}
		for _, n := range x.Requests {
			if seen[n] {
				continue
			}
			seen[n] = true
			q := r.Requests[slices.IndexFunc(r.Requests, func(q Request) bool { return q.N == n })]
			fmt.Fprintf(&b, "%s\n", q)
			for _, a := range v.atts[q.SHA] {
				fmt.Fprintf(&b, "    %s\n", v.attemptLine(a))
			}
		}
	}
	for name := range accounts {
		if name == "" {
			continue
		}
		fmt.Fprintf(&b, "attempts on %s near the violations:\n", name)
		for _, list := range v.atts {
			for _, a := range list {
				if a.Account != name || !near(v.interval(a), vs) {
					continue
				}
				n := -1
				if q := v.bySHA[a.BodySHA256]; q != nil {
					n = q.N
				}
				fmt.Fprintf(&b, "    req %d %s\n", n, v.attemptLine(a))
			}
		}
	}
	return b.String()
}

func (v *view) attemptLine(a sim.Attempt) string {
	s := v.interval(a)
	line := fmt.Sprintf("attempt %s→%s on %s %s %d", fmtRel(s.from), fmtRel(s.to), a.Account, a.Outcome, a.Status)
	if !a.Output.IsZero() {
		line += " output " + fmtRel(v.rel(a.Output))
	}
	if a.ClientGone {
		line += " client gone"
	}
	return line
}

// near says whether s is within a second of a violation.
func near(s span, vs []Violation) bool {
	for _, x := range vs {
		if s.from <= x.At+time.Second && s.to >= x.At-time.Second {
			return true
		}
	}
	return false
}
