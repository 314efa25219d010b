package policy

import (
	"maps"
	"time"

	"github.com/google/uuid"
	"google.golang.org/protobuf/proto"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// BreakerVerdict is one provider's open breaker as one Acquire met it
// (the control plane's breakerGate reads and claims it).
type BreakerVerdict struct {
	Provider weirv1.Provider
	// None is the breaker's answer when it keeps the provider's accounts
	// out of this Acquire; nil when it lets the request through.
	None *weirv1.NoAccount
	// Probe: this request takes the provider's next probe; Probed are the
	// accounts a probe already went to in this round.
	Probe  bool
	Probed []uuid.UUID
}

// BreakerGate is what a request's open breakers mean for its routing.
type BreakerGate struct {
	// Open names the providers whose accounts the breakers keep out
	// (RouteRequest.BreakerOpen); None is the soonest of their answers.
	Open map[weirv1.Provider]bool
	None *weirv1.NoAccount
	// Probing names the providers whose probe this request holds: a
	// probe reports back once, so its lease is never reused.
	Probing map[weirv1.Provider]bool
	// Avoid are the accounts a probe already failed on since the breaker
	// opened: the probe goes elsewhere while it can.
	Avoid map[uuid.UUID]bool
	// Closed: every provider of the request's surface is kept out, and
	// None is the answer without routing.
	Closed bool
}

// GateBreakers folds the verdicts of the open breakers of a request's
// providers (the surface's, ProvidersFor) into its gate. Pure.
func GateBreakers(providers []weirv1.Provider, verdicts []BreakerVerdict) BreakerGate {
	var g BreakerGate
	for _, v := range verdicts {
		switch {
		case v.None != nil:
			if g.Open == nil {
				g.Open = map[weirv1.Provider]bool{}
			}
			g.Open[v.Provider] = true
			if g.None == nil || v.None.GetRetryAt().AsTime().Before(g.None.GetRetryAt().AsTime()) {
				g.None = v.None
			}
		case v.Probe:
			if g.Probing == nil {
				g.Probing = map[weirv1.Provider]bool{}
			}
			g.Probing[v.Provider] = true
			for _, id := range v.Probed {
				if g.Avoid == nil {
					g.Avoid = map[uuid.UUID]bool{}
				}
				g.Avoid[id] = true
			}
		}
	}
	g.Closed = g.None != nil && len(g.Open) == len(providers)
	return g
}

// RouteGated is Route behind the gate: the probe avoids the accounts
// probed already while another can serve (newRound: every account left was
// probed, and this probe begins the next round), and an answer that
// nothing can serve is joined with the open breakers' (WithBreaker). req
// carries the gate's Open already. Pure.
func RouteGated(cands []Candidate, req RouteRequest, g BreakerGate, now time.Time) (order []Candidate, none *weirv1.NoAccount, newRound bool) {
	o, none, newRound := RouteGatedFirst(cands, req, g, now, 0)
	return o.First, none, newRound
}

// RouteGatedFirst is RouteGated ranking only the best k eligible accounts
// (RouteFirst; k <= 0: all of them). Pure.
func RouteGatedFirst(cands []Candidate, req RouteRequest, g BreakerGate, now time.Time, k int) (o Order, none *weirv1.NoAccount, newRound bool) {
	o, none = RouteFirst(cands, withAvoided(req, g.Avoid), now, k)
	if none != nil && g.Avoid != nil {
		o, none = RouteFirst(cands, req, now, k)
		newRound = true
	}
	if none != nil && g.None != nil {
		none = WithBreaker(none, g.None)
	}
	return o, none, newRound
}

// WithBreaker is the answer when the other providers' accounts cannot
// serve and an open breaker keeps one provider's out: the breaker's when
// the rest cannot recover on their own (none of them serves the model, or
// only an operator can help), since the breaker's accounts serve again
// once it closes; else the rest's answer, retried no later than the
// breaker's next probe. Pure.
func WithBreaker(none, breaker *weirv1.NoAccount) *weirv1.NoAccount {
	if none.Permanent || none.Reason == weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED {
		return breaker
	}
	if none.RetryAt == nil || breaker.RetryAt.AsTime().Before(none.RetryAt.AsTime()) {
		none = proto.CloneOf(none)
		none.RetryAt = breaker.RetryAt
	}
	return none
}

// withAvoided is req with the avoided accounts excluded as well.
func withAvoided(req RouteRequest, avoid map[uuid.UUID]bool) RouteRequest {
	if len(avoid) == 0 {
		return req
	}
	ex := maps.Clone(req.Exclude)
	if ex == nil {
		ex = map[uuid.UUID]bool{}
	}
	maps.Copy(ex, avoid)
	req.Exclude = ex
	return req
}
