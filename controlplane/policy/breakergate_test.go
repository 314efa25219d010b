package policy

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

func breakerNone(in time.Duration) *weirv1.NoAccount {
	return &weirv1.NoAccount{Reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_BREAKER_OPEN, RetryAt: timestamppb.New(epoch.Add(in))}
}

func TestGateBreakers(t *testing.T) {
	t.Parallel()
	codex, openai := weirv1.Provider_PROVIDER_CODEX, weirv1.Provider_PROVIDER_OPENAI
	both := []weirv1.Provider{codex, openai}
	probed := c("probed").Account.ID
	for _, tc := range []struct {
		name      string
		verdicts  []BreakerVerdict
		open      []weirv1.Provider
		probing   []weirv1.Provider
		avoid     []uuid.UUID
		noneIn    time.Duration // 0: no breaker answer
		closed    bool
		providers []weirv1.Provider
	}{
		{name: "no breaker open", providers: both},
		{name: "one of two providers kept out", providers: both,
			verdicts: []BreakerVerdict{{Provider: codex, None: breakerNone(30 * time.Second)}},
			open:     []weirv1.Provider{codex}, noneIn: 30 * time.Second},
		{name: "both kept out: the soonest probe answers, without routing", providers: both,
			verdicts: []BreakerVerdict{{Provider: codex, None: breakerNone(30 * time.Second)}, {Provider: openai, None: breakerNone(10 * time.Second)}},
			open:     both, noneIn: 10 * time.Second, closed: true},
		{name: "the only provider kept out", providers: []weirv1.Provider{codex},
			verdicts: []BreakerVerdict{{Provider: codex, None: breakerNone(time.Minute)}},
			open:     []weirv1.Provider{codex}, noneIn: time.Minute, closed: true},
		{name: "this request probes, avoiding the accounts probed", providers: both,
			verdicts: []BreakerVerdict{{Provider: codex, Probe: true, Probed: []uuid.UUID{probed}}},
			probing:  []weirv1.Provider{codex}, avoid: []uuid.UUID{probed}},
		{name: "one probes, the other kept out: not closed", providers: both,
			verdicts: []BreakerVerdict{{Provider: codex, Probe: true}, {Provider: openai, None: breakerNone(5 * time.Second)}},
			open:     []weirv1.Provider{openai}, probing: []weirv1.Provider{codex}, noneIn: 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := GateBreakers(tc.providers, tc.verdicts)
			if len(g.Open) != len(tc.open) {
				t.Errorf("open %v, want %v", g.Open, tc.open)
			}
			for _, p := range tc.open {
				if !g.Open[p] {
					t.Errorf("open %v lacks %v", g.Open, p)
				}
			}
			if len(g.Probing) != len(tc.probing) {
				t.Errorf("probing %v, want %v", g.Probing, tc.probing)
			}
			for _, p := range tc.probing {
				if !g.Probing[p] {
					t.Errorf("probing %v lacks %v", g.Probing, p)
				}
			}
			if len(g.Avoid) != len(tc.avoid) {
				t.Errorf("avoid %v, want %v", g.Avoid, tc.avoid)
			}
			switch {
			case tc.noneIn == 0 && g.None != nil:
				t.Errorf("none %v, want none", g.None)
			case tc.noneIn != 0 && (g.None == nil || !g.None.RetryAt.AsTime().Equal(epoch.Add(tc.noneIn))):
				t.Errorf("none %v, want the breaker's at +%v", g.None, tc.noneIn)
			}
			if g.Closed != tc.closed {
				t.Errorf("closed %v, want %v", g.Closed, tc.closed)
			}
		})
	}
}

func TestRouteGated(t *testing.T) {
	t.Parallel()
	a, b := c("a"), c("b")
	req := RouteRequest{Model: "claude-sonnet-4-5", Surface: weirv1.Surface_SURFACE_MESSAGES}
	t.Run("the probe avoids an account probed already", func(t *testing.T) {
		order, none, round := RouteGated([]Candidate{a, b}, req, BreakerGate{Avoid: map[uuid.UUID]bool{a.Account.ID: true}}, epoch)
		if none != nil || labelsOf(order) != "b" || round {
			t.Errorf("order %s none %v newRound %v, want b alone in this round", labelsOf(order), none, round)
		}
	})
	t.Run("every account probed: the next round begins", func(t *testing.T) {
		avoid := map[uuid.UUID]bool{a.Account.ID: true, b.Account.ID: true}
		order, none, round := RouteGated([]Candidate{a, b}, req, BreakerGate{Avoid: avoid}, epoch)
		if none != nil || len(order) != 2 || !round {
			t.Errorf("order %s none %v newRound %v, want both in a new round", labelsOf(order), none, round)
		}
	})
	t.Run("nothing else serves: retried no later than the breaker's probe", func(t *testing.T) {
		cool := c("cool", cooling(time.Hour, true))
		_, none, _ := RouteGated([]Candidate{cool}, req, BreakerGate{None: breakerNone(time.Minute)}, epoch)
		if none == nil || !none.RetryAt.AsTime().Equal(epoch.Add(time.Minute)) || none.Reason != weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING {
			t.Errorf("none %v, want the pool's answer retried at the probe", none)
		}
	})
	t.Run("nothing else can recover: the breaker's answer", func(t *testing.T) {
		_, none, _ := RouteGated([]Candidate{c("p", paused())}, req, BreakerGate{None: breakerNone(time.Minute)}, epoch)
		if none.GetReason() != weirv1.NoAccountReason_NO_ACCOUNT_REASON_BREAKER_OPEN {
			t.Errorf("none %v, want the breaker's", none)
		}
	})
}
