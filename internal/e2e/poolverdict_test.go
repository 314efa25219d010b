package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/sim"
)

// The pool's verdict, checked against a model. Each case generates a pool
// of one to nine accounts, each in its own trouble (overloaded until a
// time, rate-limited with a retry-after, out of its 5-hour window until a
// reset, gated for the request's model family until a reset, revoked,
// paused, unreachable, or fine), and sends one turn through the real
// control plane, worker and simulator on the virtual clock, in the
// usage_limit mode. The oracle knows when each account can serve and
// whether weir can know it:
//
//   - some account can serve within the hold budget: the turn is served,
//     within 3 s of the first moment one could;
//   - none can, and every account's end is known (a reset past the budget,
//     a rejected credential, a pause): the answer comes at once, and when
//     every account that could come back is out of quota it is the final
//     usage limit with the first reset;
//   - none can, and some account's end is unknown to weir (a storm that
//     outlasts the budget): the turn is held to the budget's end; an
//     unreachable pool is answered with its cause when its own shorter
//     hold ends.

type verdictKind int

const (
	kindFine verdictKind = iota
	kindStorm
	kindRateLimited
	kindSpent
	kindGated
	kindRevoked
	kindPaused
	kindUnreachable
	numVerdictKinds
)

func (k verdictKind) String() string {
	return [...]string{"fine", "storm", "rate-limited", "spent", "gated", "revoked", "paused", "unreachable"}[k]
}

// verdictAccount is one generated account: its trouble and how long it
// lasts from the turn's start (for a rate limit, the retry-after).
type verdictAccount struct {
	kind verdictKind
	d    time.Duration
}

func (a verdictAccount) String() string {
	switch a.kind {
	case kindStorm, kindRateLimited, kindSpent, kindGated:
		return fmt.Sprintf("%v %v", a.kind, a.d)
	}
	return a.kind.String()
}

const verdictBudget = 2 * time.Minute

// usageLimitAfter is how far away the first reset must be for the final
// usage limit: a pool back sooner is answered with a retryable 429.
const usageLimitAfter = 5 * time.Minute

// genPool draws a pool: mostly troubled accounts, a fine one rarely, so
// that most pools must be held or answered.
func genPool(r *rand.Rand) []verdictAccount {
	n := 1 + r.IntN(9)
	pool := make([]verdictAccount, n)
	for i := range pool {
		k := verdictKind(r.IntN(int(numVerdictKinds)))
		if k == kindFine && r.IntN(3) > 0 {
			k = kindStorm
		}
		var d time.Duration
		switch k {
		case kindStorm:
			// Some storms end within the budget, some outlast it.
			d = time.Duration(5+r.IntN(170)) * time.Second
		case kindRateLimited:
			d = time.Duration(1+r.IntN(60)) * time.Second
		case kindSpent, kindGated:
			// Resets within the budget, just after it, or hours away.
			d = []time.Duration{time.Duration(10+r.IntN(100)) * time.Second, verdictBudget + time.Minute, 3 * time.Hour}[r.IntN(3)]
			if d == 3*time.Hour {
				d += time.Duration(r.IntN(3600)) * time.Second
			}
		}
		pool[i] = verdictAccount{kind: k, d: d}
	}
	return pool
}

func TestPoolVerdictProperty(t *testing.T) {
	t.Parallel()
	cases := 40
	if testing.Short() {
		cases = 12
	}
	for seed := range cases {
		pool := genPool(rand.New(rand.NewPCG(uint64(seed), 22)))
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			checkPoolVerdict(t, pool)
		})
	}
}

// checkPoolVerdict runs one turn on pool and checks it against the oracle.
func checkPoolVerdict(t *testing.T, pool []verdictAccount) {
	v := virtualClock()
	start := v.Now()
	var accounts []account
	for i, a := range pool {
		acc := account{label: fmt.Sprintf("a%d", i), maxConc: 4}
		until := start.Add(a.d)
		switch a.kind {
		case kindStorm:
			acc.faults = []sim.Fault{{Kind: sim.FaultOverloaded, Until: until}}
		case kindRateLimited:
			acc.faults = []sim.Fault{{Kind: sim.FaultRateLimit, RetryAfter: int(a.d / time.Second)}}
		case kindSpent:
			acc.oauth = true
			acc.windows = &sim.Windows{FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetsAt: until}}
		case kindGated:
			acc.oauth = true
			acc.windows = &sim.Windows{Families: map[string]sim.FamilyWindow{"sonnet": {Window: sim.Window{Limit: 1000, Used: 1000, ResetsAt: until}}}}
		case kindRevoked:
			acc.faults = []sim.Fault{{Kind: sim.FaultRevoked, Times: -1}}
		case kindUnreachable:
			acc.baseURL = unreachableURL
		}
		accounts = append(accounts, acc)
	}
	e := setup(t, options{virtual: v, hold: verdictBudget, accounts: accounts})
	for i, a := range pool {
		if a.kind == kindPaused {
			if _, err := e.accounts.PauseAccount(t.Context(), connect.NewRequest(&weirv1.PauseAccountRequest{Id: e.ids[fmt.Sprintf("a%d", i)]})); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)

	r := e.post(true)
	took := v.Now().Sub(start)
	atts := e.sim.Attempts()
	t.Logf("pool %v: %d after %v; attempts %v", pool, r.status, took, e.attempts())

	// The oracle: when each account can first serve, and whether weir can
	// know that before it does.
	var (
		first        = time.Duration(-1) // the earliest any account can serve; -1: none
		unknownLater bool                // an account whose end weir cannot know
		unreachable  bool
		quota        []time.Duration // resets of the accounts out of quota
		comeBack     int             // accounts that could come back without an operator
	)
	can := func(d time.Duration) {
		if first < 0 || d < first {
			first = d
		}
	}
	for i, a := range pool {
		switch a.kind {
		case kindFine:
			can(0)
			comeBack++
		case kindStorm:
			can(a.d)
			comeBack++
			if a.d > verdictBudget {
				unknownLater = true
			}
		case kindRateLimited:
			// Weir learns the retry-after at its first attempt there.
			label := fmt.Sprintf("a%d", i)
			at := slices.IndexFunc(atts, func(x sim.Attempt) bool { return x.Account == label })
			if at < 0 {
				can(0) // never asked: it could serve all along
			} else {
				can(atts[at].Time.Sub(start) + a.d)
			}
			comeBack++
		case kindSpent, kindGated:
			can(a.d)
			comeBack++
			quota = append(quota, a.d)
		case kindUnreachable:
			unreachable = true
			comeBack++
		}
	}
	servable := first >= 0 && first <= verdictBudget-3*time.Second
	switch {
	case servable:
		if r.status != http.StatusOK {
			t.Fatalf("status %d, want 200: an account can serve %v in, within the %v budget: %s", r.status, first, verdictBudget, r.body)
		}
		if late := took - first; late > 3*time.Second {
			t.Errorf("served %v in, %v after an account could serve, want within 3s", took, late)
		}
		return
	case first >= 0 && first <= verdictBudget+3*time.Second:
		// Too close to the budget's end to say which way it goes.
		return
	}
	if r.status == http.StatusOK {
		t.Fatalf("served, but the oracle says no account could within the budget")
	}
	onlyQuota := len(quota) > 0 && len(quota) == comeBack
	switch {
	case unknownLater:
		if took < verdictBudget-time.Second {
			t.Errorf("answered %d after %v, want held to the budget (%v): a storm's end is unknown", r.status, took, verdictBudget)
		}
	case unreachable && !onlyQuota:
		if took > verdictBudget || !strings.Contains(string(r.body), "unreachable") {
			t.Errorf("answered %d after %v: %s; want the unreachable pool's cause within the budget", r.status, took, r.body)
		}
	default:
		if took > 2*time.Second {
			t.Errorf("answered %d after %v, want at once: no account can serve within the budget and weir knows it", r.status, took)
		}
	}
	if onlyQuota && !unknownLater && !unreachable && slices.Min(quota) <= usageLimitAfter {
		// Out of quota until soon: a retryable 429.
		if r.status != http.StatusTooManyRequests || r.header.Get("X-Should-Retry") == "false" {
			t.Errorf("status %d X-Should-Retry %q: %s; want a retryable 429: the first reset is %v away",
				r.status, r.header.Get("X-Should-Retry"), r.body, slices.Min(quota))
		}
	} else if onlyQuota && !unknownLater && !unreachable {
		// Every account that could come back is out of quota past the
		// budget, the first reset more than usageLimitAfter away: the
		// final usage limit, with that reset.
		var body struct {
			Error struct {
				Type     string `json:"type"`
				ResetsAt int64  `json:"resets_at"`
			} `json:"error"`
		}
		if r.status != http.StatusTooManyRequests || r.header.Get("X-Should-Retry") != "false" || json.Unmarshal(r.body, &body) != nil {
			t.Fatalf("status %d X-Should-Retry %q: %s; want the final usage limit", r.status, r.header.Get("X-Should-Retry"), r.body)
		}
		want := start.Add(slices.Min(quota)).Unix()
		if body.Error.ResetsAt < want-1 || body.Error.ResetsAt > want+1 {
			t.Errorf("resets_at %d, want the first reset %d", body.Error.ResetsAt, want)
		}
	}
	if comeBack == 0 && r.status != http.StatusServiceUnavailable {
		t.Errorf("status %d, want 503: only an operator can bring this pool back", r.status)
	}
}
