package controlplane

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/randid"
)

// spend reports a finished request of key in session that used tokens
// (all input) on account, started at at.
func (e *env) spend(keyID, accountID, session string, tokens int64, at time.Time) string {
	e.t.Helper()
	id := "req-" + randid.Hex(6)
	e.report(&weirv1.RouteEvent{RequestId: id, KeyId: keyID, AccountId: accountID, Model: "claude-sonnet-4-5", Status: 200,
		Attempts: 1, StartedAt: timestamppb.New(at), SessionKey: session, Budgeted: true,
		AttemptRecords: []*weirv1.AttemptRecord{{AccountId: accountID, Model: "claude-sonnet-4-5",
			Usage: &weirv1.TokenUsage{InputTokens: tokens}}}})
	return id
}

// budgetAnswer asks Acquire as a worker does for a budgeted key, gives
// any lease back, and returns the budget block (nil when leased).
func (e *env) budgetAnswer(hash, session string, un *weirv1.UnreportedSpend) *weirv1.BudgetBlock {
	e.t.Helper()
	if un == nil {
		un = &weirv1.UnreportedSpend{}
	}
	resp := e.acquire(&weirv1.AcquireRequest{KeyHash: hash, Model: "claude-sonnet-4-5", SessionKey: session, Unreported: un})
	if l := resp.GetLease(); l != nil {
		if l.ReuseUntil != nil {
			e.t.Errorf("a budgeted key's lease is offered for reuse")
		}
		e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
		return nil
	}
	none := resp.GetNoAccount()
	if none.GetReason() != weirv1.NoAccountReason_NO_ACCOUNT_REASON_BUDGET_EXHAUSTED || none.GetBudget() == nil || !none.GetPermanent() {
		e.t.Fatalf("want a lease or a budget refusal, got %v", none)
	}
	return none.GetBudget()
}

func limit(unit weirv1.BudgetUnit, period weirv1.BudgetPeriod, amount float64) *weirv1.BudgetLimit {
	return &weirv1.BudgetLimit{Unit: unit, Period: period, Amount: amount}
}

// TestBudgets: a team's daily budget counts every key of the team, a
// session cap stops one session while another of the key goes on, the
// worker's unreported spend counts, a day begins in budget_time_zone, and
// each threshold is announced once.
func TestBudgets(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	// epoch is 05:06 UTC: 00:06 in New York, six minutes into its day.
	if _, err := e.updateSettings(&weirv1.Settings{BudgetTimeZone: "America/New_York"}, "budget_time_zone"); err != nil {
		t.Fatal(err)
	}
	team, err := e.admin.keys.CreateTeam(ctx, connect.NewRequest(&weirv1.CreateTeamRequest{Name: "platform",
		Budgets: []*weirv1.BudgetLimit{limit(weirv1.BudgetUnit_BUDGET_UNIT_TOKENS, weirv1.BudgetPeriod_BUDGET_PERIOD_DAY, 10000)}}))
	if err != nil {
		t.Fatal(err)
	}
	acctA, _ := e.createAccount(acct{maxConc: 10})
	a, hashA := e.createKey("alice")
	b, _ := e.createKey("bob")
	if _, err := e.admin.keys.UpdateKey(ctx, connect.NewRequest(&weirv1.UpdateKeyRequest{Id: "alice", Team: "platform",
		Budgets:    []*weirv1.BudgetLimit{limit(weirv1.BudgetUnit_BUDGET_UNIT_TOKENS, weirv1.BudgetPeriod_BUDGET_PERIOD_SESSION, 3000)},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"team", "budgets"}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.keys.UpdateKey(ctx, connect.NewRequest(&weirv1.UpdateKeyRequest{Id: "bob", Team: team.Msg.Team.Id,
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"team"}}})); err != nil {
		t.Fatal(err)
	}
	var budgeted int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM client_keys WHERE budgeted`).Scan(&budgeted); err != nil || budgeted != 2 {
		t.Fatalf("%d keys budgeted (%v), want alice and bob", budgeted, err)
	}
	vk, err := e.dp.leases.VerifyKey(ctx, connect.NewRequest(&weirv1.VerifyKeyRequest{KeyHash: hashA}))
	if err != nil || !vk.Msg.Budgeted || vk.Msg.TeamId != team.Msg.Team.Id {
		t.Fatalf("VerifyKey: %v, %v; want budgeted, in the team", vk, err)
	}

	if blk := e.budgetAnswer(hashA, "s1", nil); blk != nil {
		t.Fatalf("nothing spent yet: %v", blk)
	}
	e.spend(a.Id, acctA.Id, "s1", 2500, epoch)
	if blk := e.budgetAnswer(hashA, "s1", nil); blk != nil {
		t.Fatalf("2500 of the session's 3000: %v", blk)
	}
	// What the worker spent and has not reported counts.
	un := &weirv1.UnreportedSpend{Requests: []*weirv1.UnreportedRequest{{RequestId: "req-unreported", Tokens: 500, Key: true, Session: true}}}
	if blk := e.budgetAnswer(hashA, "s1", un); blk == nil || blk.Scope != "session" {
		t.Errorf("2500 stored + 500 unreported: want the session cap, got %v", blk)
	}
	// A request the worker has not heard was stored counts once.
	id := e.spend(a.Id, acctA.Id, "s1", 300, epoch.Add(time.Minute))
	un = &weirv1.UnreportedSpend{Requests: []*weirv1.UnreportedRequest{{RequestId: id, Tokens: 300, Key: true, Session: true}}}
	if blk := e.budgetAnswer(hashA, "s1", un); blk != nil {
		t.Errorf("2800 stored, the unreported 300 among them: %v", blk)
	}
	e.spend(a.Id, acctA.Id, "s1", 300, epoch.Add(time.Minute))
	blk := e.budgetAnswer(hashA, "s1", nil)
	if blk == nil || blk.Scope != "session" || blk.Spent != 3100 || blk.ResetsAt != nil {
		t.Fatalf("session s1 at 3100 of 3000: %v", blk)
	}
	if msg := BudgetMessage(blk); !strings.Contains(msg, "session") || !strings.Contains(msg, "3000 tokens") {
		t.Errorf("message %q", msg)
	}
	if blk := e.budgetAnswer(hashA, "s2", nil); blk != nil {
		t.Errorf("another session of the key goes on: %v", blk)
	}

	// Bob spends the team's day: alice is refused too, until New York's
	// next midnight.
	e.spend(b.Id, acctA.Id, "", 7000, epoch.Add(2*time.Minute))
	blk = e.budgetAnswer(hashA, "s2", nil)
	wantReset := time.Date(2030, time.March, 5, 5, 0, 0, 0, time.UTC) // midnight EST
	if blk == nil || blk.Scope != "team" || blk.ScopeName != "platform" || blk.Spent != 10100 || !blk.ResetsAt.AsTime().Equal(wantReset) {
		t.Fatalf("team over its day: %v; want resets at %v", blk, wantReset)
	}
	if msg := BudgetMessage(blk); !strings.Contains(msg, `team "platform"`) || !strings.Contains(msg, "2030-03-05T05:00:00Z") {
		t.Errorf("message %q", msg)
	}
	// A request that started the evening before counts to that day.
	e.clock.AdvanceTo(wantReset.Add(time.Minute))
	if blk := e.budgetAnswer(hashA, "s3", nil); blk != nil {
		t.Errorf("a new day in New York: %v", blk)
	}

	// Each threshold of the team's day was announced once: 80% and 100%.
	logs := e.logs.String()
	if n := strings.Count(logs, "budget threshold reached"); n != 3 { // the session's 80 and 100, the team's 100 (bob jumped past 80)
		t.Errorf("%d threshold lines, want 3:\n%s", n, logs)
	}
	// And to the notification targets: the team's 100% (one request took
	// it past 80% and 100% at once: the higher is announced), the
	// session's cap (a session's 80% is not news).
	for kind, want := range map[string]int{"budget_threshold": 1, "session_cap": 1} {
		if n := e.count(`SELECT count(*) FROM notify_events WHERE kind = '` + kind + `'`); n != want {
			t.Errorf("%d %s events, want %d", n, kind, want)
		}
	}
	var text string
	if err := e.pool.QueryRow(ctx, `SELECT text FROM notify_events WHERE kind = 'budget_threshold' ORDER BY id DESC LIMIT 1`).Scan(&text); err != nil ||
		!strings.Contains(text, `team "platform" spent 100%`) {
		t.Errorf("the 100%% event: %q, %v", text, err)
	}
	keys, err := e.admin.keys.ListKeys(ctx, connect.NewRequest(&weirv1.ListKeysRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys.Msg.Keys {
		if k.Name == "alice" && (k.Team != "platform" || len(k.Budgets) != 1) {
			t.Errorf("alice as listed: %v", k)
		}
	}
	teams, _ := e.admin.keys.ListTeams(ctx, connect.NewRequest(&weirv1.ListTeamsRequest{}))
	if tm := teams.Msg.Teams; len(tm) != 1 || tm[0].Keys != 2 || len(tm[0].Budgets) != 1 || tm[0].Budgets[0].Spent != 0 {
		t.Errorf("teams the next day: %v", tm)
	}
	// Removing the team's budget leaves alice budgeted (her session cap),
	// bob not.
	if _, err := e.admin.keys.UpdateTeam(ctx, connect.NewRequest(&weirv1.UpdateTeamRequest{Id: "platform",
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"budgets"}}})); err != nil {
		t.Fatal(err)
	}
	rows, err := e.q.ListKeys(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if want := r.Name == "alice"; r.Budgeted != want {
			t.Errorf("%s budgeted %v, want %v", r.Name, r.Budgeted, want)
		}
	}
}

// TestBudgetRefusals: budgets an operator cannot mean are refused, naming
// the field.
func TestBudgetRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tok, usd := weirv1.BudgetUnit_BUDGET_UNIT_TOKENS, weirv1.BudgetUnit_BUDGET_UNIT_USD
	day := weirv1.BudgetPeriod_BUDGET_PERIOD_DAY
	for i, bs := range [][]*weirv1.BudgetLimit{
		{limit(tok, day, 0)},
		{limit(tok, day, 1.5)},
		{limit(usd, day, 2e6)},
		{limit(weirv1.BudgetUnit_BUDGET_UNIT_UNSPECIFIED, day, 5)},
		{limit(usd, weirv1.BudgetPeriod_BUDGET_PERIOD_UNSPECIFIED, 5)},
		{limit(usd, day, 5), limit(usd, day, 6)},
	} {
		_, err := e.admin.keys.CreateKey(t.Context(), connect.NewRequest(&weirv1.CreateKeyRequest{Name: fmt.Sprintf("k%d", i), Budgets: bs}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "budgets[") {
			t.Errorf("%v: %v, want invalid argument naming budgets[i]", bs, err)
		}
	}
	_, err := e.admin.keys.CreateKey(t.Context(), connect.NewRequest(&weirv1.CreateKeyRequest{Name: "k", Team: "nobody"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("a key in a team that is not: %v", err)
	}
}

// TestOverBudgetRule: the narrowest budget over is the answer; a request
// in no session is under no session cap; unreported spend counts in its
// own scope.
func TestOverBudgetRule(t *testing.T) {
	t.Parallel()
	row := func(period, unit string, amount, tokens, nano int64, team bool) db.KeyBudgetsRow {
		r := db.KeyBudgetsRow{Period: period, Unit: unit, Amount: amount, SpentTokens: tokens, SpentNanoUsd: nano,
			KeyName: "k", TeamName: "t", TimeZone: "UTC", PeriodStart: epoch.Truncate(24 * time.Hour)}
		r.TeamID.Valid = team
		return r
	}
	for _, c := range []struct {
		name    string
		rows    []db.KeyBudgetsRow
		session string
		un      []*weirv1.UnreportedRequest
		scope   string
	}{
		{"under", []db.KeyBudgetsRow{row("day", "tokens", 100, 99, 0, false)}, "", nil, ""},
		{"at the limit", []db.KeyBudgetsRow{row("day", "tokens", 100, 100, 0, false)}, "", nil, "key"},
		{"usd counts dollars", []db.KeyBudgetsRow{row("day", "usd", 5e9, 1e9, 5e9, false)}, "", nil, "key"},
		{"team", []db.KeyBudgetsRow{row("week", "tokens", 100, 50, 0, true)}, "", []*weirv1.UnreportedRequest{{Tokens: 50, Team: true}}, "team"},
		{"key's unreported is not the team's", []db.KeyBudgetsRow{row("week", "tokens", 100, 50, 0, true)}, "", []*weirv1.UnreportedRequest{{Tokens: 50, Key: true}}, ""},
		{"no session, no cap", []db.KeyBudgetsRow{row("session", "tokens", 10, 0, 0, false)}, "", []*weirv1.UnreportedRequest{{Tokens: 50, Session: true}}, ""},
		{"session first", []db.KeyBudgetsRow{row("day", "tokens", 10, 20, 0, false), row("session", "tokens", 10, 10, 0, false)}, "s", nil, "session"},
	} {
		got := overBudget(c.rows, c.session, unreportedSums(c.un, nil))
		if got.GetScope() != c.scope {
			t.Errorf("%s: %v, want scope %q", c.name, got, c.scope)
		}
	}
	for spent, want := range map[int64]int32{0: 0, 79: 0, 80: 80, 99: 80, 100: 100, 250: 100} {
		if got := thresholdLevel(spent, 100); got != want {
			t.Errorf("thresholdLevel(%d, 100) = %d, want %d", spent, got, want)
		}
	}
}

// TestBudgetCountsARequestStoredMeanwhile: a worker's unreported request
// whose report the control plane stores while an Acquire checks the
// budget is counted once, stored or unreported, never by neither: the
// budget's spend and which requests are stored are read in one snapshot.
// Each round is a fresh session whose cap is one request, checked while
// that request's report is stored.
func TestBudgetCountsARequestStoredMeanwhile(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	acctA, _ := e.createAccount(acct{maxConc: 1000})
	k, hash := e.createKey("runner")
	const per = 100
	if _, err := e.admin.keys.UpdateKey(ctx, connect.NewRequest(&weirv1.UpdateKeyRequest{Id: "runner",
		Budgets:    []*weirv1.BudgetLimit{limit(weirv1.BudgetUnit_BUDGET_UNIT_TOKENS, weirv1.BudgetPeriod_BUDGET_PERIOD_SESSION, per)},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"budgets"}}})); err != nil {
		t.Fatal(err)
	}
	missed := 0
	const rounds = 150
	for i := range rounds {
		session, id := fmt.Sprintf("s%d", i), fmt.Sprintf("req-meanwhile-%d", i)
		ev := &weirv1.RouteEvent{RequestId: id, KeyId: k.Id, AccountId: acctA.Id, Model: "claude-sonnet-4-5", Status: 200,
			Attempts: 1, StartedAt: timestamppb.New(e.clock.Now()), SessionKey: session, Budgeted: true,
			AttemptRecords: []*weirv1.AttemptRecord{{AccountId: acctA.Id, Model: "claude-sonnet-4-5",
				Usage: &weirv1.TokenUsage{InputTokens: per}}}}
		un := &weirv1.UnreportedSpend{Requests: []*weirv1.UnreportedRequest{{RequestId: id, Tokens: per, Key: true, Session: true}}}
		reported := make(chan error, 1)
		go func() {
			_, err := reportOne(ctx, e.dp.leases, ev)
			reported <- err
		}()
		resp := e.acquire(&weirv1.AcquireRequest{KeyHash: hash, Model: "claude-sonnet-4-5", SessionKey: session, Unreported: un})
		if err := <-reported; err != nil {
			t.Fatalf("ReportRoutes: %v", err)
		}
		if l := resp.GetLease(); l != nil {
			missed++
			e.release(l.Id, &weirv1.Outcome{Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200})
		}
	}
	if missed > 0 {
		t.Errorf("%d of %d sessions at their cap were leased: the request stored meanwhile was counted nowhere", missed, rounds)
	}
}
