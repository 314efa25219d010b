package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/sim"
)

// pair is the usual failover topology: "first" is preferred (priority) and
// carries the faults; "second" is healthy.
func pair(faults ...sim.Fault) []account {
	return []account{{label: "first", priority: 10, faults: faults}, {label: "second"}}
}

// servedBySecond checks a failover: 200 to the client, first tried then
// second, and the client's bytes are exactly second's.
func servedBySecond(t *testing.T, e *env, r response, firstOutcome string, firstStatus int) {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("status = %d, want 200: %s (simulator attempts %v)", r.status, r.body, e.attempts())
	}
	want := []string{"first:" + firstOutcome + ":" + strconv.Itoa(firstStatus), "second:ok:200"}
	if got := e.attempts(); !slices.Equal(got, want) {
		t.Fatalf("simulator attempts = %v, want %v", got, want)
	}
	xs := e.upstream.exchanges()
	if len(xs) != 2 {
		t.Fatalf("upstream saw %d requests", len(xs))
	}
	if !bytes.Equal(r.body, xs[1].body) {
		t.Errorf("client body is not second's:\n got %q\nwant %q", r.body, xs[1].body)
	}
	if len(xs[0].body) > 0 && bytes.Contains(r.body, xs[0].body) {
		t.Error("bytes of first's attempt reached the client")
	}
	// Both attempts carried the same request body: a replay, not a rewrite.
	att := e.sim.Attempts()
	if att[0].BodySHA256 != att[1].BodySHA256 {
		t.Error("the replayed body differs from the first attempt's")
	}
	ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
	if ev.Attempts != 2 || ev.AccountId != e.ids["second"] || ev.Status != 200 {
		t.Errorf("route event = %v", ev)
	}
	e.leasesReleased()
}

func TestFailoverOnRevokedCredential(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: pair(sim.Fault{Kind: sim.FaultRevoked, Times: -1})})
	r := e.post(false)
	servedBySecond(t, e, r, sim.FaultRevoked, 401)

	a := e.account("first")
	cd := a.GetCooldown()
	if a.State != weirv1.AccountState_ACCOUNT_STATE_COOLING || cd.GetReason() != weirv1.CooldownReason_COOLDOWN_REASON_INVALID_CREDENTIAL || cd.GetTransient() {
		t.Fatalf("first = state %v cooldown %v, want cooling with a non-transient invalid_credential cooldown", a.State, cd)
	}
	if !cd.Until.AsTime().After(time.Now()) {
		t.Errorf("cooldown until %v is not in the future", cd.Until.AsTime())
	}
	if !strings.Contains(cd.Evidence, "401") {
		t.Errorf("cooldown evidence %q does not name the 401", cd.Evidence)
	}
	// The next request goes straight to second.
	if r := e.post(false); r.status != 200 {
		t.Fatalf("second request: %d", r.status)
	}
	if got := e.attempts(); len(got) != 3 || got[2] != "second:ok:200" {
		t.Errorf("attempts = %v", got)
	}
}

func TestFailoverOnDroppedConnection(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: pair(sim.Fault{Kind: sim.FaultDropConnection})})
	r := e.post(false)
	servedBySecond(t, e, r, sim.FaultDropConnection, 0)
	if cd := e.account("first").GetCooldown(); cd.GetReason() != weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT || !cd.GetTransient() {
		t.Errorf("first's cooldown = %v, want a transient transport cooldown", cd)
	}
}

// TestFailoverOnOverloadedEvent: an overloaded error event before any output
// is replayed on another account; the client sees only that account's stream.
func TestFailoverOnOverloadedEvent(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: pair(sim.Fault{Kind: sim.FaultOverloadedEvent})})
	r := e.post(true)
	servedBySecond(t, e, r, sim.FaultOverloadedEvent, 200)
	if !strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
		t.Errorf("Content-Type = %q", r.header.Get("Content-Type"))
	}
	first := e.upstream.exchanges()[0]
	if !bytes.Contains(first.body, []byte("event: error")) || !bytes.Contains(first.body, []byte("event: message_start")) {
		t.Fatalf("first's attempt was not an overloaded event stream: %q", first.body)
	}
	// Neither first's message_start nor its error event reached the client.
	evs := sseEvents(t, r.body)
	if evs[0][0] != "message_start" || evs[len(evs)-1][0] != "message_stop" {
		t.Errorf("client stream = %v", evs)
	}
	for _, ev := range evs {
		if ev[0] == "error" {
			t.Errorf("client saw an error event: %s", ev[1])
		}
	}
	if strings.Count(string(r.body), "event: message_start") != 1 {
		t.Error("client saw two message_start events")
	}
	// Overload is the provider's, not the account's: no cooldown.
	if cd := e.account("first").GetCooldown(); cd != nil {
		t.Errorf("first is cooling after an overload: %v", cd)
	}
}

func TestFailoverOnRateLimit(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: pair(sim.Fault{Kind: sim.FaultRateLimit, RetryAfter: 30})})
	before := time.Now()
	r := e.post(false)
	after := time.Now()
	servedBySecond(t, e, r, sim.FaultRateLimit, 429)
	a := e.account("first")
	cd := a.GetCooldown()
	if a.State != weirv1.AccountState_ACCOUNT_STATE_COOLING || cd.GetReason() != weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED || !cd.GetTransient() {
		t.Fatalf("first = state %v cooldown %v, want a transient rate-limit cooldown", a.State, cd)
	}
	until := cd.Until.AsTime()
	lo, hi := before.Add(30*time.Second-time.Second), after.Add(30*time.Second+time.Second)
	if until.Before(lo) || until.After(hi) {
		t.Errorf("cooldown until %v, want about now+30s (%v … %v)", until, lo, hi)
	}
}

// TestErrorAfterContent: once output reached the client, an upstream error
// is relayed in-stream and nothing is replayed.
func TestErrorAfterContent(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: pair(sim.Fault{Kind: sim.FaultErrorAfterContent})})
	r := e.post(true)
	if r.status != http.StatusOK {
		t.Fatalf("status = %d: %s", r.status, r.body)
	}
	if got := e.attempts(); !slices.Equal(got, []string{"first:error_after_content:200"}) {
		t.Fatalf("attempts = %v, want one attempt on first", got)
	}
	up := e.upstream.only(t)
	if !bytes.HasPrefix(r.body, up.body) {
		t.Fatalf("client did not get the upstream's partial stream and error:\n got %q\nwant prefix %q", r.body, up.body)
	}
	evs := sseEvents(t, up.body)
	if last := evs[len(evs)-1]; last[0] != "error" || !strings.Contains(last[1], "overloaded_error") {
		t.Fatalf("upstream's last event = %v", last)
	}
	deltas := 0
	for _, ev := range sseEvents(t, r.body) {
		if ev[0] == "content_block_delta" {
			deltas++
		}
		if ev[0] == "message_stop" {
			t.Error("a cut stream reached message_stop")
		}
	}
	if deltas != 2 {
		t.Errorf("client got %d deltas, want the 2 sent before the error", deltas)
	}
	ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
	if ev.Attempts != 1 || ev.AccountId != e.ids["first"] || ev.ErrorType != "overloaded_error" {
		t.Errorf("route event = %v", ev)
	}
	e.leasesReleased()
}

// TestErrorAfterContentNothingAppended: the upstream's error event is the
// last thing the client gets.
func TestErrorAfterContentNothingAppended(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: pair(sim.Fault{Kind: sim.FaultErrorAfterContent})})
	r := e.post(true)
	if up := e.upstream.only(t); !bytes.Equal(r.body, up.body) {
		t.Errorf("client got %q, want exactly the upstream's %q", r.body, up.body)
	}
}

// TestDropMidStream: a stream cut after output ends, for the client, with
// weir's own error event after the partial stream.
func TestDropMidStream(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: pair(sim.Fault{Kind: sim.FaultDropMidStream})})
	r := e.post(true)
	if r.status != http.StatusOK {
		t.Fatalf("status = %d: %s", r.status, r.body)
	}
	if got := e.attempts(); !slices.Equal(got, []string{"first:drop_mid_stream:200"}) {
		t.Fatalf("attempts = %v, want one attempt on first", got)
	}
	up := e.upstream.only(t)
	rest, ok := bytes.CutPrefix(r.body, up.body)
	if !ok {
		t.Fatalf("client did not get the partial stream:\n got %q\nwant prefix %q", r.body, up.body)
	}
	evs := sseEvents(t, rest)
	if len(evs) != 1 || evs[0][0] != "error" {
		t.Fatalf("after the partial stream the client got %q, want one error event", rest)
	}
	var data apiError
	dataErr := json.Unmarshal([]byte(evs[0][1]), &data)
	if dataErr != nil || data.Type != "error" || data.Error.Type != "api_error" || data.Error.Message == "" {
		t.Errorf("error event data = %s (%v)", evs[0][1], dataErr)
	}
	if cd := e.account("first").GetCooldown(); cd != nil {
		t.Errorf("first is cooling after a stream cut: %v", cd)
	}
	e.leasesReleased()
}

// TestAllOverloaded: every account answers 529; the client gets the last
// upstream answer as it was, with an integer Retry-After.
func TestAllOverloaded(t *testing.T) {
	t.Parallel()
	for _, retryAfter := range []int{0, 7} {
		t.Run("retry-after "+strconv.Itoa(retryAfter), func(t *testing.T) {
			t.Parallel()
			f := sim.Fault{Kind: sim.FaultOverloaded, Times: -1, RetryAfter: retryAfter}
			e := setup(t, options{accounts: []account{{label: "first", priority: 10, faults: []sim.Fault{f}}, {label: "second", faults: []sim.Fault{f}}}})
			r := e.post(false)
			if r.status != 529 {
				t.Fatalf("status = %d, want 529: %s", r.status, r.body)
			}
			if got := e.attempts(); !slices.Equal(got, []string{"first:overloaded:529", "second:overloaded:529"}) {
				t.Errorf("attempts = %v", got)
			}
			xs := e.upstream.exchanges()
			last := xs[len(xs)-1]
			if !bytes.Equal(r.body, last.body) {
				t.Errorf("body = %s, want the upstream's %s", r.body, last.body)
			}
			if ae := decodeError(t, r.body); ae.Error.Type != "overloaded_error" || ae.RequestID != last.header.Get("Request-Id") {
				t.Errorf("error = %+v", ae)
			}
			got, has := r.header["Retry-After"]
			switch {
			case retryAfter == 0 && has:
				t.Errorf("Retry-After = %q, but the upstream sent none", got)
			case retryAfter > 0 && (!has || got[0] != strconv.Itoa(retryAfter)):
				t.Errorf("Retry-After = %q, want %d", got, retryAfter)
			}
			if r.header.Get("X-Should-Retry") != "true" {
				t.Errorf("X-Should-Retry = %q", r.header.Get("X-Should-Retry"))
			}
			ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
			if ev.Status != 529 || ev.Attempts != 2 {
				t.Errorf("route event = %v", ev)
			}
			e.leasesReleased()
		})
	}
}

func TestNoAccountsConfigured(t *testing.T) {
	t.Parallel()
	e := setup(t, options{})
	r := e.post(false)
	weirError(t, r, http.StatusServiceUnavailable, "api_error")
	if r.header.Get("X-Should-Retry") != "false" {
		t.Errorf("X-Should-Retry = %q, want false", r.header.Get("X-Should-Retry"))
	}
	if v := r.header.Get("Retry-After"); v != "" {
		t.Errorf("Retry-After = %q, want none", v)
	}
	if n := len(e.sim.Attempts()); n != 0 {
		t.Errorf("simulator saw %d attempts", n)
	}
}

func TestAllAccountsPaused(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: pair()})
	for label := range e.ids {
		if _, err := e.accounts.PauseAccount(t.Context(), connect.NewRequest(&weirv1.PauseAccountRequest{Id: label})); err != nil {
			t.Fatal(err)
		}
	}
	r := e.post(true)
	weirError(t, r, http.StatusServiceUnavailable, "api_error")
	if r.header.Get("X-Should-Retry") != "false" {
		t.Errorf("X-Should-Retry = %q, want false", r.header.Get("X-Should-Retry"))
	}
	if n := len(e.sim.Attempts()); n != 0 {
		t.Errorf("simulator saw %d attempts", n)
	}
	ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
	if ev.Status != 503 || ev.Attempts != 0 || ev.AccountId != "" {
		t.Errorf("route event = %v", ev)
	}
}

// TestAllAccountsCooling: the request that rate-limits every account gets
// the last upstream 429 passed through (proxy.go answer: the last upstream
// failure is the most truthful answer); the next request, with nothing to
// try, gets weir's 529 with the soonest recovery as integer Retry-After.
func TestAllAccountsCooling(t *testing.T) {
	t.Parallel()
	f := sim.Fault{Kind: sim.FaultRateLimit, RetryAfter: 120}
	e := setup(t, options{accounts: []account{{label: "first", priority: 10, faults: []sim.Fault{f}}, {label: "second", faults: []sim.Fault{f}}}})

	r := e.post(false)
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("status = %d, want the upstream's 429: %s", r.status, r.body)
	}
	xs := e.upstream.exchanges()
	if len(xs) != 2 || !bytes.Equal(r.body, xs[1].body) {
		t.Fatalf("body = %s, want second's 429 body", r.body)
	}
	if ae := decodeError(t, r.body); ae.Error.Type != "rate_limit_error" {
		t.Errorf("error type = %q", ae.Error.Type)
	}
	if got := r.header.Get("Retry-After"); got != "120" {
		t.Errorf("Retry-After = %q, want 120", got)
	}
	for label := range e.ids {
		if cd := e.account(label).GetCooldown(); cd.GetReason() != weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED {
			t.Fatalf("%s cooldown = %v", label, cd)
		}
	}

	r = e.post(false)
	weirError(t, r, 529, "overloaded_error")
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || ra < 100 || ra > 120 {
		t.Errorf("Retry-After = %q, want integer seconds close to 120", r.header.Get("Retry-After"))
	}
	if r.header.Get("X-Should-Retry") != "true" {
		t.Errorf("X-Should-Retry = %q", r.header.Get("X-Should-Retry"))
	}
	if n := len(e.sim.Attempts()); n != 2 {
		t.Errorf("simulator saw %d attempts, want no new ones: %v", n, e.attempts())
	}
	e.leasesReleased()
}

// TestClientErrorPassesThrough: a 400 is the request's fault; no other
// account would do better.
func TestClientErrorPassesThrough(t *testing.T) {
	t.Parallel()
	e := setup(t, options{accounts: pair(sim.Fault{Kind: sim.FaultBadRequest})})
	r := e.post(false)
	if r.status != http.StatusBadRequest {
		t.Fatalf("status = %d: %s", r.status, r.body)
	}
	up := e.upstream.only(t)
	if !bytes.Equal(r.body, up.body) {
		t.Errorf("body = %s, want the upstream's %s", r.body, up.body)
	}
	if ae := decodeError(t, r.body); ae.Error.Type != "invalid_request_error" {
		t.Errorf("error type = %q", ae.Error.Type)
	}
	if got := e.attempts(); !slices.Equal(got, []string{"first:bad_request:400"}) {
		t.Errorf("attempts = %v, want one", got)
	}
	if cd := e.account("first").GetCooldown(); cd != nil {
		t.Errorf("first is cooling after a client error: %v", cd)
	}
	ev := e.routeEvent(r.header.Get("Weir-Request-Id"))
	if ev.Status != 400 || ev.Attempts != 1 || ev.ErrorType != "invalid_request_error" {
		t.Errorf("route event = %v", ev)
	}
	e.leasesReleased()
}
