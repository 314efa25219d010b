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
	r := &Record{Start: t0, Stopped: sec(20), Collected: sec(30), Accounts: pool, Requests: reqs, Attempts: atts, LeaseTTL: 8 * time.Second}
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
	r.Applied = []Applied{{Event: Event{Kind: KillWorker}, From: sec(2.5), To: sec(3), Incarnation: 0}}
	if v := only(t, Check(r), InvOnce, "has 0 route events"); v.Known != "" {
		t.Errorf("killed 500 ms after the answer with the control side well: known %q, want a violation", v.Known)
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
