package dashboard

import (
	"cmp"
	"net/http"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// budgetView is one budget as the Budgets page shows it.
type budgetView struct {
	// Period is day, week or month; Session marks a cap on each session
	// (no spend of its own to show).
	Period  string
	Session bool
	// Spent and Limit in the budget's unit: "$1.20", "2,500 tokens".
	Spent, Limit string
	Frac         float64
	ResetsAt     *time.Time
}

type teamView struct {
	Name    string
	Keys    int32
	Budgets []budgetView
}

type keyBudgetView struct {
	Name, Team string
	Budgets    []budgetView
	// TeamBudgeted: the key's team has budgets of its own.
	TeamBudgeted bool
}

type budgetsData struct {
	Teams []teamView
	Keys  []keyBudgetView
	Now   time.Time
}

// budgetsPage lists every team and live key with its budgets: spent
// against the limit, and when the period resets.
func (h *Handler) budgetsPage(w http.ResponseWriter, r *http.Request, s session) {
	ctx := r.Context()
	teams, err := h.cfg.Keys.ListTeams(ctx, connect.NewRequest(&weirv1.ListTeamsRequest{}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	keys, err := h.cfg.Keys.ListKeys(ctx, connect.NewRequest(&weirv1.ListKeysRequest{}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	d := budgetsData{Now: h.cfg.Now()}
	budgeted := map[string]bool{}
	for _, t := range teams.Msg.Teams {
		d.Teams = append(d.Teams, teamView{Name: t.Name, Keys: t.Keys, Budgets: budgetViews(t.Budgets)})
		budgeted[t.Name] = len(t.Budgets) > 0
	}
	for _, k := range keys.Msg.Keys {
		d.Keys = append(d.Keys, keyBudgetView{Name: k.Name, Team: k.Team, Budgets: budgetViews(k.Budgets), TeamBudgeted: budgeted[k.Team]})
	}
	slices.SortFunc(d.Teams, func(a, b teamView) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(d.Keys, func(a, b keyBudgetView) int { return cmp.Compare(a.Name, b.Name) })
	h.render(w, r, http.StatusOK, "budgets", view{Title: "Budgets", Nav: "budgets", CSRF: s.csrf, Role: s.role, Data: d})
}

func budgetViews(bs []*weirv1.Budget) []budgetView {
	out := make([]budgetView, 0, len(bs))
	for _, b := range bs {
		l := b.GetLimit()
		amount := func(v float64) string {
			if l.GetUnit() == weirv1.BudgetUnit_BUDGET_UNIT_USD {
				return dollars(v)
			}
			return groupDigits(int64(v)) + " tokens"
		}
		v := budgetView{Period: strings.ToLower(strings.TrimPrefix(l.GetPeriod().String(), "BUDGET_PERIOD_")),
			Limit: amount(l.GetAmount()), ResetsAt: tsPtr(b.ResetsAt)}
		if l.GetPeriod() == weirv1.BudgetPeriod_BUDGET_PERIOD_SESSION {
			v.Session = true
		} else {
			v.Spent = amount(b.GetSpent())
			if l.GetAmount() > 0 {
				v.Frac = b.GetSpent() / l.GetAmount()
			}
		}
		out = append(out, v)
	}
	return out
}
