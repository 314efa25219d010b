package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// budgetFlags are the budget flags of keys and teams: --budget
// (repeatable) and --session-budget; "none" removes every budget.
type budgetFlags struct {
	budgets []string
	session string
	given   bool
}

func (f *budgetFlags) register(fs *flag.FlagSet) {
	fs.Func("budget", `a budget: AMOUNT/PERIOD, AMOUNT in usd ($5, 5usd) or tokens (2000000tok, 2Mtok), PERIOD day, week or month (repeatable; "none" removes them)`,
		func(v string) error { f.budgets, f.given = append(f.budgets, v), true; return nil })
	fs.Func("session-budget", `a cap on each agent session: AMOUNT in usd or tokens (1usd, 500ktok)`,
		func(v string) error { f.session, f.given = v, true; return nil })
}

// limits are the flags as the API's budget limits.
func (f *budgetFlags) limits() ([]*weirv1.BudgetLimit, error) {
	var out []*weirv1.BudgetLimit
	for _, b := range f.budgets {
		if strings.TrimSpace(b) == "none" {
			continue
		}
		l, err := parseBudget(b)
		if err != nil {
			return nil, fmt.Errorf("--budget %q: %w", b, err)
		}
		out = append(out, l)
	}
	if f.session != "" && f.session != "none" {
		unit, amount, err := parseAmount(f.session)
		if err != nil {
			return nil, fmt.Errorf("--session-budget %q: %w", f.session, err)
		}
		out = append(out, &weirv1.BudgetLimit{Unit: unit, Period: weirv1.BudgetPeriod_BUDGET_PERIOD_SESSION, Amount: amount})
	}
	return out, nil
}

// parseBudget reads AMOUNT/PERIOD: "5usd/day", "$20/week",
// "2000000tok/week", "2Mtok/month".
func parseBudget(s string) (*weirv1.BudgetLimit, error) {
	amount, period, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return nil, errors.New("want AMOUNT/PERIOD, like 5usd/day or 2000000tok/week")
	}
	unit, n, err := parseAmount(amount)
	if err != nil {
		return nil, err
	}
	l := &weirv1.BudgetLimit{Unit: unit, Amount: n}
	switch strings.ToLower(strings.TrimSpace(period)) {
	case "day", "d":
		l.Period = weirv1.BudgetPeriod_BUDGET_PERIOD_DAY
	case "week", "w":
		l.Period = weirv1.BudgetPeriod_BUDGET_PERIOD_WEEK
	case "month", "mo":
		l.Period = weirv1.BudgetPeriod_BUDGET_PERIOD_MONTH
	case "session":
		l.Period = weirv1.BudgetPeriod_BUDGET_PERIOD_SESSION
	default:
		return nil, fmt.Errorf("period %q: day, week or month", period)
	}
	return l, nil
}

// parseAmount reads "5usd", "$5", "2.50usd", "2000000tok", "2Mtok",
// "500ktok", "2000000tokens".
func parseAmount(s string) (weirv1.BudgetUnit, float64, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	unit := weirv1.BudgetUnit_BUDGET_UNIT_UNSPECIFIED
	switch {
	case strings.HasPrefix(s, "$"):
		unit, s = weirv1.BudgetUnit_BUDGET_UNIT_USD, s[1:]
	case strings.HasSuffix(s, "usd"):
		unit, s = weirv1.BudgetUnit_BUDGET_UNIT_USD, strings.TrimSuffix(s, "usd")
	case strings.HasSuffix(s, "tokens"):
		unit, s = weirv1.BudgetUnit_BUDGET_UNIT_TOKENS, strings.TrimSuffix(s, "tokens")
	case strings.HasSuffix(s, "tok"):
		unit, s = weirv1.BudgetUnit_BUDGET_UNIT_TOKENS, strings.TrimSuffix(s, "tok")
	default:
		return unit, 0, errors.New("say usd or tok: 5usd, $5, 2000000tok, 2Mtok")
	}
	mult := 1.0
	if unit == weirv1.BudgetUnit_BUDGET_UNIT_TOKENS {
		switch {
		case strings.HasSuffix(s, "k"):
			mult, s = 1e3, strings.TrimSuffix(s, "k")
		case strings.HasSuffix(s, "m"):
			mult, s = 1e6, strings.TrimSuffix(s, "m")
		case strings.HasSuffix(s, "b"):
			mult, s = 1e9, strings.TrimSuffix(s, "b")
		}
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || n <= 0 {
		return unit, 0, fmt.Errorf("%q is not an amount more than zero", s)
	}
	return unit, n * mult, nil
}

// budgetText is a budget as a table cell: "$5.00/day (spent $1.20)".
func budgetText(b *weirv1.Budget) string {
	l := b.GetLimit()
	amount := func(v float64) string {
		if l.GetUnit() == weirv1.BudgetUnit_BUDGET_UNIT_USD {
			return fmt.Sprintf("$%.2f", v)
		}
		return humanCount(int64(v)) + "tok"
	}
	period := strings.TrimPrefix(strings.ToLower(l.GetPeriod().String()), "budget_period_")
	if l.GetPeriod() == weirv1.BudgetPeriod_BUDGET_PERIOD_SESSION {
		return amount(l.GetAmount()) + " per session"
	}
	return fmt.Sprintf("%s/%s (%s used)", amount(l.GetAmount()), period, amount(b.GetSpent()))
}

func budgetsText(bs []*weirv1.Budget) string {
	if len(bs) == 0 {
		return "-"
	}
	parts := make([]string, len(bs))
	for i, b := range bs {
		parts[i] = budgetText(b)
	}
	return strings.Join(parts, "; ")
}

const teamsUsage = `Usage:
  weir teams create NAME [--budget AMOUNT/PERIOD ...] [--session-budget AMOUNT]
  weir teams update NAME --budget ... | --session-budget ... | --budget none
  weir teams list
  weir teams rm NAME            (its keys stay, in no team; its seats are left paused, without an owner)
Put a key in a team with 'weir keys update KEY --team NAME'. A budget is
AMOUNT/PERIOD: 5usd/day, $100/month, 2000000tok/week; days, weeks (from
Monday) and months begin in the budget_time_zone setting's zone.
Every command takes --json, --controlplane and --data-dir.
`

func runTeams(ctx context.Context, args []string, e env) error {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, teamsUsage)
		return errUsageShown
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("weir teams "+sub, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	var af adminFlags
	af.register(fs, e)
	var bf budgetFlags
	switch sub {
	case "create", "update", "set":
		bf.register(fs)
		ref, c, err := af.refClients(fs, args)
		if err != nil {
			return err
		}
		limits, err := bf.limits()
		if err != nil {
			return err
		}
		var team *weirv1.Team
		if sub == "create" {
			resp, err := c.keys.CreateTeam(ctx, connect.NewRequest(&weirv1.CreateTeamRequest{Name: ref, Budgets: limits}))
			if err != nil {
				return rpcError("create team", err)
			}
			team = resp.Msg.Team
		} else {
			if !bf.given {
				return errors.New("weir teams update: name something to change (--budget, --session-budget)")
			}
			resp, err := c.keys.UpdateTeam(ctx, connect.NewRequest(&weirv1.UpdateTeamRequest{Id: ref,
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"budgets"}}, Budgets: limits}))
			if err != nil {
				return rpcError("update team", err)
			}
			team = resp.Msg.Team
		}
		if af.json {
			return printJSON(e.stdout, team)
		}
		printTeams(e.stdout, []*weirv1.Team{team})
		return nil
	case "list", "ls":
		if err := fs.Parse(args); err != nil {
			return err
		}
		c, err := af.clients()
		if err != nil {
			return err
		}
		resp, err := c.keys.ListTeams(ctx, connect.NewRequest(&weirv1.ListTeamsRequest{}))
		if err != nil {
			return rpcError("list teams", err)
		}
		if af.json {
			return printJSON(e.stdout, resp.Msg)
		}
		printTeams(e.stdout, resp.Msg.Teams)
		return nil
	case "rm", "delete":
		ref, c, err := af.refClients(fs, args)
		if err != nil {
			return err
		}
		if _, err := c.keys.DeleteTeam(ctx, connect.NewRequest(&weirv1.DeleteTeamRequest{Id: ref})); err != nil {
			return rpcError("remove team", err)
		}
		fmt.Fprintf(e.stdout, "removed team %s; its keys are in no team now\n", ref)
		return nil
	}
	fmt.Fprintf(e.stderr, "weir teams: unknown subcommand %q\n\n%s", sub, teamsUsage)
	return errUsageShown
}

func printTeams(w io.Writer, teams []*weirv1.Team) {
	tw := table(w)
	fmt.Fprintln(tw, "NAME\tKEYS\tBUDGETS\tCREATED\tID")
	now := time.Now()
	for _, t := range teams {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", t.Name, t.Keys, budgetsText(t.Budgets), ago(t.CreatedAt, now), t.Id)
	}
	tw.Flush()
}
