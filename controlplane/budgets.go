package controlplane

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/notify"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Bounds on a budget: a trillion tokens or a million dollars per period
// is more than any pool serves; anything beyond is a typo.
const (
	maxBudgetTokens = 1e12
	maxBudgetUSD    = 1e6
	maxTeamNameLen  = 64
)

// storedBudget is a budget limit as the budgets table holds it.
type storedBudget struct {
	unit, period string
	amount       int64 // tokens, or nano-dollars
}

// validBudgets checks an operator's budget limits: a known unit and
// period, an amount in range, no two for the same unit and period.
func validBudgets(field string, limits []*weirv1.BudgetLimit) ([]storedBudget, error) {
	out := make([]storedBudget, 0, len(limits))
	seen := map[[2]string]bool{}
	for i, l := range limits {
		f := fmt.Sprintf("%s[%d]", field, i)
		switch l.GetUnit() {
		case weirv1.BudgetUnit_BUDGET_UNIT_TOKENS, weirv1.BudgetUnit_BUDGET_UNIT_USD:
		default:
			return nil, invalidf("%s.unit: tokens or usd", f)
		}
		switch l.GetPeriod() {
		case weirv1.BudgetPeriod_BUDGET_PERIOD_DAY, weirv1.BudgetPeriod_BUDGET_PERIOD_WEEK,
			weirv1.BudgetPeriod_BUDGET_PERIOD_MONTH, weirv1.BudgetPeriod_BUDGET_PERIOD_SESSION:
		default:
			return nil, invalidf("%s.period: day, week, month or session", f)
		}
		unit, period := enumName(l.GetUnit()), enumName(l.GetPeriod())
		a := l.GetAmount()
		var amount int64
		switch {
		case math.IsNaN(a) || a <= 0:
			return nil, invalidf("%s.amount: must be more than zero", f)
		case unit == "tokens" && (a > maxBudgetTokens || a != math.Trunc(a)):
			return nil, invalidf("%s.amount: a whole number of tokens, at most %g", f, float64(maxBudgetTokens))
		case unit == "usd" && a > maxBudgetUSD:
			return nil, invalidf("%s.amount: at most $%g", f, float64(maxBudgetUSD))
		case unit == "tokens":
			amount = int64(a)
		default:
			amount = int64(math.Round(a * 1e9))
		}
		if seen[[2]string{unit, period}] {
			return nil, invalidf("%s: a second %s budget per %s", f, unit, period)
		}
		seen[[2]string{unit, period}] = true
		out = append(out, storedBudget{unit: unit, period: period, amount: amount})
	}
	return out, nil
}

// setBudgets replaces a key's or a team's budgets and keeps every key's
// budgeted flag true to them (a flag that changes tells every worker).
func setBudgets(ctx context.Context, q *db.Queries, key, team uuid.NullUUID, budgets []storedBudget, now time.Time) error {
	if err := q.DeleteBudgets(ctx, db.DeleteBudgetsParams{KeyID: key, TeamID: team}); err != nil {
		return err
	}
	for _, b := range budgets {
		if err := q.InsertBudget(ctx, db.InsertBudgetParams{KeyID: key, TeamID: team, Unit: b.unit, Period: b.period,
			Amount: b.amount, Now: now}); err != nil {
			return err
		}
	}
	return q.RefreshBudgeted(ctx)
}

// inUnit is an amount stored in unit's integers (tokens, nano-dollars) as
// the API states it (tokens, dollars).
func inUnit(unit string, n int64) float64 {
	if unit == "usd" {
		return float64(n) / 1e9
	}
	return float64(n)
}

// periodEnd is when the period that began at start (in tz) ends.
func periodEnd(start time.Time, period, tz string) time.Time {
	loc, err := time.LoadLocation(tz)
	if err != nil {
		loc = time.UTC
	}
	s := start.In(loc)
	switch period {
	case "day":
		return s.AddDate(0, 0, 1)
	case "week":
		return s.AddDate(0, 0, 7)
	case "month":
		return s.AddDate(0, 1, 0)
	}
	return time.Time{}
}

// budgetProto is a budget and its current period's spend as the API
// shows them.
func budgetProto(scope, name, unit, period string, amount, spentTokens, spentNano int64, start time.Time, tz string) *weirv1.Budget {
	b := &weirv1.Budget{Scope: scope, ScopeName: name,
		Limit: &weirv1.BudgetLimit{Unit: enumValue[weirv1.BudgetUnit](unit), Period: enumValue[weirv1.BudgetPeriod](period), Amount: inUnit(unit, amount)}}
	if period != "session" {
		spent := spentTokens
		if unit == "usd" {
			spent = spentNano
		}
		b.Spent = inUnit(unit, spent)
		b.ResetsAt = timestamppb.New(periodEnd(start, period, tz))
	}
	return b
}

// budgetsByScope reads every budget with its spend now, by the key or
// team it belongs to.
func (st store) budgetsByScope(ctx context.Context, now time.Time) (map[uuid.UUID][]db.ListBudgetsRow, error) {
	rows, err := st.q.ListBudgets(ctx, now)
	if err != nil {
		return nil, err
	}
	out := map[uuid.UUID][]db.ListBudgetsRow{}
	for _, r := range rows {
		id := r.KeyID.UUID
		if r.TeamID.Valid {
			id = r.TeamID.UUID
		}
		out[id] = append(out[id], r)
	}
	return out, nil
}

// checkBudgets is Acquire's question for a budgeted key: is the key, its
// team or the request's session over a budget, counting what the worker
// spent and has not reported yet? It returns the first budget over (a
// session cap before a period budget: it is the narrowest), or nil.
//
// The spend and which of the unreported requests are stored are read in
// one snapshot: a report stored between two separate reads would be in
// neither, not yet in the spend and already stored, and a session at its
// cap would take one more request.
func (l leaseService) checkBudgets(ctx context.Context, keyID uuid.UUID, session string, un *weirv1.UnreportedSpend) (*weirv1.BudgetBlock, error) {
	reqs := un.GetRequests()
	if len(reqs) > maxUnreportedRequests {
		return nil, invalidf("unreported.requests: at most %d", maxUnreportedRequests)
	}
	ids := make([]string, len(reqs))
	for i, r := range reqs {
		ids[i] = r.GetRequestId()
	}
	var rows []db.KeyBudgetsRow
	var got []string
	read := func(q *db.Queries) error {
		var err error
		if rows, err = q.KeyBudgets(ctx, db.KeyBudgetsParams{KeyID: keyID, Now: l.now(), SessionKey: session}); err != nil {
			return fmt.Errorf("read budgets: %w", err)
		}
		if len(rows) == 0 || len(ids) == 0 {
			return nil
		}
		got, err = q.StoredRequests(ctx, ids)
		return err
	}
	var err error
	if len(ids) == 0 {
		err = read(l.q) // one read needs no snapshot of its own
	} else {
		err = l.snapshot(ctx, read)
	}
	if err != nil || len(rows) == 0 {
		return nil, err
	}
	stored := make(map[string]bool, len(got))
	for _, id := range got {
		stored[id] = true
	}
	return overBudget(rows, session, unreportedSums(reqs, stored)), nil
}

// maxUnreportedRequests bounds UnreportedSpend.requests.
const maxUnreportedRequests = 1000

// unreported is a worker's spend not stored yet, by scope.
type unreported struct {
	key, team, session struct{ tokens, nano int64 }
}

// unreportedSums adds up the requests the control plane has not stored:
// one it stored (its report was taken before the worker heard so) is
// counted there already.
func unreportedSums(reqs []*weirv1.UnreportedRequest, stored map[string]bool) unreported {
	var u unreported
	for _, r := range reqs {
		if stored[r.GetRequestId()] || r.GetTokens() < 0 || r.GetNanoUsd() < 0 {
			continue
		}
		if r.GetKey() {
			u.key.tokens += r.GetTokens()
			u.key.nano += r.GetNanoUsd()
		}
		if r.GetTeam() {
			u.team.tokens += r.GetTokens()
			u.team.nano += r.GetNanoUsd()
		}
		if r.GetSession() {
			u.session.tokens += r.GetTokens()
			u.session.nano += r.GetNanoUsd()
		}
	}
	return u
}

// overBudget is checkBudgets' rule. Pure.
func overBudget(rows []db.KeyBudgetsRow, session string, un unreported) *weirv1.BudgetBlock {
	var over *weirv1.BudgetBlock
	for _, r := range rows {
		scope, name := "key", r.KeyName
		tokens, nano := r.SpentTokens+un.key.tokens, r.SpentNanoUsd+un.key.nano
		switch {
		case r.Period == "session":
			if session == "" {
				continue // a request in no session is under no session cap
			}
			scope, tokens, nano = "session", r.SpentTokens+un.session.tokens, r.SpentNanoUsd+un.session.nano
			if r.TeamID.Valid {
				name = "team " + r.TeamName
			}
		case r.TeamID.Valid:
			scope, name = "team", r.TeamName
			tokens, nano = r.SpentTokens+un.team.tokens, r.SpentNanoUsd+un.team.nano
		}
		spent := tokens
		if r.Unit == "usd" {
			spent = nano
		}
		if spent < r.Amount {
			continue
		}
		b := &weirv1.BudgetBlock{Scope: scope, ScopeName: name, Spent: inUnit(r.Unit, spent),
			Limit: &weirv1.BudgetLimit{Unit: enumValue[weirv1.BudgetUnit](r.Unit), Period: enumValue[weirv1.BudgetPeriod](r.Period), Amount: inUnit(r.Unit, r.Amount)}}
		if r.Period != "session" {
			b.ResetsAt = timestamppb.New(periodEnd(r.PeriodStart, r.Period, r.TimeZone))
		}
		if over == nil || scope == "session" {
			over = b
		}
	}
	return over
}

// budgetNoAccount is Acquire's answer for a request over a budget: final,
// nothing leased.
func budgetNoAccount(b *weirv1.BudgetBlock) *weirv1.AcquireResponse {
	return &weirv1.AcquireResponse{Result: &weirv1.AcquireResponse_NoAccount{NoAccount: &weirv1.NoAccount{
		Reason: weirv1.NoAccountReason_NO_ACCOUNT_REASON_BUDGET_EXHAUSTED, Permanent: true, Budget: b,
		Message: BudgetMessage(b)}}}
}

// BudgetMessage says which budget a request is over, and when it resets.
func BudgetMessage(b *weirv1.BudgetBlock) string {
	amount := func(v float64) string {
		if b.GetLimit().GetUnit() == weirv1.BudgetUnit_BUDGET_UNIT_USD {
			return fmt.Sprintf("$%.2f", v)
		}
		return fmt.Sprintf("%.0f tokens", v)
	}
	period := enumName(b.GetLimit().GetPeriod())
	var who string
	switch b.GetScope() {
	case "session":
		who = "this session is over the per-session cap"
		if b.GetScopeName() != "" {
			who += " of " + b.GetScopeName()
		}
		return fmt.Sprintf("weir: %s: %s (%s used); a new session starts afresh", who, amount(b.GetLimit().GetAmount()), amount(b.GetSpent()))
	case "team":
		who = fmt.Sprintf("team %q is over its budget", b.GetScopeName())
	default:
		who = fmt.Sprintf("key %q is over its budget", b.GetScopeName())
	}
	msg := fmt.Sprintf("weir: %s of %s per %s (%s used)", who, amount(b.GetLimit().GetAmount()), period, amount(b.GetSpent()))
	if r := b.GetResetsAt(); r != nil {
		msg += "; it resets at " + r.AsTime().UTC().Format(time.RFC3339)
	}
	return msg
}

// addSpend counts the batch's events that count (those stored as final
// for the first time, of budgeted keys) against the budgets of their keys
// and teams, in the transaction that stores them, and returns the
// thresholds they crossed (80% and 100%), each once per period.
func addSpend(ctx context.Context, q *db.Queries, rows []db.RouteEvent, counts []bool, now time.Time) ([]budgetCrossing, error) {
	var p db.AddBudgetSpendParams
	for i, r := range rows {
		if !counts[i] || !r.KeyID.Valid {
			continue
		}
		tokens := r.InputTokens + r.OutputTokens + r.CacheReadTokens + r.CacheCreationTokens
		if tokens == 0 && r.CostNanoUsd == 0 {
			continue
		}
		p.KeyIds = append(p.KeyIds, r.KeyID.UUID)
		p.SessionKeys = append(p.SessionKeys, r.SessionKey)
		p.StartedAts = append(p.StartedAts, r.StartedAt)
		p.Tokens = append(p.Tokens, tokens)
		p.NanosUsd = append(p.NanosUsd, r.CostNanoUsd)
	}
	if len(p.KeyIds) == 0 {
		return nil, nil
	}
	p.Now = now
	touched, err := q.AddBudgetSpend(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("add budget spend: %w", err)
	}
	var crossed []budgetCrossing
	for _, t := range touched {
		spent := t.Tokens
		if t.Unit == "usd" {
			spent = t.NanoUsd
		}
		level := thresholdLevel(spent, t.Amount)
		if level <= t.NotifiedPercent {
			continue
		}
		if err := q.SetBudgetNotified(ctx, db.SetBudgetNotifiedParams{Percent: level, BudgetID: t.BudgetID,
			PeriodStart: t.PeriodStart, SessionKey: t.SessionKey}); err != nil {
			return nil, err
		}
		crossed = append(crossed, budgetCrossing{row: t, percent: level, spent: spent})
	}
	return crossed, nil
}

// budgetThresholds are the shares of a budget whose crossing is announced.
var budgetThresholds = []int32{100, 80}

// thresholdLevel is the highest threshold spent has reached.
func thresholdLevel(spent, amount int64) int32 {
	for _, pct := range budgetThresholds {
		if spent*100 >= amount*int64(pct) {
			return pct
		}
	}
	return 0
}

// budgetCrossing is a budget that reached a threshold.
type budgetCrossing struct {
	row     db.AddBudgetSpendRow
	percent int32
	spent   int64
}

// errNoTeam is a team reference that names none.
var errNoTeam = errors.New("no such team")

// findTeam resolves a team id or name.
func (st store) findTeam(ctx context.Context, ref string) (db.Team, error) {
	if id, err := uuid.Parse(ref); err == nil {
		row, err := st.q.TeamByID(ctx, id)
		return row, teamErr(ref, err)
	}
	row, err := st.q.TeamByName(ctx, ref)
	return row, teamErr(ref, err)
}

func teamErr(ref string, err error) error {
	if errors.Is(storeErr(err), ErrNotFound) {
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("team %q: %w", ref, errNoTeam))
	}
	return storeErr(err)
}

// budgetCrossed announces a budget reaching a threshold, once per period
// and threshold: in the log, and to the notification targets
// (budget_threshold; session_cap for a session's cap), in the
// transaction that counted the spend.
func (l leaseService) budgetCrossed(ctx context.Context, tx pgx.Tx, c budgetCrossing) error {
	r := c.row
	scope, name := "key", r.KeyName
	if r.TeamName != "" {
		scope, name = "team", r.TeamName
	}
	amount := func(n int64) string {
		if r.Unit == "usd" {
			return fmt.Sprintf("$%.2f", inUnit(r.Unit, n))
		}
		return fmt.Sprintf("%d tokens", n)
	}
	l.log.WarnContext(ctx, "budget threshold reached", "scope", scope, "name", name, "percent", c.percent,
		"unit", r.Unit, "period", r.Period, "spent", inUnit(r.Unit, c.spent), "limit", inUnit(r.Unit, r.Amount))
	if l.notifier == nil {
		return nil
	}
	fields := map[string]any{"scope": scope, "name": name, "threshold_percent": c.percent, "unit": r.Unit,
		"period": r.Period, "spent": inUnit(r.Unit, c.spent), "limit": inUnit(r.Unit, r.Amount)}
	ev := notify.Event{Kind: notify.BudgetThreshold, Severity: notify.Warning,
		DedupKey: fmt.Sprintf("%s:%d%%:%s", r.BudgetID, c.percent, r.PeriodStart.UTC().Format(time.RFC3339)),
		Text:     fmt.Sprintf("%s %q spent %d%% of its %s budget per %s (%s of %s)", scope, name, c.percent, r.Unit, r.Period, amount(c.spent), amount(r.Amount)),
		Fields:   fields, DedupWindow: notify.MaxDedupWindow}
	if c.percent >= 100 {
		ev.Severity = notify.Critical
	}
	if r.Period == "session" {
		if c.percent < 100 {
			return nil // a session is announced when it reaches its cap
		}
		fields["session"] = r.SessionKey
		ev.Kind, ev.DedupKey = notify.SessionCap, fmt.Sprintf("%s:%s", r.BudgetID, r.SessionKey)
		ev.Text = fmt.Sprintf("a session of %s %q reached its cap of %s", scope, name, amount(r.Amount))
	}
	if len(ev.DedupKey) > 200 {
		ev.DedupKey = ev.DedupKey[:200]
	}
	_, err := l.notifier.Enqueue(ctx, tx, ev)
	return err
}
