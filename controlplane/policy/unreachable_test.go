package policy

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/vocab"
)

// unreachableSince gives a Candidate a live transport cooldown written at
// epoch+written, the run's start at epoch+since, attempts failures long.
func unreachableSince(written, since time.Duration, attempts int32, cause string) func(*Candidate) {
	return func(x *Candidate) {
		start := epoch.Add(since)
		b, _ := json.Marshal(Evidence{Class: "transport_error", TransportError: "no such host", Cause: cause, Since: &start, Attempts: attempts})
		x.Cooldown = &Cooldown{Reason: weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT, Transient: true,
			Until: epoch.Add(written + TransportCooldown), WrittenAt: epoch.Add(written), Evidence: b}
	}
}

// TestRouteUnreachable: NoAccount.unreachable is set exactly when every
// account that could serve without an operator cools on a transport
// failure (or was tried and does not cool), and names the run of the one
// that failed last.
func TestRouteUnreachable(t *testing.T) {
	t.Parallel()
	dns := unreachableSince(0, -time.Minute, 3, "dns")
	for _, tc := range []struct {
		name    string
		cands   []Candidate
		exclude []string
		surface weirv1.Surface
		breaker string // a provider whose breaker is open
		want    string // the named account's label; "" for none
	}{
		{"one unreachable", []Candidate{c("a", dns)}, nil, 0, "", "a"},
		{"the latest failure names the run", []Candidate{c("a", dns), c("b", unreachableSince(2*time.Second, -time.Hour, 9, "refused"))}, nil, 0, "", "b"},
		{"tried, not cooling: the worker's to judge", []Candidate{c("a", dns), c("b")}, []string{"b"}, 0, "", "a"},
		{"tried and unreachable", []Candidate{c("a", dns)}, []string{"a"}, 0, "", "a"},
		{"paused and broken need an operator", []Candidate{c("a", dns), c("p", paused()), c("x", broken())}, nil, 0, "", "a"},
		{"a rejected credential needs an operator", []Candidate{c("a", dns), c("r", cooling(time.Hour, false))}, nil, 0, "", "a"},
		{"another provider's accounts do not serve", []Candidate{c("a", dns), c("o", provider("openai"), cooling(time.Hour, true))}, nil, 0, "", "a"},
		{"one rate limited", []Candidate{c("a", dns), c("b", cooling(time.Minute, true))}, nil, 0, "", ""},
		{"one tried and rate limited", []Candidate{c("a", dns), c("b", cooling(time.Minute, true))}, []string{"b"}, 0, "", ""},
		{"one at its cap", []Candidate{c("a", dns), c("b", live(4))}, nil, 0, "", ""},
		{"a spent window as well", []Candidate{c("a", dns, func(x *Candidate) {
			x.SevenDay = &Window{Utilization: 1, ResetsAt: epoch.Add(time.Hour)}
		})}, nil, 0, "", ""},
		{"a family gate as well", []Candidate{c("a", dns, func(x *Candidate) {
			x.Gate = &Gate{Family: "sonnet", Until: epoch.Add(time.Hour)}
		})}, nil, 0, "", ""},
		{"only tried, none cooling", []Candidate{c("a")}, []string{"a"}, 0, "", ""},
		{"an open breaker's accounts answer",
			[]Candidate{c("x", provider("codex"), dns), c("o", provider("openai"))}, nil, weirv1.Surface_SURFACE_RESPONSES, "openai", ""},
		{"every provider of the surface unreachable",
			[]Candidate{c("x", provider("codex"), dns), c("o", provider("openai"), unreachableSince(time.Second, 0, 1, "tls"))}, nil, weirv1.Surface_SURFACE_RESPONSES, "", "o"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := RouteRequest{Model: "claude-sonnet-4-5", Surface: tc.surface, Exclude: map[uuid.UUID]bool{}}
			for _, l := range tc.exclude {
				req.Exclude[c(l).Account.ID] = true
			}
			if tc.breaker != "" {
				req.BreakerOpen = map[weirv1.Provider]bool{vocab.Value[weirv1.Provider](tc.breaker): true}
			}
			order, none := Route(tc.cands, req, epoch.Add(time.Second*3))
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
			var named Candidate
			for _, x := range tc.cands {
				if x.Account.Label == tc.want {
					named = x
				}
			}
			want := Unreachable(*named.Cooldown, named.Account.BaseURL)
			if u == nil || u.String() != want.String() {
				t.Fatalf("unreachable %v, want %s's run %v", u, tc.want, want)
			}
		})
	}
}

// TestContinueRun: a failure continuing a run keeps the run's start and
// counts one more; evidence from before runs started the run when it was
// written.
func TestContinueRun(t *testing.T) {
	t.Parallel()
	now := epoch.Add(time.Minute)
	first := Decide(&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, TransportError: "no such host",
		TransportCause: weirv1.TransportCause_TRANSPORT_CAUSE_DNS}, Facts{}, epoch).Cooldown
	var e Evidence
	if err := json.Unmarshal(first.Evidence, &e); err != nil || e.Cause != "dns" || e.Attempts != 1 || !e.Since.Equal(epoch) {
		t.Fatalf("first failure's evidence %s (%v)", first.Evidence, err)
	}
	next := Decide(&weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_TRANSPORT_ERROR, TransportError: "connection refused",
		TransportCause: weirv1.TransportCause_TRANSPORT_CAUSE_REFUSED}, Facts{}, now).Cooldown
	for _, tc := range []struct {
		prior    Cooldown
		since    time.Time
		attempts int32
	}{
		{Cooldown{WrittenAt: epoch, Evidence: first.Evidence}, epoch, 2},
		{Cooldown{WrittenAt: epoch.Add(30 * time.Second), Evidence: ContinueRun(first.Evidence, Cooldown{WrittenAt: epoch.Add(-time.Hour), Evidence: first.Evidence})}, epoch, 3},
		{Cooldown{WrittenAt: epoch.Add(10 * time.Second), Evidence: []byte(`{"class":"transport_error"}`)}, epoch.Add(10 * time.Second), 2},
		{Cooldown{WrittenAt: epoch.Add(20 * time.Second), Evidence: []byte(`not json`)}, epoch.Add(20 * time.Second), 2},
	} {
		var got Evidence
		if err := json.Unmarshal(ContinueRun(next.Evidence, tc.prior), &got); err != nil {
			t.Fatal(err)
		}
		if got.Cause != "refused" || got.TransportError != "connection refused" || !got.Since.Equal(tc.since) || got.Attempts != tc.attempts {
			t.Errorf("after %s: %+v, want refused since %v, %d attempts", tc.prior.Evidence, got, tc.since, tc.attempts)
		}
	}
	if got := EvidenceSummary(ContinueRun(next.Evidence, Cooldown{WrittenAt: epoch, Evidence: first.Evidence})); got !=
		"transport_error, refused: connection refused, 2 attempts since "+epoch.UTC().Format(time.RFC3339) {
		t.Errorf("summary %q", got)
	}
}
