package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/weirhq/weir/internal/sim"
)

// t0 is the start of traffic in the hand-made records.
var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
func sec(s float64) time.Duration {
	return time.Duration(s * float64(time.Second))
}

// req is a request of a hand-made record answered whole with its route
// event.
func req(n int, sha string, from, to float64) Request {
	return Request{N: n, SHA: sha, Model: messagesModel, Surface: "messages", Start: sec(from), End: sec(to),
		Status: 200, RequestID: "weir_" + sha, Outcome: OutcomeOK, Terminals: 1, Output: true}
}

func event(q Request) RouteEvent {
	return RouteEvent{RequestID: q.RequestID, Surface: q.Surface, Model: q.Model, Stream: q.Stream, Status: q.Status, StartedAt: at(q.Start.Seconds())}
}

// att is an attempt on account of sha's body from → to.
func att(account, sha string, from, to float64) sim.Attempt {
	return sim.Attempt{Time: at(from), Ended: at(to), Account: account, Model: messagesModel, Path: "/v1/messages", BodySHA256: sha, Outcome: "ok", Status: 200}
}

// record builds a clean record of reqs, their events and attempts.
func record(reqs []Request, atts ...sim.Attempt) *Record {
	r := &Record{Start: t0, Stopped: sec(20), Collected: sec(30), Accounts: pool, Requests: reqs, Attempts: atts, LeaseTTL: 8 * time.Second,
		CapacityHold: 12 * time.Second}
	for _, q := range reqs {
		if q.RequestID != "" {
			r.Events = append(r.Events, event(q))
		}
	}
	return r
}

// only checks that vs are exactly one violation of inv, containing what.
func only(t *testing.T, vs []Violation, inv int, what string) Violation {
	t.Helper()
	if len(vs) != 1 || vs[0].Invariant != inv || !strings.Contains(vs[0].What, what) {
		t.Fatalf("violations %v, want one of invariant %d about %q", vs, inv, what)
	}
	return vs[0]
}

func none(t *testing.T, vs []Violation) {
	t.Helper()
	if len(vs) != 0 {
		t.Fatalf("violations %v, want none", vs)
	}
}

func TestCheckCap(t *testing.T) {
	t.Parallel()
	a, b := req(1, "a", 1, 2), req(2, "b", 1, 2)
	// anth-0 has a cap of 1: two in flight at once break it.
	v := only(t, Check(record([]Request{a, b}, att("anth-0", "a", 1, 2), att("anth-0", "b", 1.5, 2))), InvCap, "2 requests in flight, cap 1")
	if len(v.Requests) != 2 || v.Known != "" {
		t.Errorf("violation %+v: want both requests named, not known", v)
	}
	// One after the other (touching) is fine; so is cap 2 on anth-1.
	none(t, Check(record([]Request{a, b}, att("anth-0", "a", 1, 2), att("anth-0", "b", 2, 3))))
	none(t, Check(record([]Request{a, b}, att("anth-1", "a", 1, 2), att("anth-1", "b", 1.5, 2))))
	// An attempt whose client went away ends a grace before the simulator
	// noticed.
	gone := att("anth-0", "a", 1, 2.05)
	gone.ClientGone = true
	none(t, Check(record([]Request{a, b}, gone, att("anth-0", "b", 2, 3))))
	// After an outage of any length it is still a violation.
	r := record([]Request{a, b}, att("anth-0", "a", 5, 6), att("anth-0", "b", 5.5, 6))
	r.Applied = []Applied{{Event: Event{Kind: StopPostgres}, From: sec(0.5), To: sec(4.5)}}
	if v := only(t, Check(r), InvCap, "cap 1"); v.Known != "" {
		t.Errorf("known %q after an outage, want a violation", v.Known)
	}
}

func TestCheckNoReplayAfterOutput(t *testing.T) {
	t.Parallel()
	q := req(1, "a", 1, 3)
	first := att("anth-1", "a", 1, 1.5)
	first.Output, first.Outcome = at(1.2), "reset_after_output"
	only(t, Check(record([]Request{q}, first, att("anth-2", "a", 1.6, 2))), InvNoReplay, "replayed on anth-2")
	// A replay after an attempt that sent nothing is what weir should do.
	first.Output = time.Time{}
	none(t, Check(record([]Request{q}, first, att("anth-2", "a", 1.6, 2))))
}

func TestCheckSameBody(t *testing.T) {
	t.Parallel()
	q := req(1, "a", 1, 3)
	only(t, Check(record([]Request{q}, att("anth-1", "a", 1, 2), att("anth-2", "zz", 1.5, 2))), InvSameBody, "no client sent")
	other := att("anth-2", "a", 1.5, 2)
	other.Model = "claude-opus-4-1-20250805"
	only(t, Check(record([]Request{q}, other)), InvSameBody, "has model")
}

func TestCheckOnce(t *testing.T) {
	t.Parallel()
	twice := req(1, "a", 1, 2)
	twice.Outcome, twice.Terminals = OutcomeTwice, 2
	only(t, Check(record([]Request{twice}, att("anth-1", "a", 1, 2))), InvOnce, "2 final events")

	cut := req(1, "a", 1, 2)
	cut.Outcome, cut.RequestID, cut.Detail = OutcomeCut, "", "unexpected EOF"
	only(t, Check(record([]Request{cut}, att("anth-1", "a", 1, 2))), InvOnce, "no whole answer from a live worker")

	// Answered, but no event under its id: a violation, known only when
	// its worker was killed before it could report it: within the report
	// window of its end, or while a fault on the control side held its
	// reports up.
	lost := req(1, "a", 1, 2)
	r := record([]Request{lost}, att("anth-1", "a", 1, 2))
	r.Events = nil
	if v := only(t, Check(r), InvOnce, "has 0 route events"); v.Known != "" {
		t.Errorf("known %q with no kill", v.Known)
	}
	r.Applied = []Applied{{Event: Event{Kind: KillWorker}, From: sec(2.1), To: sec(3), Incarnation: 0}}
	if v := only(t, Check(r), InvOnce, "has 0 route events"); v.Known != KnownKilledWorker {
		t.Errorf("killed 100 ms after the answer: known %q, want %q", v.Known, KnownKilledWorker)
	}
	r.Applied = []Applied{{Event: Event{Kind: KillWorker}, From: sec(2.4), To: sec(3), Incarnation: 0}}
	if v := only(t, Check(r), InvOnce, "has 0 route events"); v.Known != KnownKilledWorker {
		t.Errorf("killed 400 ms after the answer (within a report interval and a call): known %q, want %q", v.Known, KnownKilledWorker)
	}
	r.Applied = []Applied{{Event: Event{Kind: KillWorker}, From: sec(2.6), To: sec(3), Incarnation: 0}}
	if v := only(t, Check(r), InvOnce, "has 0 route events"); v.Known != "" {
		t.Errorf("killed 600 ms after the answer with the control side well: known %q, want a violation", v.Known)
	}
	r.Applied = append(r.Applied, Applied{Event: Event{Kind: PauseControlPlane, Target: 1}, From: sec(1.5), To: sec(1.8)})
	if v := only(t, Check(r), InvOnce, "has 0 route events"); v.Known != KnownKilledWorker {
		t.Errorf("killed while a paused control plane held reports up: known %q, want %q", v.Known, KnownKilledWorker)
	}

	// Refused at once during an outage (the key unverified) and not
	// recorded: a violation (such a request is recorded without a key).
	refused := req(1, "a", 3, 3.01)
	refused.Status, refused.Outcome, refused.Output = 503, OutcomeError, false
	r = record([]Request{refused})
	r.Events = nil
	r.Applied = []Applied{{Event: Event{Kind: StopPostgres}, From: sec(2), To: sec(4)}}
	if v := only(t, Check(r), InvOnce, "has 0 route events"); v.Known != "" {
		t.Errorf("known %q, want a violation", v.Known)
	}

	// A request its client gave up on while its worker could not check
	// the key is recorded with no model: that event stands for it.
	unchecked := req(1, "a", 3, 3.5)
	unchecked.Outcome, unchecked.RequestID, unchecked.Cancel = OutcomeCancelled, "", "mid_request"
	r = record([]Request{unchecked})
	r.Events = []RouteEvent{{RequestID: "weir_x", Surface: unchecked.Surface, Status: 503, StartedAt: at(3.1)}}
	none(t, Check(r))

	// A request killed under its worker after reaching the upstream needs
	// an event nobody saw the id of.
	killed := cut
	r = record([]Request{killed}, att("anth-1", "a", 1, 2))
	r.Applied = []Applied{{Event: Event{Kind: KillWorker}, From: sec(2), To: sec(3)}}
	only(t, Check(r), InvOnce, "no route event stands for it")
	r.Events = []RouteEvent{{RequestID: "weir_unseen", Surface: "messages", Model: messagesModel, StartedAt: at(1)}}
	none(t, Check(r))

	// A request its client gave up on while its worker was paused: the
	// worker dates its event when it runs again.
	gaveUp := req(1, "a", 1, 1.3)
	gaveUp.Outcome, gaveUp.RequestID, gaveUp.Cancel = OutcomeCancelled, "", "mid_request"
	r = record([]Request{gaveUp})
	r.Events = []RouteEvent{{RequestID: "weir_late", Surface: "messages", Model: messagesModel, StartedAt: at(2.5)}}
	only(t, Check(r), InvOnce, "stands for no client request")
	r.Applied = []Applied{{Event: Event{Kind: PauseWorker}, From: sec(0.5), To: sec(2.5)}}
	none(t, Check(r))

	// A request its client gave up on before a loaded worker read it:
	// the worker dates its event after the client went away.
	r = record([]Request{gaveUp})
	r.Events = []RouteEvent{{RequestID: "weir_late", Surface: "messages", Model: messagesModel, StartedAt: at(1.3 + 0.9)}}
	none(t, Check(r))

	// Two abandoned requests whose events both fit the wider window: the
	// narrower takes its own first, whatever order they ended in.
	wide, narrow := req(1, "a", 1, 3), req(2, "b", 1.2, 1.3)
	for _, q := range []*Request{&wide, &narrow} {
		q.Outcome, q.RequestID, q.Cancel, q.Status, q.Output = OutcomeCancelled, "", "mid_request", 0, false
	}
	for _, order := range [][]Request{{wide, narrow}, {narrow, wide}} {
		r = record(order)
		r.Events = []RouteEvent{
			{RequestID: "weir_narrow", Surface: "messages", Model: messagesModel, StartedAt: at(1.25)},
			{RequestID: "weir_wide", Surface: "messages", Model: messagesModel, StartedAt: at(2.5)},
		}
		none(t, Check(r))
	}

	// An event no client request accounts for.
	q := req(1, "a", 1, 2)
	r = record([]Request{q}, att("anth-1", "a", 1, 2))
	r.Events = append(r.Events, RouteEvent{RequestID: "weir_extra", Surface: "responses", Model: responsesModel, StartedAt: at(5)})
	only(t, Check(r), InvOnce, "stands for no client request")
}

func TestCheckNoLease(t *testing.T) {
	t.Parallel()
	r := record(nil)
	r.Leases = []Lease{{Account: "anth-1", RequestID: "weir_x", Acquired: at(3), Expires: at(40)}}
	only(t, Check(r), InvNoLease, "lease on anth-1")
}

func TestCheckServable(t *testing.T) {
	t.Parallel()
	failed := req(1, "a", 1, 13)
	failed.Status, failed.Outcome, failed.Output, failed.ErrType = 503, OutcomeError, false, "overloaded_error"
	one := att("anth-0", "a", 1, 1.1)
	one.Outcome, one.Status = "overloaded", 529
	only(t, Check(record([]Request{failed}, one)), InvServable, "every component up")

	// Not while a storm had every Anthropic account overloaded, nor when
	// Postgres was down all along, nor when the client cancelled.
	r := record([]Request{failed}, one)
	r.Applied = []Applied{{Event: Event{Kind: Storm}, From: sec(0), To: sec(12)}}
	none(t, Check(r))
	r.Applied = []Applied{{Event: Event{Kind: StopPostgres}, From: sec(0.5), To: sec(12.5)}}
	none(t, Check(r))
	cancelled := failed
	cancelled.Cancel = "mid_request"
	none(t, Check(record([]Request{cancelled}, one)))
	// Nor when every account of the surface was at its cap.
	var busy []sim.Attempt
	var reqs = []Request{failed}
	for i, acct := range pool[:4] {
		for k := range acct.Cap {
			sha := string(rune('b'+i)) + string(rune('0'+k))
			reqs = append(reqs, req(10+i*4+k, sha, 0, 14))
			busy = append(busy, att(acct.Name, sha, 0, 14))
		}
	}
	none(t, Check(record(reqs, busy...)))
	// Nor when the only account with a slot free was spent all along.
	r = record(reqs[:1+1+2+2], busy[:1+2+2]...)
	only(t, Check(r), InvServable, "anth-3 was healthy")
	r.Applied = []Applied{{Event: Event{Kind: Spent, Target: 3, Claim: "seven_day", ResetIn: 30 * time.Hour}, From: sec(-2), To: sec(30)}}
	none(t, Check(r))
}

// spentAnth0 is anth-0 spent for the whole of a hand-made record, its
// 429s naming a reset 3 h after each answer.
var spentAnth0 = Applied{Event: Event{Kind: Spent, Target: 0, Fault: "rate_limit", Claim: "five_hour", ResetIn: 3 * time.Hour}, From: sec(-2), To: sec(30)}

// rejected is a 429 of spent anth-0 for sha's body from → to.
func rejected(sha string, from, to float64) sim.Attempt {
	a := att("anth-0", sha, from, to)
	a.Outcome, a.Status = "rate_limit", 429
	return a
}

// cooled is anth-0's cooldown until its reset, named by a 429 at s.
func cooled(s float64) []Cooldown {
	return []Cooldown{{Account: "anth-0", Reason: "quota_exhausted", Until: at(s).Add(3 * time.Hour)}}
}

func TestCheckHeld(t *testing.T) {
	t.Parallel()
	// The spent account's 429 passed on while anth-1..3 had none of their
	// own: a violation, whether passed on or made a final usage limit.
	limited := req(1, "a", 1, 1.2)
	limited.Status, limited.Outcome, limited.Output, limited.ErrType, limited.Claim = 429, OutcomeError, false, "rate_limit_error", "five_hour"
	r := record([]Request{limited}, rejected("a", 1, 1.1))
	r.Applied, r.Cooldowns = []Applied{spentAnth0}, cooled(1)
	v := only(t, Check(r), InvHeld, "five_hour rejection passed on) though anth-1, anth-2, anth-3 had no 429")
	if len(v.Requests) != 1 || v.Requests[0] != 1 {
		t.Errorf("violation %+v: want request 1 named", v)
	}
	final := limited
	final.Claim, final.Final = "", true
	r.Requests = []Request{final}
	only(t, Check(r), InvHeld, "a final usage limit")
	// Not when every other account was out on a 429 of its own, the last
	// within the minute a rate limit may cool it.
	for i := 1; i <= 3; i++ {
		r.Applied = append(r.Applied, Applied{Event: Event{Kind: Upstream, Target: i, Fault: "rate_limit"}, From: sec(-10 * float64(i)), To: sec(-10*float64(i) + 1)})
	}
	none(t, Check(r))
	// A 429 on Responses while oai-1 had none of its own.
	resp := req(2, "b", 1, 1.2)
	resp.Surface, resp.Model, resp.Status, resp.Outcome, resp.Output = "responses", responsesModel, 429, OutcomeError, false
	r = record([]Request{resp})
	r.Applied = []Applied{{Event: Event{Kind: Upstream, Target: 4, Fault: "rate_limit"}, From: sec(0.5), To: sec(2)}}
	only(t, Check(r), InvHeld, "though oai-1 had no 429")

	// A request failed in a storm on the others that its hold budget
	// outlasted: not held.
	stormed := req(3, "c", 1, 3)
	stormed.Status, stormed.Outcome, stormed.Output, stormed.ErrType = 529, OutcomeError, false, "overloaded_error"
	hit := att("anth-1", "c", 1, 1.1)
	hit.Outcome, hit.Status = "overloaded", 529
	r = record([]Request{stormed}, hit, rejected("c", 1.2, 1.3))
	storm := Applied{Event: Event{Kind: Storm}, From: sec(0.5), To: sec(4)}
	r.Applied, r.Cooldowns = []Applied{spentAnth0, storm}, cooled(1.2)
	only(t, Check(r), InvHeld, "failed (529 overloaded_error) in the storm")
	// Not when its budget ended with the storm, nor when a control plane
	// was killed during it, nor when its client cancelled.
	r.CapacityHold = 3 * time.Second
	none(t, Check(r))
	r.CapacityHold = 12 * time.Second
	r.Applied = append(r.Applied, Applied{Event: Event{Kind: KillControlPlane}, From: sec(2), To: sec(2.5)})
	none(t, Check(r))
	r.Applied = r.Applied[:2]
	cancelled := stormed
	cancelled.Cancel = "mid_request"
	r.Requests = []Request{cancelled}
	none(t, Check(r))
}

func TestCheckSpentStaysCooled(t *testing.T) {
	t.Parallel()
	a, b := req(1, "a", 1, 1.5), req(2, "b", 3, 3.5)
	b.Worker = 1
	r := record([]Request{a, b}, rejected("a", 1, 1.1), att("anth-1", "a", 1.1, 1.5), rejected("b", 3, 3.1), att("anth-1", "b", 3.1, 3.5))
	r.Applied, r.Cooldowns = []Applied{spentAnth0}, cooled(3)
	v := only(t, Check(r), InvCooled, "spent account anth-0 was tried at +3.00s, 1.9s after its 429 ended at +1.10s")
	if len(v.Requests) != 2 {
		t.Errorf("violation %+v: want both requests named", v)
	}
	// Within a second of the 429, a Release may still be on its way.
	b2 := req(2, "b", 1.15, 2)
	r.Requests[1], r.Events[1] = b2, event(b2)
	r.Attempts[2], r.Attempts[3] = rejected("b", 1.15, 1.2), att("anth-2", "b", 1.2, 2)
	r.Cooldowns = cooled(1.15)
	none(t, Check(r))
	// Nor when a fault may have kept the first 429's Release from the
	// database: its worker killed, Postgres stopped.
	r = record([]Request{a, b}, rejected("a", 1, 1.1), att("anth-1", "a", 1.1, 1.5), rejected("b", 3, 3.1), att("anth-1", "b", 3.1, 3.5))
	r.Cooldowns = cooled(3)
	r.Applied = []Applied{spentAnth0, {Event: Event{Kind: KillWorker, Target: 0}, From: sec(1.6), To: sec(2)}}
	none(t, Check(r))
	r.Applied = []Applied{spentAnth0, {Event: Event{Kind: StopPostgres}, From: sec(1.3), To: sec(2)}}
	none(t, Check(r))
	// A pause of another worker explains nothing.
	r.Applied = []Applied{spentAnth0, {Event: Event{Kind: PauseWorker, Target: 2}, From: sec(1.3), To: sec(2)}}
	only(t, Check(r), InvCooled, "spent account anth-0 was tried")
}

func TestCheckSpentReset(t *testing.T) {
	t.Parallel()
	a := req(1, "a", 1, 1.5)
	r := record([]Request{a}, rejected("a", 1, 1.1), att("anth-1", "a", 1.1, 1.5))
	r.Applied, r.Cooldowns = []Applied{spentAnth0}, cooled(1.05)
	none(t, Check(r))
	r.Cooldowns = nil
	only(t, Check(r), InvReset, "has no cooldown")
	r.Cooldowns = []Cooldown{{Account: "anth-0", Reason: "rate_limited", Until: at(61)}}
	only(t, Check(r), InvReset, "cooled for rate_limited, not its quota")
	r.Cooldowns = []Cooldown{{Account: "anth-0", Reason: "quota_exhausted", Until: at(1).Add(time.Hour)}}
	only(t, Check(r), InvReset, "its 429s named")
	// A 429 whose worker died after it may take its Release along.
	r.Cooldowns = nil
	r.Applied = []Applied{spentAnth0, {Event: Event{Kind: KillWorker, Target: 0}, From: sec(1.6), To: sec(2)}}
	none(t, Check(r))
	// A spent account never tried has nothing to show.
	r = record([]Request{a}, att("anth-1", "a", 1, 1.5))
	r.Applied = []Applied{spentAnth0}
	none(t, Check(r))
}

func TestSpans(t *testing.T) {
	t.Parallel()
	s := func(a, b float64) span { return span{sec(a), sec(b)} }
	if got := union([]span{s(3, 4), s(1, 2), s(1.5, 3)}); len(got) != 1 || got[0] != s(1, 4) {
		t.Errorf("union %v", got)
	}
	if got := intersect([]span{s(0, 5)}, []span{s(1, 2), s(4, 6)}); len(got) != 2 || got[0] != s(1, 2) || got[1] != s(4, 5) {
		t.Errorf("intersect %v", got)
	}
	if got := subtract([]span{s(0, 10)}, []span{s(2, 3), s(5, 6)}); len(got) != 3 || got[1] != s(3, 5) {
		t.Errorf("subtract %v", got)
	}
}
