package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// expiringWithin: an access token without a refresh token that expires
// within it is worth an operator's attention now.
const expiringWithin = 24 * time.Hour

// poolStatus is what `weir status` shows, and prints with --json.
type poolStatus struct {
	At                time.Time        `json:"at"`
	Accounts          int              `json:"accounts"`
	QuotaResponseMode string           `json:"quota_response_mode"`
	Providers         []providerStatus `json:"providers"`
	// Problems are what an operator should look at, worst first.
	Problems []statusProblem `json:"problems"`
	// IntegrityRanAt is when the integrity check last reported; absent
	// before its first run.
	IntegrityRanAt *time.Time `json:"integrity_ran_at,omitempty"`
	// Spills are the requests of the last spillWindow served by a metered
	// account because no subscription could, per account and surface,
	// most first.
	Spills []spillStatus `json:"spills"`
	// Breakers are the overload breakers open now: a provider-wide storm
	// for a model family, and how it is probed.
	Breakers []breakerStatus `json:"breakers"`
	// Held are the requests held now, per model and reason, the longest
	// held first.
	Held []heldStatus `json:"held"`
	// OwnedAccounts is the owned_accounts setting: shared or owners_only.
	OwnedAccounts string `json:"owned_accounts"`
	// Seats are the accounts with an owner, one entry per owner.
	Seats []seatStatus `json:"seats"`
}

// seatStatus is one owner's seats (OAuth subscriptions kept for a key, or
// for every key of a team).
type seatStatus struct {
	// Owner is key:NAME or team:NAME.
	Owner string `json:"owner"`
	// Revoked: the owning key is revoked.
	Revoked bool `json:"revoked,omitempty"`
	// Seats are the accounts' labels with their states, in label order.
	Seats []seatAccount `json:"seats"`
	// Active is how many of them can take requests now.
	Active int `json:"active"`
}

type seatAccount struct {
	Label    string `json:"label"`
	Provider string `json:"provider"`
	State    string `json:"state"`
}

// breakerStatus is one open overload breaker.
type breakerStatus struct {
	Provider    string        `json:"provider"`
	Family      string        `json:"family"`
	NextProbeAt time.Time     `json:"next_probe_at"`
	ProbeEvery  time.Duration `json:"probe_every_ns"`
	Overloads   int32         `json:"overloads"`
}

// heldStatus sums up the requests held now for one model and reason.
type heldStatus struct {
	Model    string `json:"model"`
	Reason   string `json:"reason"`
	Requests int    `json:"requests"`
	// Longest is how long the longest of them has been held.
	Longest time.Duration `json:"longest_ns"`
	// Request is the longest held one's id, for weir explain.
	Request string `json:"request_id"`
}

// overloadedShown is how recent an account's overload answer must be for
// `weir status` to name it.
const overloadedShown = time.Minute

// spillWindow is how far back `weir status` looks for spills.
const spillWindow = 24 * time.Hour

// spillStatus sums up the recent spills to one metered account on one
// surface.
type spillStatus struct {
	Account  string    `json:"account"`
	Surface  string    `json:"surface"`
	Requests int       `json:"requests"`
	Latest   time.Time `json:"latest"`
}

type providerStatus struct {
	Provider string `json:"provider"`
	Total    int    `json:"total"`
	Active   int    `json:"active"`
	Cooling  int    `json:"cooling"`
	Paused   int    `json:"paused"`
	Broken   int    `json:"broken"`
	InFlight int32  `json:"in_flight"`
	// Capacity is the concurrency of the accounts that can take requests
	// now (active ones).
	Capacity int32         `json:"capacity"`
	FiveHour *windowStatus `json:"five_hour,omitempty"`
	Weekly   *windowStatus `json:"weekly,omitempty"`
}

// windowStatus sums up one usage window over a provider's accounts with a
// current reading.
type windowStatus struct {
	Accounts     int       `json:"accounts"`
	MinUsed      float64   `json:"min_used"`
	MedianUsed   float64   `json:"median_used"`
	MaxUsed      float64   `json:"max_used"`
	SoonestReset time.Time `json:"soonest_reset"`
}

type statusProblem struct {
	// broken, integrity, unreachable, expiring, cooling, gated or paused.
	Kind    string     `json:"kind"`
	Account string     `json:"account,omitempty"`
	Detail  string     `json:"detail"`
	Until   *time.Time `json:"until,omitempty"`
	// For unreachable: the transport cause of the latest failure, when
	// the run of failures with no success between them began, and how
	// many attempts failed.
	Cause    string     `json:"cause,omitempty"`
	Since    *time.Time `json:"since,omitempty"`
	Attempts int32      `json:"attempts,omitempty"`
}

func runStatus(ctx context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("weir status", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	var af adminFlags
	af.register(fs, e)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("weir status: unexpected argument %q", fs.Arg(0))
	}
	c, err := af.clients()
	if err != nil {
		return err
	}
	accts, err := c.accounts.ListAccounts(ctx, connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		return rpcError("list accounts", err)
	}
	settings, err := c.settings.GetSettings(ctx, connect.NewRequest(&weirv1.GetSettingsRequest{}))
	if err != nil {
		return rpcError("get settings", err)
	}
	integrity, err := c.ops.LastIntegrityReport(ctx, connect.NewRequest(&weirv1.LastIntegrityReportRequest{}))
	if err != nil {
		return rpcError("last integrity report", err)
	}
	// The newest spills (at most 1000): enough to tell an operator that,
	// where and how much metered accounts are being spent.
	spills, err := c.routes.ListRouteEvents(ctx, connect.NewRequest(&weirv1.ListRouteEventsRequest{Limit: 1000, SpilledOnly: true}))
	if err != nil {
		return rpcError("list route events", err)
	}
	held, err := c.routes.ListRouteEvents(ctx, connect.NewRequest(&weirv1.ListRouteEventsRequest{Limit: 1000, HeldOnly: true}))
	if err != nil {
		return rpcError("list held requests", err)
	}
	breakers, err := c.ops.ListBreakers(ctx, connect.NewRequest(&weirv1.ListBreakersRequest{}))
	if err != nil {
		return rpcError("list breakers", err)
	}
	st := buildStatus(accts.Msg.Accounts, settings.Msg.Settings, integrity.Msg.Report, time.Now())
	st.Spills = sumSpills(spills.Msg.Events, accts.Msg.Accounts, st.At)
	st.Held = sumHeld(held.Msg.Events, st.At)
	st.Breakers = breakerStatuses(breakers.Msg.Breakers)
	if af.json {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	color := isTTY(e.stdout) && e.getenv("NO_COLOR") == ""
	return printStatus(e.stdout, st, color)
}

// buildStatus sums up the pool at now.
func buildStatus(accts []*weirv1.Account, settings *weirv1.Settings, rep *weirv1.IntegrityReport, now time.Time) poolStatus {
	st := poolStatus{At: now.UTC(), Accounts: len(accts), Problems: []statusProblem{}, Providers: []providerStatus{}, Spills: []spillStatus{},
		Breakers: []breakerStatus{}, Held: []heldStatus{}, Seats: []seatStatus{},
		QuotaResponseMode: shortEnum(settings.GetQuotaResponseMode().String(), "QUOTA_RESPONSE_MODE_"),
		OwnedAccounts:     "shared"}
	if settings.GetOwnedAccounts() == weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY {
		st.OwnedAccounts = "owners_only"
	}
	byProvider := map[string]*providerStatus{}
	windows := map[string]map[string][]*weirv1.UsageWindow{}
	var order []string
	for _, a := range accts {
		name := shortEnum(a.Provider.String(), "PROVIDER_")
		p := byProvider[name]
		if p == nil {
			p = &providerStatus{Provider: name}
			byProvider[name] = p
			windows[name] = map[string][]*weirv1.UsageWindow{}
			order = append(order, name)
		}
		p.Total++
		p.InFlight += a.InFlight
		switch a.State {
		case weirv1.AccountState_ACCOUNT_STATE_ACTIVE:
			p.Active++
			p.Capacity += a.MaxConcurrency
		case weirv1.AccountState_ACCOUNT_STATE_COOLING:
			p.Cooling++
		case weirv1.AccountState_ACCOUNT_STATE_PAUSED:
			p.Paused++
		case weirv1.AccountState_ACCOUNT_STATE_BROKEN:
			p.Broken++
		}
		for _, w := range a.Usage {
			// A reading of a window that has reset since says nothing of now.
			if w.Utilization != nil && (w.ResetsAt == nil || w.ResetsAt.AsTime().After(now)) {
				windows[name][w.Window] = append(windows[name][w.Window], w)
			}
		}
		st.Problems = append(st.Problems, accountProblems(a, now)...)
	}
	slices.Sort(order)
	for _, name := range order {
		p := byProvider[name]
		p.FiveHour = sumWindow(windows[name]["five_hour"])
		p.Weekly = sumWindow(windows[name]["seven_day"])
		st.Providers = append(st.Providers, *p)
	}
	st.Seats = seatStatuses(accts)
	st.Problems = append(st.Problems, seatProblems(st.Seats, accts, st.OwnedAccounts == "owners_only")...)
	if rep != nil {
		t := rep.RanAt.AsTime().UTC()
		st.IntegrityRanAt = &t
		for _, f := range rep.Findings {
			if f.Action != "reported" || f.Count == 0 {
				continue
			}
			var names []string
			for _, a := range f.Accounts {
				names = append(names, a.Label)
			}
			detail := fmt.Sprintf("%s: %d", f.Kind, f.Count)
			if len(names) > 0 {
				detail += " (" + strings.Join(names, ", ") + ")"
			}
			st.Problems = append(st.Problems, statusProblem{Kind: "integrity", Detail: detail})
		}
	}
	rank := map[string]int{"broken": 0, "integrity": 1, "unreachable": 2, "overloaded": 3, "seats": 4, "expiring": 5, "cooling": 6, "gated": 7, "paused": 8}
	slices.SortStableFunc(st.Problems, func(a, b statusProblem) int { return rank[a.Kind] - rank[b.Kind] })
	return st
}

// seatStatuses are the accounts with an owner, one entry per owner in
// the order of their names.
func seatStatuses(accts []*weirv1.Account) []seatStatus {
	out := []seatStatus{}
	at := map[string]int{}
	for _, a := range accts {
		if a.Owner == nil {
			continue
		}
		owner := ownerText(&weirv1.AccountOwner{Kind: a.Owner.Kind, Name: a.Owner.Name, Id: a.Owner.Id})
		i, ok := at[owner]
		if !ok {
			i, at[owner] = len(out), len(out)
			out = append(out, seatStatus{Owner: owner, Revoked: a.Owner.Revoked})
		}
		out[i].Seats = append(out[i].Seats, seatAccount{Label: a.Label, Provider: shortEnum(a.Provider.String(), "PROVIDER_"),
			State: shortEnum(a.State.String(), "ACCOUNT_STATE_")})
		if a.State == weirv1.AccountState_ACCOUNT_STATE_ACTIVE {
			out[i].Active++
		}
	}
	for i := range out {
		slices.SortFunc(out[i].Seats, func(a, b seatAccount) int { return strings.Compare(a.Label, b.Label) })
	}
	slices.SortFunc(out, func(a, b seatStatus) int { return strings.Compare(a.Owner, b.Owner) })
	return out
}

// seatProblems are what owners_only makes worth an operator's look: an
// owner whose seats are all out while shared accounts of the same
// provider can serve (its agents then take the shared capacity), a
// provider whose shared accounts are all out while seats are kept for
// their owners (the keys without a seat have nothing left to use), and a
// revoked key's seats (they serve no one). Under shared, seats serve
// anyone: nothing to say.
func seatProblems(seats []seatStatus, accts []*weirv1.Account, ownersOnly bool) []statusProblem {
	if !ownersOnly || len(seats) == 0 {
		return nil
	}
	// Per provider: the shared accounts that can serve now, and the seats.
	sharedActive, sharedTotal, kept := map[string]int{}, map[string]int{}, map[string]int{}
	var providers []string
	for _, a := range accts {
		p := shortEnum(a.Provider.String(), "PROVIDER_")
		if _, ok := sharedTotal[p]; !ok {
			providers = append(providers, p)
			sharedTotal[p] = 0
		}
		switch {
		case a.Owner != nil:
			kept[p]++
		case a.State == weirv1.AccountState_ACCOUNT_STATE_ACTIVE:
			sharedActive[p]++
			sharedTotal[p]++
		default:
			sharedTotal[p]++
		}
	}
	var out []statusProblem
	for _, s := range seats {
		if s.Revoked {
			out = append(out, statusProblem{Kind: "seats", Detail: fmt.Sprintf("%s is revoked: its %s no one under owners_only "+
				"(give them another owner with weir accounts set LABEL --owner, or remove them)", s.Owner, plural(len(s.Seats), "seat serves", "seats serve"))})
			continue
		}
		if s.Active > 0 {
			continue
		}
		var labels []string
		shared := 0
		seen := map[string]bool{}
		for _, a := range s.Seats {
			labels = append(labels, a.Label+" "+a.State)
			if !seen[a.Provider] {
				seen[a.Provider] = true
				shared += sharedActive[a.Provider]
			}
		}
		if shared > 0 {
			out = append(out, statusProblem{Kind: "seats", Detail: fmt.Sprintf("%s: every seat is out (%s); its requests take the shared accounts meanwhile (%d can serve)",
				s.Owner, strings.Join(labels, ", "), shared)})
		}
	}
	slices.Sort(providers)
	for _, p := range providers {
		if kept[p] == 0 || sharedActive[p] > 0 {
			continue
		}
		what := "no shared account"
		if sharedTotal[p] > 0 {
			what = fmt.Sprintf("none of the %d shared accounts", sharedTotal[p])
		}
		out = append(out, statusProblem{Kind: "seats", Detail: fmt.Sprintf("%s: %s can serve now, and %s (owners_only): "+
			"keys without a seat have nothing left to use", p, what, plural(kept[p], "seat is kept for its owner", "seats are kept for their owners"))})
	}
	return out
}

// plural is "1 seat" or "3 seats"; with two forms, "1 seat is", "3 seats are".
func plural(n int, forms ...string) string {
	if len(forms) == 2 {
		if n == 1 {
			return "1 " + forms[0]
		}
		return fmt.Sprintf("%d %s", n, forms[1])
	}
	if n == 1 {
		return "1 " + forms[0]
	}
	return fmt.Sprintf("%d %ss", n, forms[0])
}

// sumSpills sums up the spill events of the last spillWindow before now
// per account (by label) and surface, most requests first.
func sumSpills(events []*weirv1.RouteEvent, accts []*weirv1.Account, now time.Time) []spillStatus {
	labels := map[string]string{}
	for _, a := range accts {
		labels[a.Id] = a.Label
	}
	out := []spillStatus{}
	at := map[[2]string]int{}
	for _, ev := range events {
		t := ev.GetStartedAt().AsTime().UTC()
		if !ev.SpilledToMetered || t.Before(now.Add(-spillWindow)) {
			continue
		}
		label := labels[ev.AccountId]
		if label == "" {
			label = "(deleted account)"
		}
		k := [2]string{label, ev.Surface}
		i, ok := at[k]
		if !ok {
			i, at[k] = len(out), len(out)
			out = append(out, spillStatus{Account: label, Surface: ev.Surface})
		}
		out[i].Requests++
		if t.After(out[i].Latest) {
			out[i].Latest = t
		}
	}
	slices.SortStableFunc(out, func(a, b spillStatus) int { return b.Requests - a.Requests })
	return out
}

// accountProblems is what is wrong with one account.
func accountProblems(a *weirv1.Account, now time.Time) []statusProblem {
	var out []statusProblem
	at := func(t interface{ AsTime() time.Time }) *time.Time { v := t.AsTime().UTC(); return &v }
	switch a.State {
	case weirv1.AccountState_ACCOUNT_STATE_BROKEN:
		out = append(out, statusProblem{Kind: "broken", Account: a.Label, Detail: a.BrokenReason})
	case weirv1.AccountState_ACCOUNT_STATE_PAUSED:
		out = append(out, statusProblem{Kind: "paused", Account: a.Label, Detail: "paused by an operator (weir accounts resume " + a.Label + ")"})
	}
	u := a.Unreachable
	if u != nil {
		out = append(out, unreachableProblem(a.Label, u, now))
	}
	if o := a.OverloadedAt; o != nil && now.Sub(o.AsTime()) < overloadedShown {
		out = append(out, statusProblem{Kind: "overloaded", Account: a.Label,
			Detail: "answered overloaded " + relTime(o.AsTime(), now) + ", no success since", Since: at(o)})
	}
	if cd := a.Cooldown; cd != nil && (u == nil || cd.Reason != weirv1.CooldownReason_COOLDOWN_REASON_TRANSPORT) {
		// A transport cooldown is the unreachable line's.
		detail := shortEnum(cd.Reason.String(), "COOLDOWN_REASON_")
		switch {
		case strings.HasPrefix(cd.Evidence, detail):
			detail = cd.Evidence
		case cd.Evidence != "":
			detail += ": " + cd.Evidence
		}
		out = append(out, statusProblem{Kind: "cooling", Account: a.Label, Detail: detail, Until: at(cd.Until)})
	}
	for _, g := range a.FamilyGates {
		out = append(out, statusProblem{Kind: "gated", Account: a.Label, Detail: g.Family + " gated", Until: at(g.Until)})
	}
	if a.AuthKind == weirv1.AuthKind_AUTH_KIND_OAUTH && !a.Refreshable && a.AccessExpiresAt != nil &&
		a.AccessExpiresAt.AsTime().Before(now.Add(expiringWithin)) {
		detail := "token expires with no refresh token: replace it (weir accounts set " + a.Label + " --secret-file …, or weir login)"
		if !a.AccessExpiresAt.AsTime().After(now) {
			detail = "token expired with no refresh token: replace it (weir accounts set " + a.Label + " --secret-file …, or weir login)"
		}
		out = append(out, statusProblem{Kind: "expiring", Account: a.Label, Detail: detail, Until: at(a.AccessExpiresAt)})
	}
	return out
}

// unreachableProblem is an account's run of transport failures, from its
// cooldowns' evidence: "dns no such host for api.example.invalid since
// 12:03, 14 attempts, the last 5s ago".
func unreachableProblem(label string, u *weirv1.Unreachable, now time.Time) statusProblem {
	cause := shortEnum(u.Cause.String(), "TRANSPORT_CAUSE_")
	detail := cause
	switch {
	case u.Cause == weirv1.TransportCause_TRANSPORT_CAUSE_PROXY && u.Error != "":
		detail = u.Error // "egress proxy socks5://10.0.0.7:1080 could not be reached (…)"
	case u.Error != "":
		detail += " " + u.Error
	}
	if u.Host != "" {
		detail += " for " + u.Host
	}
	since := u.Since.AsTime().UTC()
	layout := "15:04"
	if now.Sub(since) >= 24*time.Hour {
		layout = "Jan 2 15:04"
	}
	attempts := "attempts"
	if u.Attempts == 1 {
		attempts = "attempt"
	}
	detail += fmt.Sprintf(" since %s, %d %s, the last %s", since.Local().Format(layout), u.Attempts, attempts, relTime(u.LastAt.AsTime(), now))
	return statusProblem{Kind: "unreachable", Account: label, Detail: detail, Cause: cause, Since: &since, Attempts: u.Attempts}
}

func sumWindow(ws []*weirv1.UsageWindow) *windowStatus {
	if len(ws) == 0 {
		return nil
	}
	used := make([]float64, 0, len(ws))
	s := &windowStatus{Accounts: len(ws)}
	for _, w := range ws {
		used = append(used, *w.Utilization)
		if w.ResetsAt != nil && (s.SoonestReset.IsZero() || w.ResetsAt.AsTime().Before(s.SoonestReset)) {
			s.SoonestReset = w.ResetsAt.AsTime().UTC()
		}
	}
	slices.Sort(used)
	s.MinUsed, s.MaxUsed = used[0], used[len(used)-1]
	if n := len(used); n%2 == 1 {
		s.MedianUsed = used[n/2]
	} else {
		s.MedianUsed = (used[n/2-1] + used[n/2]) / 2
	}
	return s
}

// ANSI colors, used only on a terminal without NO_COLOR.
const (
	ansiReset  = "\x1b[0m"
	ansiBold   = "\x1b[1m"
	ansiRed    = "\x1b[31m"
	ansiYellow = "\x1b[33m"
	ansiGreen  = "\x1b[32m"
)

func printStatus(w io.Writer, st poolStatus, color bool) error {
	paint := func(code, s string) string {
		if !color {
			return s
		}
		return code + s + ansiReset
	}
	fmt.Fprintf(w, "%s: %d accounts; quota response mode %s\n\n", paint(ansiBold, "weir pool"), st.Accounts, st.QuotaResponseMode)
	tw := table(w)
	fmt.Fprintln(tw, "PROVIDER\tTOTAL\tACTIVE\tCOOLING\tPAUSED\tBROKEN\tIN FLIGHT\t5H USED min/med\t5H RESET\tWEEK USED min/med\tWEEK RESET")
	for _, p := range st.Providers {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d/%d\t%s\t%s\t%s\t%s\n", p.Provider, p.Total, p.Active, p.Cooling, p.Paused, p.Broken,
			p.InFlight, p.Capacity, windowUsed(p.FiveHour), windowReset(p.FiveHour, st.At), windowUsed(p.Weekly), windowReset(p.Weekly, st.At))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if err := printSpills(w, st, paint); err != nil {
		return err
	}
	if err := printStorm(w, st, paint); err != nil {
		return err
	}
	if err := printSeats(w, st, paint); err != nil {
		return err
	}
	if len(st.Problems) == 0 && len(st.Breakers) == 0 && len(st.Held) == 0 {
		_, err := fmt.Fprintln(w, paint(ansiGreen, "Nothing is wrong."))
		return err
	}
	if len(st.Problems) == 0 {
		return nil
	}
	fmt.Fprintln(w, paint(ansiBold, "What is wrong:"))
	for _, p := range st.Problems {
		c := ansiYellow
		if p.Kind == "broken" || p.Kind == "integrity" || p.Kind == "unreachable" || p.Kind == "overloaded" {
			c = ansiRed
		}
		line := p.Detail
		if p.Account != "" {
			line = p.Account + ": " + line
		}
		if p.Until != nil {
			if p.Kind == "expiring" {
				line += fmt.Sprintf(" (expires %s)", relTime(*p.Until, st.At))
			} else {
				line += fmt.Sprintf(" (until %s)", relTime(*p.Until, st.At))
			}
		}
		fmt.Fprintf(w, "  %s %s\n", paint(c, fmt.Sprintf("%-11s", p.Kind)), line)
	}
	if st.IntegrityRanAt == nil {
		fmt.Fprintln(w, "  (the integrity check has not reported yet)")
	}
	return nil
}

// printStorm prints the open breakers and the requests held now, when
// there are any: a storm shown as what it is.
func printStorm(w io.Writer, st poolStatus, paint func(code, s string) string) error {
	if len(st.Breakers) > 0 {
		fmt.Fprintln(w, paint(ansiBold, "Overloaded providers (breaker open: requests wait while weir probes):"))
		for _, b := range st.Breakers {
			fmt.Fprintf(w, "  %s %s: %s; probing an account every %s, the next %s; %d overload answers in the window\n",
				paint(ansiRed, b.Provider), b.Family, "breaker open", roundDuration(b.ProbeEvery), relTime(b.NextProbeAt, st.At), b.Overloads)
		}
		fmt.Fprintln(w)
	}
	if len(st.Held) == 0 {
		return nil
	}
	n := 0
	for _, h := range st.Held {
		n += h.Requests
	}
	fmt.Fprintf(w, "%s: %d requests waiting for capacity (weir routes --held)\n", paint(ansiBold, "Held now"), n)
	tw := table(w)
	fmt.Fprintln(tw, "  MODEL\tREQUESTS\tLONGEST\tREQUEST\tWHY")
	for _, h := range st.Held {
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\n", h.Model, h.Requests, roundDuration(h.Longest), h.Request, h.Reason)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w)
	return err
}

// printSeats prints a line per owner with their seats, when any account
// has an owner.
func printSeats(w io.Writer, st poolStatus, paint func(code, s string) string) error {
	if len(st.Seats) == 0 {
		return nil
	}
	how := "shared: they serve anyone, their owners first"
	if st.OwnedAccounts == "owners_only" {
		how = "owners_only: they serve their owners alone"
	}
	fmt.Fprintf(w, "%s (owned_accounts=%s)\n", paint(ansiBold, "Seats"), how)
	for _, s := range st.Seats {
		var seats []string
		for _, a := range s.Seats {
			seats = append(seats, a.Label+" "+a.State)
		}
		owner := s.Owner
		if s.Revoked {
			owner += " (revoked)"
		}
		fmt.Fprintf(w, "  %s: %s, %d active: %s\n", owner, plural(len(s.Seats), "seat"), s.Active, strings.Join(seats, ", "))
	}
	_, err := fmt.Fprintln(w)
	return err
}

// sumHeld sums up the requests held now per model and reason, the
// longest held first.
func sumHeld(events []*weirv1.RouteEvent, now time.Time) []heldStatus {
	out := []heldStatus{}
	at := map[[2]string]int{}
	for _, ev := range events {
		if !ev.Pending || ev.HeldSince == nil {
			continue
		}
		k := [2]string{ev.Model, ev.HoldReason}
		i, ok := at[k]
		if !ok {
			i, at[k] = len(out), len(out)
			out = append(out, heldStatus{Model: ev.Model, Reason: ev.HoldReason})
		}
		out[i].Requests++
		if d := now.Sub(ev.HeldSince.AsTime()); d > out[i].Longest || out[i].Request == "" {
			out[i].Longest, out[i].Request = max(d, 0), ev.RequestId
		}
	}
	slices.SortStableFunc(out, func(a, b heldStatus) int { return int(b.Longest - a.Longest) })
	return out
}

// breakerStatuses are the open breakers as status shows them.
func breakerStatuses(bs []*weirv1.Breaker) []breakerStatus {
	out := make([]breakerStatus, 0, len(bs))
	for _, b := range bs {
		out = append(out, breakerStatus{Provider: b.Provider, Family: b.Family, NextProbeAt: b.NextProbeAt.AsTime().UTC(),
			ProbeEvery: b.ProbeEvery.AsDuration(), Overloads: b.Overloads})
	}
	return out
}

// printSpills prints the recent spills to metered accounts, or that there
// were none.
func printSpills(w io.Writer, st poolStatus, paint func(code, s string) string) error {
	if len(st.Spills) == 0 {
		_, err := fmt.Fprintf(w, "No spills to metered accounts in the last %s.\n\n", shortDuration(spillWindow))
		return err
	}
	n := 0
	for _, sp := range st.Spills {
		n += sp.Requests
	}
	fmt.Fprintf(w, "%s in the last %s: %d requests served by a metered account because no subscription could\n",
		paint(ansiBold, "Spills to metered accounts"), shortDuration(spillWindow), n)
	tw := table(w)
	fmt.Fprintln(tw, "  ACCOUNT\tSURFACE\tREQUESTS\tLATEST")
	for _, sp := range st.Spills {
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\n", sp.Account, sp.Surface, sp.Requests, relTime(sp.Latest, st.At))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w)
	return err
}

func windowUsed(s *windowStatus) string {
	if s == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f%%/%.0f%%", s.MinUsed*100, s.MedianUsed*100)
}

func windowReset(s *windowStatus, now time.Time) string {
	if s == nil || s.SoonestReset.IsZero() {
		return "-"
	}
	return "in " + resetIn(s.SoonestReset.Sub(now))
}

// relTime is t relative to now: "in 3m0s", or "3m0s ago".
func relTime(t, now time.Time) string {
	if d := t.Sub(now); d > 0 {
		return "in " + roundDuration(d).String()
	}
	return roundDuration(now.Sub(t)).String() + " ago"
}
