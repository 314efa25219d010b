package e2e

import (
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

// The 429 decision ladder end to end: the simulator's live usage windows
// answer with the real unified rejection headers, on the virtual clock
// shared by the simulator, the control plane and the worker.

const opusModel = "claude-opus-4-1-20250805"

// postModel sends a Messages request for m instead of the default model.
func (e *env) postModel(m string) response {
	e.t.Helper()
	body := strings.Replace(messagesBody(false), `"model":"`+model+`"`, `"model":"`+m+`"`, 1)
	return e.do(http.MethodPost, "/v1/messages", body, nil)
}

// attemptsSince is the simulator's attempt log from index n on.
func (e *env) attemptsSince(n int) []string { return e.attempts()[n:] }

// TestLadderOpusGateKeepsSonnet: an OAuth account whose opus weekly window
// is full while its five-hour and weekly windows have room. Opus requests
// go to another account (and, with none left, fail at once, since the gate
// ends after the hold budget) while sonnet requests still use it; no
// account-wide cooldown is written, and the window's reset restores opus.
func TestLadderOpusGateKeepsSonnet(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	const resetIn = 51811 * time.Second
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "max", oauth: true, priority: 10, windows: &sim.Windows{
			FiveHour: &sim.Window{Limit: 1_000_000, Used: 210_000},
			SevenDay: &sim.Window{Limit: 10_000_000, Used: 9_400_000},
			Families: map[string]sim.FamilyWindow{sim.FamilyOpus: {
				Window: sim.Window{Limit: 500_000, Used: 500_000, ResetIn: sim.Duration(resetIn)},
				Claim:  sim.ClaimSevenDayOverageIncluded, Header: "7d_oi",
			}},
		}},
		{label: "backup", oauth: true},
	}})
	start := v.Now()
	reset := start.Add(resetIn)

	r := e.postModel(opusModel)
	if r.status != http.StatusOK {
		t.Fatalf("opus: status %d, want 200 from the backup: %s", r.status, r.body)
	}
	if got := e.attempts(); !slices.Equal(got, []string{"max:usage_limit:429", "backup:ok:200"}) {
		t.Fatalf("attempts %v, want max's 429 then backup", got)
	}
	if v.Now() != start {
		t.Errorf("the worker waited %v: another account could serve", v.Now().Sub(start))
	}
	max := e.account("max")
	if max.State != weirv1.AccountState_ACCOUNT_STATE_ACTIVE || max.Cooldown != nil {
		t.Fatalf("max: state %v cooldown %v, want active: a family limit is no account-wide cooldown", max.State, max.Cooldown)
	}
	if len(max.FamilyGates) != 1 || max.FamilyGates[0].Family != "opus" || !max.FamilyGates[0].Until.AsTime().Equal(reset) ||
		!strings.Contains(max.FamilyGates[0].Evidence, "7d_oi rejected") {
		t.Fatalf("max gates %v, want opus until the window's reset %v", max.FamilyGates, reset)
	}

	// Sonnet still goes to max, opus straight to the backup.
	n := len(e.attempts())
	if r := e.post(false); r.status != http.StatusOK {
		t.Fatalf("sonnet: status %d: %s", r.status, r.body)
	}
	if r := e.postModel(opusModel); r.status != http.StatusOK {
		t.Fatalf("opus again: status %d: %s", r.status, r.body)
	}
	if got := e.attemptsSince(n); !slices.Equal(got, []string{"max:ok:200", "backup:ok:200"}) {
		t.Fatalf("attempts %v, want sonnet on max and opus on backup without touching max", got)
	}

	// With the backup paused, opus cannot be served before the gate ends,
	// long after the 20-minute hold: weir says so at once, as the quota
	// error it is (never "overloaded"), with the reset as Retry-After and
	// no retry before it. Sonnet is unaffected.
	e.change(func() {
		if _, err := e.accounts.PauseAccount(t.Context(), connect.NewRequest(&weirv1.PauseAccountRequest{Id: "backup"})); err != nil {
			t.Fatal(err)
		}
	})
	n = len(e.attempts())
	r = e.postModel(opusModel)
	if got := weirError(t, r, 429, "rate_limit_error"); !strings.Contains(got.Error.Message, "model family weekly window spent (opus)") ||
		r.header.Get("X-Should-Retry") != "false" {
		t.Errorf("X-Should-Retry %q, message %q, want false and the gate's evidence", r.header.Get("X-Should-Retry"), got.Error.Message)
	}
	if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || time.Duration(ra)*time.Second != reset.Sub(v.Now()) {
		t.Errorf("Retry-After %q, want the gate's end in %v", r.header.Get("Retry-After"), reset.Sub(v.Now()))
	}
	if v.Now() != start {
		t.Errorf("the worker held %v for a gate that ends after the budget", v.Now().Sub(start))
	}
	if r := e.post(false); r.status != http.StatusOK {
		t.Fatalf("sonnet with the backup paused: status %d: %s", r.status, r.body)
	}
	if got := e.attemptsSince(n); !slices.Equal(got, []string{"max:ok:200"}) {
		t.Fatalf("attempts %v, want only sonnet's", got)
	}

	// The weekly reset empties the window and ends the gate.
	v.AdvanceTo(reset)
	if r := e.postModel(opusModel); r.status != http.StatusOK {
		t.Fatalf("opus after the reset: status %d: %s", r.status, r.body)
	}
	if got := e.attempts(); got[len(got)-1] != "max:ok:200" {
		t.Errorf("attempts %v, want opus back on max", got)
	}
	if gates := e.account("max").FamilyGates; len(gates) != 0 {
		t.Errorf("gates after the reset: %v", gates)
	}
}

// TestLadderWeeklyWindowCoolsAccount: an OAuth account whose weekly window
// is full is cooled until the window's reset with QUOTA_EXHAUSTED; another
// account serves, and no client sees the 429.
func TestLadderWeeklyWindowCoolsAccount(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	const resetIn = 30 * time.Hour
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "max", oauth: true, priority: 10, windows: &sim.Windows{
			FiveHour: &sim.Window{Limit: 1_000_000, Used: 100_000},
			SevenDay: &sim.Window{Limit: 10_000_000, Used: 10_000_000, ResetIn: sim.Duration(resetIn)},
		}},
		{label: "backup"},
	}})
	start := v.Now()
	reset := start.Add(resetIn)

	for i := range 3 {
		r := e.postModel([]string{opusModel, model, opusModel}[i])
		if r.status != http.StatusOK {
			t.Fatalf("request %d: status %d, want 200 from the backup: %s", i, r.status, r.body)
		}
	}
	if got := e.attempts(); !slices.Equal(got, []string{"max:usage_limit:429", "backup:ok:200", "backup:ok:200", "backup:ok:200"}) {
		t.Fatalf("attempts %v, want max tried once, then only the backup", got)
	}
	max := e.account("max")
	cd := max.GetCooldown()
	if max.State != weirv1.AccountState_ACCOUNT_STATE_COOLING || cd.GetReason() != weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED ||
		!cd.Transient || !cd.Until.AsTime().Equal(reset) || !strings.Contains(cd.Evidence, "7d rejected") {
		t.Fatalf("max: state %v cooldown %v, want quota_exhausted until the weekly reset %v", max.State, cd, reset)
	}
	if len(max.FamilyGates) != 0 {
		t.Errorf("gates %v: an account-wide limit is no family gate", max.FamilyGates)
	}

	v.AdvanceTo(reset)
	if r := e.post(false); r.status != http.StatusOK {
		t.Fatalf("after the reset: status %d: %s", r.status, r.body)
	}
	if got := e.attempts(); got[len(got)-1] != "max:ok:200" {
		t.Errorf("attempts %v, want max back after its reset", got)
	}
}

// TestLadderBurstRetriesInPlace: an OAuth account's burst 429 (no unified
// rejection) is retried on the same account after 2 s, twice at most,
// without a cooldown; the third burst fails over.
func TestLadderBurstRetriesInPlace(t *testing.T) {
	t.Parallel()
	v := virtualClock()
	e := setup(t, options{virtual: v, hold: 20 * time.Minute, accounts: []account{
		{label: "max", oauth: true, priority: 10, faults: []sim.Fault{{Kind: sim.FaultRateLimit, RetryAfter: 1, Times: 3}}},
		{label: "backup", oauth: true},
	}})
	r := e.post(false)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	atts := sameBodyAndModel(t, e)
	if got := e.attempts(); !slices.Equal(got, []string{"max:rate_limit:429", "max:rate_limit:429", "max:rate_limit:429", "backup:ok:200"}) {
		t.Fatalf("attempts %v, want two in-place retries then the backup", got)
	}
	for i := 1; i < 3; i++ {
		if gap := atts[i].Time.Sub(atts[i-1].Time); gap != 2*time.Second {
			t.Errorf("retry %d after %v, want 2s", i, gap)
		}
	}
	if gap := atts[3].Time.Sub(atts[2].Time); gap != 0 {
		t.Errorf("failover after %v, want at once", gap)
	}
	ev := heldFor(t, e, r)
	var bursts int
	for _, a := range ev.AttemptRecords {
		if strings.Contains(a.HoldReason, "burst") {
			bursts++
		}
	}
	if bursts != 2 || ev.HoldCount != 2 {
		t.Errorf("%d burst holds of %d, want 2", bursts, ev.HoldCount)
	}
	// Only the third burst, past the in-place retries, cooled the account.
	if cd := e.account("max").GetCooldown(); cd.GetReason() != weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED ||
		!cd.Until.AsTime().Equal(atts[2].Time.Add(time.Second)) {
		t.Errorf("max cooldown %v, want rate_limited for the third burst's retry-after", cd)
	}
}
