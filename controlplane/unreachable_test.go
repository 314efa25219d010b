package controlplane

import (
	"encoding/json"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// unreachableSince gives a candidate a live transport cooldown written at
// epoch+written, the run's start at epoch+since, attempts failures long.
func unreachableSince(written, since time.Duration, attempts int32, cause string) func(*candidate) {
	return func(x *candidate) {
		start := epoch.Add(since)
		b, _ := json.Marshal(storedEvidence{Class: "transport_error", TransportError: "no such host", Cause: cause, Since: &start, Attempts: attempts})
		x.cooldown = &db.Cooldown{AccountID: x.account.ID, Reason: "transport", Transient: true,
			Until: epoch.Add(written + transportCooldown), WrittenAt: epoch.Add(written), Evidence: b}
	}
}

func baseURL(u string) func(*candidate) { return func(x *candidate) { x.account.BaseUrl = u } }

// TestRouteUnreachable: NoAccount.unreachable is set exactly when every
// account that could serve without an operator cools on a transport
// failure (or was tried and does not cool), and names the run of the one
// that failed last.
func TestRouteUnreachable(t *testing.T) {
	t.Parallel()
	dns := unreachableSince(0, -time.Minute, 3, "dns")
	for _, tc := range []struct {
		name    string
		cands   []candidate
		exclude []string
		surface weirv1.Surface
		breaker string // a provider whose breaker is open
		want    string // the named account's label; "" for none
	}{
		{"one unreachable", []candidate{c("a", dns)}, nil, 0, "", "a"},
		{"the latest failure names the run", []candidate{c("a", dns), c("b", unreachableSince(2*time.Second, -time.Hour, 9, "refused"))}, nil, 0, "", "b"},
		{"tried, not cooling: the worker's to judge", []candidate{c("a", dns), c("b")}, []string{"b"}, 0, "", "a"},
		{"tried and unreachable", []candidate{c("a", dns)}, []string{"a"}, 0, "", "a"},
		{"paused and broken need an operator", []candidate{c("a", dns), c("p", paused()), c("x", broken())}, nil, 0, "", "a"},
		{"a rejected credential needs an operator", []candidate{c("a", dns), c("r", cooling(time.Hour, false))}, nil, 0, "", "a"},
		{"another provider's accounts do not serve", []candidate{c("a", dns), c("o", provider("openai"), cooling(time.Hour, true))}, nil, 0, "", "a"},
		{"one rate limited", []candidate{c("a", dns), c("b", cooling(time.Minute, true))}, nil, 0, "", ""},
		{"one tried and rate limited", []candidate{c("a", dns), c("b", cooling(time.Minute, true))}, []string{"b"}, 0, "", ""},
		{"one at its cap", []candidate{c("a", dns), c("b", live(4))}, nil, 0, "", ""},
		{"a spent window as well", []candidate{c("a", dns, func(x *candidate) {
			x.sevenDay = &windowReading{utilization: 1, resetsAt: epoch.Add(time.Hour)}
		})}, nil, 0, "", ""},
		{"a family gate as well", []candidate{c("a", dns, func(x *candidate) {
			x.gate = &db.FamilyGate{AccountID: x.account.ID, Family: "sonnet", Until: epoch.Add(time.Hour)}
		})}, nil, 0, "", ""},
		{"only tried, none cooling", []candidate{c("a")}, []string{"a"}, 0, "", ""},
		{"an open breaker's accounts answer",
			[]candidate{c("x", provider("codex"), dns), c("o", provider("openai"))}, nil, weirv1.Surface_SURFACE_RESPONSES, "openai", ""},
		{"every provider of the surface unreachable",
			[]candidate{c("x", provider("codex"), dns), c("o", provider("openai"), unreachableSince(time.Second, 0, 1, "tls"))}, nil, weirv1.Surface_SURFACE_RESPONSES, "", "o"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := routeRequest{model: "claude-sonnet-4-5", surface: tc.surface, exclude: map[uuid.UUID]bool{}}
			for _, l := range tc.exclude {
				req.exclude[c(l).account.ID] = true
			}
			if tc.breaker != "" {
				req.breakerOpen = map[string]bool{tc.breaker: true}
			}
			order, none := route(tc.cands, req, epoch.Add(time.Second*3))
			if none == nil {
				t.Fatalf("leased %s, want no account", labelsOf(order))
			}
			u := none.Unreachable
			if tc.want == "" {
				if u != nil {
					t.Fatalf("unreachable %v, want none (%s)", u, none.Message)
				}
				return
			}
			var named candidate
			for _, x := range tc.cands {
				if x.account.Label == tc.want {
					named = x
				}
			}
			want := unreachableOf(*named.cooldown, named.account.Provider, named.account.BaseUrl)
			if u == nil || u.String() != want.String() {
				t.Fatalf("unreachable %v, want %s's run %v", u, tc.want, want)
			}
		})
	}
}

// TestUnreachableOf: a run reads back with the account's upstream host
// (its override, else the provider's default), and evidence from before
// runs is a run of one from when it was written.
func TestUnreachableOf(t *testing.T) {
	t.Parallel()
	x := c("a", unreachableSince(5*time.Second, -time.Minute, 14, "dns"), baseURL("https://api.example.invalid:8443/v1"))
	u := unreachableOf(*x.cooldown, x.account.Provider, x.account.BaseUrl)
	if u.Cause != weirv1.TransportCause_TRANSPORT_CAUSE_DNS || u.Error != "no such host" || u.Host != "api.example.invalid" ||
		!u.Since.AsTime().Equal(epoch.Add(-time.Minute)) || !u.LastAt.AsTime().Equal(epoch.Add(5*time.Second)) || u.Attempts != 14 {
		t.Errorf("run %v", u)
	}
	old := db.Cooldown{Reason: "transport", WrittenAt: epoch, Evidence: []byte(`{"class":"transport_error","transport_error":"connection refused"}`)}
	u = unreachableOf(old, "codex", "")
	if u.Cause != weirv1.TransportCause_TRANSPORT_CAUSE_OTHER || u.Host != "chatgpt.com" || !u.Since.AsTime().Equal(epoch) || u.Attempts != 1 {
		t.Errorf("run from old evidence %v", u)
	}
}

// TestContinueRun: a failure continuing a run keeps the run's start and
// counts one more; evidence from before runs started the run when it was
// written.
func TestContinueRun(t *testing.T) {
	t.Parallel()
	now := epoch.Add(time.Minute)
	first := decide(&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, TransportError: "no such host",
		TransportCause: weirv1.TransportCause_TRANSPORT_CAUSE_DNS}, attemptFacts{}, epoch).cooldown
	var e storedEvidence
	if err := json.Unmarshal(first.evidence, &e); err != nil || e.Cause != "dns" || e.Attempts != 1 || !e.Since.Equal(epoch) {
		t.Fatalf("first failure's evidence %s (%v)", first.evidence, err)
	}
	next := decide(&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, TransportError: "connection refused",
		TransportCause: weirv1.TransportCause_TRANSPORT_CAUSE_REFUSED}, attemptFacts{}, now).cooldown
	for _, tc := range []struct {
		prior    db.Cooldown
		since    time.Time
		attempts int32
	}{
		{db.Cooldown{WrittenAt: epoch, Evidence: first.evidence}, epoch, 2},
		{db.Cooldown{WrittenAt: epoch.Add(30 * time.Second), Evidence: continueRun(first.evidence, db.Cooldown{WrittenAt: epoch.Add(-time.Hour), Evidence: first.evidence})}, epoch, 3},
		{db.Cooldown{WrittenAt: epoch.Add(10 * time.Second), Evidence: []byte(`{"class":"transport_error"}`)}, epoch.Add(10 * time.Second), 2},
		{db.Cooldown{WrittenAt: epoch.Add(20 * time.Second), Evidence: []byte(`not json`)}, epoch.Add(20 * time.Second), 2},
	} {
		var got storedEvidence
		if err := json.Unmarshal(continueRun(next.evidence, tc.prior), &got); err != nil {
			t.Fatal(err)
		}
		if got.Cause != "refused" || got.TransportError != "connection refused" || !got.Since.Equal(tc.since) || got.Attempts != tc.attempts {
			t.Errorf("after %s: %+v, want refused since %v, %d attempts", tc.prior.Evidence, got, tc.since, tc.attempts)
		}
	}
	if got := evidenceSummary(continueRun(next.evidence, db.Cooldown{WrittenAt: epoch, Evidence: first.evidence})); got !=
		"transport_error, refused: connection refused, 2 attempts since "+epoch.UTC().Format(time.RFC3339) {
		t.Errorf("summary %q", got)
	}
}

// TestTransportRunReleased: the runs Release writes, as operators read
// them: each transport failure counts on from the last, whether or not its
// cooldown is still live; a success, or a new base URL, ends the run.
func TestTransportRunReleased(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, _ := e.createAccount(acct{baseURL: "https://api.example.invalid"})
	fail := func(cause weirv1.TransportCause, text string) {
		t.Helper()
		l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
		e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, TransportCause: cause, TransportError: text})
	}
	run := func() *weirv1.Unreachable {
		t.Helper()
		return e.getAccount(a.Id).Unreachable
	}
	start := e.clock.Now()
	fail(weirv1.TransportCause_TRANSPORT_CAUSE_DNS, "no such host")
	if u := run(); u == nil || u.Attempts != 1 || u.Cause != weirv1.TransportCause_TRANSPORT_CAUSE_DNS || u.Host != "api.example.invalid" || !u.Since.AsTime().Equal(start) {
		t.Fatalf("after one failure: %v", u)
	}
	// Past its cooldown, still the run.
	e.clock.Advance(transportCooldown + time.Second)
	if u := run(); u == nil || u.Attempts != 1 {
		t.Fatalf("the run ended with its cooldown: %v", u)
	}
	for range 13 {
		fail(weirv1.TransportCause_TRANSPORT_CAUSE_DNS, "no such host")
		e.clock.Advance(transportCooldown + time.Second)
	}
	last := e.clock.Now()
	fail(weirv1.TransportCause_TRANSPORT_CAUSE_REFUSED, "connection refused")
	u := run()
	if u == nil || u.Attempts != 15 || u.Cause != weirv1.TransportCause_TRANSPORT_CAUSE_REFUSED || u.Error != "connection refused" ||
		!u.Since.AsTime().Equal(start) || !u.LastAt.AsTime().Equal(last) {
		t.Fatalf("after 15 failures: %v", u)
	}
	if ev := e.getAccount(a.Id).Cooldown.GetEvidence(); ev != "transport_error, refused: connection refused, 15 attempts since "+start.UTC().Format(time.RFC3339) {
		t.Errorf("cooldown evidence %q", ev)
	}

	// A success ends it; the next failure starts another.
	e.clock.Advance(transportCooldown + time.Second)
	l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
	if u := run(); u != nil {
		t.Fatalf("a success left the run: %v", u)
	}
	e.clock.Advance(time.Second)
	again := e.clock.Now()
	fail(weirv1.TransportCause_TRANSPORT_CAUSE_TIMEOUT, "dial timeout")
	if u := run(); u == nil || u.Attempts != 1 || !u.Since.AsTime().Equal(again) {
		t.Fatalf("after the success, a new run: %v", u)
	}

	// A new base URL voids it, live cooldown and all.
	if _, err := e.admin.accounts.UpdateAccount(t.Context(), connect.NewRequest(&weirv1.UpdateAccountRequest{
		Id: a.Id, BaseUrl: "https://api.example.com", UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"base_url"}},
	})); err != nil {
		t.Fatal(err)
	}
	if got := e.getAccount(a.Id); got.Unreachable != nil || got.Cooldown != nil {
		t.Fatalf("a new base URL kept the run %v / cooldown %v", got.Unreachable, got.Cooldown)
	}
}
