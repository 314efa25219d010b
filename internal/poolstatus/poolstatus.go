// Package poolstatus sums up a pool for an operator: accounts per provider
// and state, their pooled usage windows, what is wrong (worst first),
// seats, spills to metered accounts, open breakers and the requests held
// now. Pure: `weir status` and the dashboard's pool header build it from
// the same API answers.
package poolstatus

import (
	"fmt"
	"slices"
	"strings"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// expiringWithin: an access token without a refresh token that expires
// within it is worth an operator's attention now.
const expiringWithin = 24 * time.Hour

// Status is what `weir status` shows, and prints with --json.
type Status struct {
	At                time.Time  `json:"at"`
	Accounts          int        `json:"accounts"`
	QuotaResponseMode string     `json:"quota_response_mode"`
	Providers         []Provider `json:"providers"`
	// Problems are what an operator should look at, worst first.
	Problems []Problem `json:"problems"`
	// IntegrityRanAt is when the integrity check last reported; absent
	// before its first run.
	IntegrityRanAt *time.Time `json:"integrity_ran_at,omitempty"`
	// Spills are the requests of the last SpillWindow served by a metered
	// account because no subscription could, per account and surface,
	// most first.
	Spills []Spill `json:"spills"`
	// Breakers are the overload breakers open now: a provider-wide storm
	// for a model family, and how it is probed.
	Breakers []Breaker `json:"breakers"`
	// Held are the requests held now, per model and reason, the longest
	// held first.
	Held []Held `json:"held"`
	// OwnedAccounts is the owned_accounts setting: shared or owners_only.
	OwnedAccounts string `json:"owned_accounts"`
	// Seats are the accounts with an owner, one entry per owner.
	Seats []Seat `json:"seats"`
}

// Seat is one owner's seats (OAuth subscriptions kept for a key, or
// for every key of a team).
type Seat struct {
	// Owner is key:NAME or team:NAME.
	Owner string `json:"owner"`
	// Revoked: the owning key is revoked.
	Revoked bool `json:"revoked,omitempty"`
	// Seats are the accounts' labels with their states, in label order.
	Seats []SeatAccount `json:"seats"`
	// Active is how many of them can take requests now.
	Active int `json:"active"`
}

type SeatAccount struct {
	Label    string `json:"label"`
	Provider string `json:"provider"`
	State    string `json:"state"`
}

// Breaker is one open overload breaker.
type Breaker struct {
	Provider    string        `json:"provider"`
	Family      string        `json:"family"`
	NextProbeAt time.Time     `json:"next_probe_at"`
	ProbeEvery  time.Duration `json:"probe_every_ns"`
	Overloads   int32         `json:"overloads"`
}

// Held sums up the requests held now for one model and reason.
type Held struct {
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

// SpillWindow is how far back `weir status` looks for spills.
const SpillWindow = 24 * time.Hour

// Spill sums up the recent spills to one metered account on one
// surface.
type Spill struct {
	Account  string    `json:"account"`
	Surface  string    `json:"surface"`
	Requests int       `json:"requests"`
	Latest   time.Time `json:"latest"`
}

type Provider struct {
	Provider string `json:"provider"`
	Total    int    `json:"total"`
	// Active are the accounts in the active state; Serving are those of
	// them that can serve now: not Overloaded, that is not answering
	// overloaded within the last minute with no success since.
	Active     int   `json:"active"`
	Serving    int   `json:"serving"`
	Overloaded int   `json:"overloaded"`
	Cooling    int   `json:"cooling"`
	Paused     int   `json:"paused"`
	Broken     int   `json:"broken"`
	InFlight   int32 `json:"in_flight"`
	// Capacity is the concurrency of the accounts that can take requests
	// now (active ones).
	Capacity int32   `json:"capacity"`
	FiveHour *Window `json:"five_hour,omitempty"`
	Weekly   *Window `json:"weekly,omitempty"`
	// Families are the model families some account of the provider is
	// gated for, in name order: for each, how many can serve it now. A
	// family not listed can be served by all Serving accounts.
	Families []Family `json:"families,omitempty"`
}

// Family is what can serve one model family of a provider now.
type Family struct {
	Family string `json:"family"`
	// Serving are the provider's serving accounts not gated for it.
	Serving int `json:"serving"`
	// Gated are the accounts gated for it (whatever their state).
	Gated int `json:"gated"`
}

// Window sums up one usage window over a provider's accounts with a
// current reading.
type Window struct {
	Accounts     int       `json:"accounts"`
	MinUsed      float64   `json:"min_used"`
	MedianUsed   float64   `json:"median_used"`
	MaxUsed      float64   `json:"max_used"`
	SoonestReset time.Time `json:"soonest_reset"`
}

type Problem struct {
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

// Build sums up the pool at now.
func Build(accts []*weirv1.Account, settings *weirv1.Settings, rep *weirv1.IntegrityReport, now time.Time) Status {
	st := Status{At: now.UTC(), Accounts: len(accts), Problems: []Problem{}, Providers: []Provider{}, Spills: []Spill{},
		Breakers: []Breaker{}, Held: []Held{}, Seats: []Seat{},
		QuotaResponseMode: shortEnum(settings.GetQuotaResponseMode().String(), "QUOTA_RESPONSE_MODE_"),
		OwnedAccounts:     "shared"}
	if settings.GetOwnedAccounts() == weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY {
		st.OwnedAccounts = "owners_only"
	}
	byProvider := map[string]*Provider{}
	windows := map[string]map[string][]*weirv1.UsageWindow{}
	var order []string
	for _, a := range accts {
		name := shortEnum(a.Provider.String(), "PROVIDER_")
		p := byProvider[name]
		if p == nil {
			p = &Provider{Provider: name}
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
			if Overloaded(a, now) {
				p.Overloaded++
			} else {
				p.Serving++
			}
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
		st.Problems = append(st.Problems, AccountProblems(a, now)...)
	}
	slices.Sort(order)
	for _, name := range order {
		p := byProvider[name]
		p.Families = familiesOf(name, p.Serving, accts, now)
		p.FiveHour = SumWindow(windows[name]["five_hour"])
		p.Weekly = SumWindow(windows[name]["seven_day"])
		st.Providers = append(st.Providers, *p)
	}
	st.Seats = SeatsOf(accts)
	st.Problems = append(st.Problems, SeatProblems(st.Seats, accts, st.OwnedAccounts == "owners_only")...)
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
			st.Problems = append(st.Problems, Problem{Kind: "integrity", Detail: detail})
		}
	}
	rank := map[string]int{"broken": 0, "integrity": 1, "unreachable": 2, "overloaded": 3, "seats": 4, "expiring": 5, "cooling": 6, "gated": 7, "paused": 8}
	slices.SortStableFunc(st.Problems, func(a, b Problem) int { return rank[a.Kind] - rank[b.Kind] })
	return st
}

// Overloaded: the account answered overloaded within the last minute,
// with no success since.
func Overloaded(a *weirv1.Account, now time.Time) bool {
	return a.OverloadedAt != nil && now.Sub(a.OverloadedAt.AsTime()) < overloadedShown
}

// familiesOf are the families provider's accounts are gated for now, each
// with how many of its serving accounts are not gated for it.
func familiesOf(provider string, serving int, accts []*weirv1.Account, now time.Time) []Family {
	var out []Family
	at := map[string]int{}
	for _, a := range accts {
		if shortEnum(a.Provider.String(), "PROVIDER_") != provider {
			continue
		}
		for _, g := range a.FamilyGates {
			if !g.Until.AsTime().After(now) {
				continue
			}
			i, ok := at[g.Family]
			if !ok {
				i, at[g.Family] = len(out), len(out)
				out = append(out, Family{Family: g.Family, Serving: serving})
			}
			out[i].Gated++
			if a.State == weirv1.AccountState_ACCOUNT_STATE_ACTIVE && !Overloaded(a, now) {
				out[i].Serving--
			}
		}
	}
	slices.SortFunc(out, func(a, b Family) int { return strings.Compare(a.Family, b.Family) })
	return out
}

// SeatsOf are the accounts with an owner, one entry per owner in
// the order of their names.
func SeatsOf(accts []*weirv1.Account) []Seat {
	out := []Seat{}
	at := map[string]int{}
	for _, a := range accts {
		if a.Owner == nil {
			continue
		}
		owner := OwnerText(&weirv1.AccountOwner{Kind: a.Owner.Kind, Name: a.Owner.Name, Id: a.Owner.Id})
		i, ok := at[owner]
		if !ok {
			i, at[owner] = len(out), len(out)
			out = append(out, Seat{Owner: owner, Revoked: a.Owner.Revoked})
		}
		out[i].Seats = append(out[i].Seats, SeatAccount{Label: a.Label, Provider: shortEnum(a.Provider.String(), "PROVIDER_"),
			State: shortEnum(a.State.String(), "ACCOUNT_STATE_")})
		if a.State == weirv1.AccountState_ACCOUNT_STATE_ACTIVE {
			out[i].Active++
		}
	}
	for i := range out {
		slices.SortFunc(out[i].Seats, func(a, b SeatAccount) int { return strings.Compare(a.Label, b.Label) })
	}
	slices.SortFunc(out, func(a, b Seat) int { return strings.Compare(a.Owner, b.Owner) })
	return out
}

// SeatProblems are what owners_only makes worth an operator's look: an
// owner whose seats are all out while shared accounts of the same
// provider can serve (its agents then take the shared capacity), a
// provider whose shared accounts are all out while seats are kept for
// their owners (the keys without a seat have nothing left to use), and a
// revoked key's seats (they serve no one). Under shared, seats serve
// anyone: nothing to say.
func SeatProblems(seats []Seat, accts []*weirv1.Account, ownersOnly bool) []Problem {
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
	var out []Problem
	for _, s := range seats {
		if s.Revoked {
			out = append(out, Problem{Kind: "seats", Detail: fmt.Sprintf("%s is revoked: its %s no one under owners_only "+
				"(give them another owner with weir accounts set LABEL --owner, or remove them)", s.Owner, Plural(len(s.Seats), "seat serves", "seats serve"))})
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
			out = append(out, Problem{Kind: "seats", Detail: fmt.Sprintf("%s: every seat is out (%s); its requests take the shared accounts meanwhile (%d can serve)",
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
		out = append(out, Problem{Kind: "seats", Detail: fmt.Sprintf("%s: %s can serve now, and %s (owners_only): "+
			"keys without a seat have nothing left to use", p, what, Plural(kept[p], "seat is kept for its owner", "seats are kept for their owners"))})
	}
	return out
}

// Plural is "1 seat" or "3 seats"; with two forms, "1 seat is", "3 seats are".
func Plural(n int, forms ...string) string {
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

// Spills sums up the spill events of the last SpillWindow before now
// per account (by label) and surface, most requests first.
func Spills(events []*weirv1.RouteEvent, accts []*weirv1.Account, now time.Time) []Spill {
	labels := map[string]string{}
	for _, a := range accts {
		labels[a.Id] = a.Label
	}
	out := []Spill{}
	at := map[[2]string]int{}
	for _, ev := range events {
		t := ev.GetStartedAt().AsTime().UTC()
		if !ev.SpilledToMetered || t.Before(now.Add(-SpillWindow)) {
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
			out = append(out, Spill{Account: label, Surface: ev.Surface})
		}
		out[i].Requests++
		if t.After(out[i].Latest) {
			out[i].Latest = t
		}
	}
	slices.SortStableFunc(out, func(a, b Spill) int { return b.Requests - a.Requests })
	return out
}

// AccountProblems is what is wrong with one account.
func AccountProblems(a *weirv1.Account, now time.Time) []Problem {
	var out []Problem
	at := func(t interface{ AsTime() time.Time }) *time.Time { v := t.AsTime().UTC(); return &v }
	switch a.State {
	case weirv1.AccountState_ACCOUNT_STATE_BROKEN:
		out = append(out, Problem{Kind: "broken", Account: a.Label, Detail: a.BrokenReason})
	case weirv1.AccountState_ACCOUNT_STATE_PAUSED:
		out = append(out, Problem{Kind: "paused", Account: a.Label, Detail: "paused by an operator (weir accounts resume " + a.Label + ")"})
	}
	u := a.Unreachable
	if u != nil {
		out = append(out, UnreachableProblem(a.Label, u, now))
	}
	if o := a.OverloadedAt; Overloaded(a, now) {
		out = append(out, Problem{Kind: "overloaded", Account: a.Label,
			Detail: "answered overloaded " + RelTime(o.AsTime(), now) + ", no success since", Since: at(o)})
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
		out = append(out, Problem{Kind: "cooling", Account: a.Label, Detail: detail, Until: at(cd.Until)})
	}
	for _, g := range a.FamilyGates {
		out = append(out, Problem{Kind: "gated", Account: a.Label, Detail: g.Family + " gated", Until: at(g.Until)})
	}
	if a.AuthKind == weirv1.AuthKind_AUTH_KIND_OAUTH && !a.Refreshable && a.AccessExpiresAt != nil &&
		a.AccessExpiresAt.AsTime().Before(now.Add(expiringWithin)) {
		detail := "token expires with no refresh token: replace it (weir accounts set " + a.Label + " --secret-file …, or weir login)"
		if !a.AccessExpiresAt.AsTime().After(now) {
			detail = "token expired with no refresh token: replace it (weir accounts set " + a.Label + " --secret-file …, or weir login)"
		}
		out = append(out, Problem{Kind: "expiring", Account: a.Label, Detail: detail, Until: at(a.AccessExpiresAt)})
	}
	return out
}

// UnreachableProblem is an account's run of transport failures, from its
// cooldowns' evidence: "dns no such host for api.example.invalid since
// 12:03, 14 attempts, the last 5s ago".
func UnreachableProblem(label string, u *weirv1.Unreachable, now time.Time) Problem {
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
	detail += fmt.Sprintf(" since %s, %d %s, the last %s", since.Local().Format(layout), u.Attempts, attempts, RelTime(u.LastAt.AsTime(), now))
	return Problem{Kind: "unreachable", Account: label, Detail: detail, Cause: cause, Since: &since, Attempts: u.Attempts}
}

func SumWindow(ws []*weirv1.UsageWindow) *Window {
	if len(ws) == 0 {
		return nil
	}
	used := make([]float64, 0, len(ws))
	s := &Window{Accounts: len(ws)}
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

// HeldNow sums up the requests held now per model and reason, the
// longest held first.
func HeldNow(events []*weirv1.RouteEvent, now time.Time) []Held {
	out := []Held{}
	at := map[[2]string]int{}
	for _, ev := range events {
		if !ev.Pending || ev.HeldSince == nil {
			continue
		}
		k := [2]string{ev.Model, ev.HoldReason}
		i, ok := at[k]
		if !ok {
			i, at[k] = len(out), len(out)
			out = append(out, Held{Model: ev.Model, Reason: ev.HoldReason})
		}
		out[i].Requests++
		if d := now.Sub(ev.HeldSince.AsTime()); d > out[i].Longest || out[i].Request == "" {
			out[i].Longest, out[i].Request = max(d, 0), ev.RequestId
		}
	}
	slices.SortStableFunc(out, func(a, b Held) int { return int(b.Longest - a.Longest) })
	return out
}

// Breakers are the open breakers as status shows them.
func Breakers(bs []*weirv1.Breaker) []Breaker {
	out := make([]Breaker, 0, len(bs))
	for _, b := range bs {
		out = append(out, Breaker{Provider: b.Provider, Family: b.Family, NextProbeAt: b.NextProbeAt.AsTime().UTC(),
			ProbeEvery: b.ProbeEvery.AsDuration(), Overloads: b.Overloads})
	}
	return out
}

// RelTime is t relative to now: "in 3m0s", or "3m0s ago".
func RelTime(t, now time.Time) string {
	if d := t.Sub(now); d > 0 {
		return "in " + RoundDuration(d).String()
	}
	return RoundDuration(now.Sub(t)).String() + " ago"
}

// RoundDuration rounds d for a person: to the minute past an hour, the
// second past a minute, the tenth of a second past a second.
func RoundDuration(d time.Duration) time.Duration {
	switch {
	case d > time.Hour:
		return d.Round(time.Minute)
	case d > time.Minute:
		return d.Round(time.Second)
	case d > time.Second:
		return d.Round(100 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

// shortEnum is an enum value's name less its prefix, in lower case.
func shortEnum(s, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(s, prefix))
}

// ownerText is an account's owner as the tables show it: key:NAME or
// team:NAME ("(revoked)" after a revoked key), "-" when it has none.
func OwnerText(o *weirv1.AccountOwner) string {
	if o == nil {
		return "-"
	}
	name := o.Name
	if name == "" {
		name = o.Id
	}
	s := shortEnum(o.Kind.String(), "OWNER_KIND_") + ":" + name
	if o.Revoked {
		s += " (revoked)"
	}
	return s
}
