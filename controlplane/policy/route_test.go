package policy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/vocab"
)

// epoch is the tests' clock.
var epoch = time.Date(2030, time.March, 4, 5, 6, 7, 0, time.UTC)

func f64(v float64) *float64 { return &v }

// c builds a routing Candidate; options adjust it.
func c(label string, opts ...func(*Candidate)) Candidate {
	x := Candidate{Account: Account{
		ID: uuid.NewSHA1(uuid.NameSpaceOID, []byte(label)), Label: label,
		Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY, MaxConcurrency: 4,
	}}
	for _, o := range opts {
		o(&x)
	}
	return x
}

func prio(p int32) func(*Candidate)  { return func(x *Candidate) { x.Account.Priority = p } }
func capOf(n int32) func(*Candidate) { return func(x *Candidate) { x.Account.MaxConcurrency = n } }
func live(n int32) func(*Candidate)  { return func(x *Candidate) { x.Live = n } }
func paused() func(*Candidate)       { return func(x *Candidate) { x.Account.Paused = true } }
func provider(p string) func(*Candidate) {
	return func(x *Candidate) { x.Account.Provider = vocab.Value[weirv1.Provider](p) }
}
func broken() func(*Candidate)       { return func(x *Candidate) { x.Account.Broken = true } }
func ahead(n int32) func(*Candidate) { return func(x *Candidate) { x.WaitingAhead = n } }
func overloadedAgo(d time.Duration) func(*Candidate) {
	return func(x *Candidate) { t := epoch.Add(-d); x.Account.OverloadedAt = &t }
}
func usedAt(d time.Duration) func(*Candidate) {
	return func(x *Candidate) { t := epoch.Add(d); x.Account.LastUsedAt = &t }
}
func cooling(d time.Duration, transient bool) func(*Candidate) {
	return func(x *Candidate) {
		x.Cooldown = &Cooldown{Reason: weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED, Transient: transient, Until: epoch.Add(d), WrittenAt: epoch}
	}
}

func labelsOf(cs []Candidate) string {
	var l []string
	for _, x := range cs {
		l = append(l, x.Account.Label)
	}
	return strings.Join(l, ",")
}

func TestRouteOrder(t *testing.T) {
	t.Parallel()
	id := func(label string) uuid.UUID { return c(label).Account.ID }
	for _, tc := range []struct {
		name    string
		cands   []Candidate
		session string
		exclude []string
		want    string
	}{
		{"priority, higher first", []Candidate{c("a", prio(0)), c("b", prio(5)), c("c", prio(-1)), c("d", prio(2))}, "", nil, "b,d,a,c"},
		{"free share of the cap", []Candidate{c("a", live(2), capOf(4)), c("b", live(1), capOf(4)), c("c", live(1), capOf(8)), c("d", live(3), capOf(10))}, "", nil, "c,b,d,a"},
		{"priority beats free share", []Candidate{c("a"), c("b", prio(1), live(3))}, "", nil, "b,a"},
		{"least recently used, never used first", []Candidate{c("a", usedAt(-time.Second)), c("b", usedAt(-time.Hour)), c("c"), c("d", usedAt(-time.Minute))}, "", nil, "c,b,d,a"},
		{"free share beats recency", []Candidate{c("a", usedAt(-time.Hour), live(1)), c("b", usedAt(-time.Second))}, "", nil, "b,a"},
		{"stable for ties", []Candidate{c("a"), c("b"), c("c")}, "", nil, "a,b,c"},
		{"session first, over priority, share and recency", []Candidate{c("a", prio(9)), c("b", prio(-3), live(3), usedAt(0)), c("c")}, "b", nil, "b,a,c"},
		{"session on an ineligible account", []Candidate{c("a"), c("b", paused())}, "b", nil, "a"},
		{"unknown session account", []Candidate{c("a", prio(1)), c("b")}, "zzz", nil, "a,b"},
		{"ineligible dropped", []Candidate{
			c("ok"), c("paused", paused()), c("broken", broken()), c("cooling", cooling(time.Minute, true)),
			c("rejected", cooling(time.Hour, false)), c("full", live(4)), c("overfull", live(9)),
			c("excluded"), c("openai", provider("openai")),
		}, "", []string{"excluded"}, "ok"},
		{"expired cooldown is no cooldown", []Candidate{c("a", cooling(-time.Second, true)), c("b", cooling(0, true))}, "", nil, "a,b"},
		{"a free place promised to a request held longer", []Candidate{c("a", prio(5), live(3), ahead(1)), c("b", live(3), ahead(0))}, "", nil, "b"},
		{"overloaded a moment ago after the ones that answer, the session's and priority's too",
			[]Candidate{c("a", prio(9), overloadedAgo(time.Second)), c("b", overloadedAgo(5*time.Second)), c("c", live(3))}, "b", nil, "c,b,a"},
		{"an overload long ago is forgotten", []Candidate{c("a", prio(1), overloadedAgo(AnsweringWindow)), c("b")}, "", nil, "a,b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := RouteRequest{Model: "claude-sonnet-4-5", Exclude: map[uuid.UUID]bool{}}
			if tc.session != "" {
				req.SessionAccount = id(tc.session)
			}
			for _, x := range tc.exclude {
				req.Exclude[id(x)] = true
			}
			order, none := Route(tc.cands, req, epoch)
			if none != nil {
				t.Fatalf("no account: %v %q", none.Reason, none.Message)
			}
			if got := labelsOf(order); got != tc.want {
				t.Errorf("order %s, want %s", got, tc.want)
			}
		})
	}
}

func TestRouteNoAccount(t *testing.T) {
	t.Parallel()
	const (
		noneConfigured = weirv1.NoAccountReason_NO_ACCOUNT_REASON_NONE_CONFIGURED
		allDisabled    = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_DISABLED
		allCooling     = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING
		atCapacity     = weirv1.NoAccountReason_NO_ACCOUNT_REASON_AT_CAPACITY
		allTried       = weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_TRIED
	)
	for _, tc := range []struct {
		name    string
		cands   []Candidate
		exclude []string
		reason  weirv1.NoAccountReason
		message string
		retryAt time.Duration // -1: none
	}{
		{"empty pool", nil, nil, noneConfigured, "no account in the pool serves this model", -1},
		{"no provider serves the model", []Candidate{c("a", provider("openai"))}, nil, noneConfigured, "no account in the pool serves this model", -1},
		{"all paused", []Candidate{c("a", paused()), c("b", paused())}, nil, allDisabled, "all 2 accounts are paused or broken", -1},
		{"paused and broken", []Candidate{c("a", paused()), c("b", broken())}, nil, allDisabled, "all 2 accounts are paused or broken", -1},
		{"broken and cooling is disabled", []Candidate{c("a", broken(), cooling(time.Minute, false))}, nil, allDisabled, "all 1 accounts are paused or broken", -1},
		{"all cooling", []Candidate{c("a", cooling(5*time.Minute, true)), c("b", cooling(90*time.Second, true)), c("c", cooling(time.Hour, true))}, nil,
			allCooling, "all 3 accounts are cooling down; the first recovers at " + epoch.Add(90*time.Second).Format(time.RFC3339), 90 * time.Second},
		{"soonest transient, not the rejected credential", []Candidate{c("a", cooling(time.Minute, false)), c("b", cooling(10*time.Minute, true))}, nil,
			allCooling, "all 2 accounts are cooling down; the first recovers at " + epoch.Add(10*time.Minute).Format(time.RFC3339), 10 * time.Minute},
		{"only rejected credentials", []Candidate{c("a", cooling(time.Minute, false))}, nil,
			allCooling, "no account can serve until an operator acts: 0 paused or broken, 1 with a credential the upstream rejected", -1},
		{"cooling and disabled", []Candidate{c("a", paused()), c("b", cooling(time.Minute, true))}, nil,
			allCooling, "all 1 accounts are cooling down; the first recovers at " + epoch.Add(time.Minute).Format(time.RFC3339), time.Minute},
		{"at capacity", []Candidate{c("a", live(4)), c("b", capOf(1), live(1))}, nil, atCapacity, "all 2 eligible accounts are at their concurrency cap", time.Second},
		{"capacity before cooling", []Candidate{c("a", live(4)), c("b", cooling(time.Minute, true))}, nil, atCapacity, "all 1 eligible accounts are at their concurrency cap", time.Second},
		// A free place promised to a request held longer is not free.
		{"places promised to requests held longer", []Candidate{c("a", live(3), ahead(1)), c("b", live(2), ahead(3))}, nil, atCapacity,
			"all 2 eligible accounts are at their concurrency cap; 4 requests held longer wait for their places first", time.Second},
		{"capacity before tried", []Candidate{c("a", live(4)), c("b")}, []string{"b"}, atCapacity, "all 1 eligible accounts are at their concurrency cap", time.Second},
		{"all tried", []Candidate{c("a"), c("b")}, []string{"a", "b"}, allTried, "all 2 eligible accounts were tried for this request", -1},
		// The tried account may serve the next round: the cooling one's
		// deadline is not the pool's (a hold backs off instead of giving up
		// on a deadline past its budget).
		{"tried before cooling", []Candidate{c("a"), c("b", cooling(time.Minute, true))}, []string{"a"}, allTried,
			"all 1 eligible accounts were tried for this request", -1},
		{"tried before spent for hours", []Candidate{c("a"), c("b", cooling(5*time.Hour, true))}, []string{"a"}, allTried,
			"all 1 eligible accounts were tried for this request", -1},
		{"tried and cooling: a hold waits for the tried one", []Candidate{c("a", cooling(30*time.Second, true))}, []string{"a"}, allTried,
			"all 1 eligible accounts were tried for this request; the first recovers at " + epoch.Add(30*time.Second).Format(time.RFC3339), 30 * time.Second},
		{"tried before disabled", []Candidate{c("a"), c("b", paused())}, []string{"a"}, allTried, "all 1 eligible accounts were tried for this request", -1},
		{"excluded paused is disabled", []Candidate{c("a", paused())}, []string{"a"}, allDisabled, "all 1 accounts are paused or broken", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex := map[uuid.UUID]bool{}
			for _, x := range tc.exclude {
				ex[c(x).Account.ID] = true
			}
			order, none := Route(tc.cands, RouteRequest{Model: "m", Exclude: ex}, epoch)
			if none == nil {
				t.Fatalf("got %s, want no account", labelsOf(order))
			}
			if order != nil {
				t.Errorf("order %s with a NoAccount", labelsOf(order))
			}
			if none.Reason != tc.reason || none.Message != tc.message {
				t.Errorf("%v %q, want %v %q", none.Reason, none.Message, tc.reason, tc.message)
			}
			// Permanent: waiting cannot help, only an operator can.
			wantPermanent := map[string]bool{"empty pool": true, "no provider serves the model": true, "all paused": true,
				"paused and broken": true, "broken and cooling is disabled": true, "only rejected credentials": true,
				"excluded paused is disabled": true}[tc.name]
			if none.Permanent != wantPermanent {
				t.Errorf("permanent = %v, want %v", none.Permanent, wantPermanent)
			}
			switch {
			case tc.retryAt < 0 && none.RetryAt != nil:
				t.Errorf("retry_at %v, want none", none.RetryAt.AsTime())
			case tc.retryAt >= 0 && (none.RetryAt == nil || !none.RetryAt.AsTime().Equal(epoch.Add(tc.retryAt))):
				t.Errorf("retry_at %v, want now+%v", none.RetryAt, tc.retryAt)
			}
		})
	}
}

func TestRouteIsPure(t *testing.T) {
	t.Parallel()
	cands := []Candidate{c("a"), c("b", prio(3)), c("c", live(2))}
	before := labelsOf(cands)
	order, _ := Route(cands, RouteRequest{}, epoch)
	if labelsOf(cands) != before {
		t.Error("route reordered its input")
	}
	if labelsOf(order) != "b,a,c" {
		t.Errorf("order %s", labelsOf(order))
	}
}

func gated(d time.Duration) func(*Candidate) {
	return func(x *Candidate) {
		until := epoch.Add(d)
		x.Gate = &Gate{Family: "opus", Until: until, WrittenAt: epoch,
			Evidence: []byte(fmt.Sprintf(`{"class":"rate_limited","rung":"family_gate","claims":[{"claim":"7d_oi","reset":%d}]}`, until.Unix()))}
	}
}

// gatedNoReset is a family gate that ends on a Retry-After, not on the
// scoped claim's reset.
func gatedNoReset(d time.Duration) func(*Candidate) {
	return func(x *Candidate) {
		x.Gate = &Gate{Family: "opus", Until: epoch.Add(d), WrittenAt: epoch,
			Evidence: []byte(`{"class":"rate_limited","rung":"family_gate","claims":[{"claim":"7d_oi"}]}`)}
	}
}

// TestRouteFamilyGate: a gate (live for the request's family: the view
// only carries that family's) counts as cooling: it excludes the account,
// names the soonest recovery, and never makes waiting hopeless.
func TestRouteFamilyGate(t *testing.T) {
	t.Parallel()
	req := RouteRequest{Model: "claude-opus-4-1", Exclude: map[uuid.UUID]bool{}}
	order, none := Route([]Candidate{c("a", gated(time.Hour), prio(9)), c("b"), c("c", gated(-time.Second))}, req, epoch)
	if none != nil || labelsOf(order) != "b,c" {
		t.Fatalf("order %s (%v), want the gated account left out and the expired gate inert", labelsOf(order), none)
	}
	for _, tc := range []struct {
		name      string
		cands     []Candidate
		retryAt   time.Duration
		permanent bool
		message   string
	}{
		{"gated only", []Candidate{c("a", gated(14*time.Hour)), c("b", gated(2*time.Hour))}, 2 * time.Hour, false,
			"all 2 accounts are cooling down (2 gated for opus models only); the first recovers at " + epoch.Add(2*time.Hour).Format(time.RFC3339)},
		{"gated and cooling: the account is back when both have passed", []Candidate{c("a", gated(3*time.Hour), cooling(time.Hour, true))}, 3 * time.Hour, false,
			"all 1 accounts are cooling down; the first recovers at " + epoch.Add(3*time.Hour).Format(time.RFC3339)},
		{"cooling outlasts the gate", []Candidate{c("a", gated(time.Hour), cooling(5*time.Hour, true))}, 5 * time.Hour, false,
			"all 1 accounts are cooling down; the first recovers at " + epoch.Add(5*time.Hour).Format(time.RFC3339)},
		{"a gate beside a rejected credential", []Candidate{c("a", gated(time.Hour)), c("b", cooling(time.Minute, false))}, time.Hour, false,
			"all 2 accounts are cooling down (1 gated for opus models only); the first recovers at " + epoch.Add(time.Hour).Format(time.RFC3339)},
		{"a gated account with a rejected credential cannot recover", []Candidate{c("a", gated(time.Hour), cooling(time.Minute, false))}, -1, true,
			"no account can serve until an operator acts: 0 paused or broken, 1 with a credential the upstream rejected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			order, none := Route(tc.cands, req, epoch)
			if none == nil {
				t.Fatalf("got %s, want no account", labelsOf(order))
			}
			if none.Reason != weirv1.NoAccountReason_NO_ACCOUNT_REASON_ALL_COOLING || none.Permanent != tc.permanent || none.Message != tc.message {
				t.Errorf("%v permanent %v %q, want all cooling, permanent %v, %q", none.Reason, none.Permanent, none.Message, tc.permanent, tc.message)
			}
			switch {
			case tc.retryAt < 0 && none.RetryAt != nil:
				t.Errorf("retry_at %v, want none", none.RetryAt.AsTime())
			case tc.retryAt >= 0 && (none.RetryAt == nil || !none.RetryAt.AsTime().Equal(epoch.Add(tc.retryAt))):
				t.Errorf("retry_at %v, want now+%v", none.RetryAt, tc.retryAt)
			}
		})
	}
}

// TestWaitingFor: a request refused at capacity waits on exactly the
// accounts Route counted full, not on those out for another reason.
func TestWaitingFor(t *testing.T) {
	t.Parallel()
	cands := []Candidate{
		c("full", live(4)), c("promised", live(3), ahead(1)), c("free", live(1)), c("cooling", live(4), cooling(time.Minute, true)),
		c("paused", live(4), paused()), c("tried", live(4)), c("openai", live(4), provider("openai")),
	}
	req := RouteRequest{Model: "claude-sonnet-4-5", Exclude: map[uuid.UUID]bool{c("tried").Account.ID: true}}
	var got []string
	for _, id := range WaitingFor(cands, req, epoch) {
		for _, x := range cands {
			if x.Account.ID == id {
				got = append(got, x.Account.Label)
			}
		}
	}
	if strings.Join(got, ",") != "full,promised" {
		t.Errorf("waits for %v, want full,promised", got)
	}
}

func TestSurfaceServesModel(t *testing.T) {
	t.Parallel()
	msg, resp, chat := weirv1.Surface_SURFACE_MESSAGES, weirv1.Surface_SURFACE_RESPONSES, weirv1.Surface_SURFACE_CHAT_COMPLETIONS
	for _, c := range []struct {
		sf    weirv1.Surface
		model string
		want  bool
	}{
		{msg, "claude-sonnet-4-5", true},
		{msg, "gpt-5.4", false},
		{msg, "o3-mini", false},
		{resp, "gpt-5-codex", true},
		{resp, "claude-opus-4-1", false},
		{chat, "Claude-3-7-Sonnet", false},
		{chat, "gpt-4.1", true},
		{chat, "llama-3.3-70b", true}, // any OpenAI-compatible endpoint's
		{msg, "my-proxy-model", true},
	} {
		if got := SurfaceServesModel(c.sf, c.model); got != c.want {
			t.Errorf("SurfaceServesModel(%v, %q) = %v, want %v", c.sf, c.model, got, c.want)
		}
	}
}
