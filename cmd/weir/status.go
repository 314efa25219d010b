package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/poolstatus"
)

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
	st := poolstatus.Build(accts.Msg.Accounts, settings.Msg.Settings, integrity.Msg.Report, time.Now())
	st.Spills = poolstatus.Spills(spills.Msg.Events, accts.Msg.Accounts, st.At)
	st.Held = poolstatus.HeldNow(held.Msg.Events, st.At)
	st.Breakers = poolstatus.Breakers(breakers.Msg.Breakers)
	if af.json {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	color := isTTY(e.stdout) && e.getenv("NO_COLOR") == ""
	return printStatus(e.stdout, st, color)
}

// ANSI colors, used only on a terminal without NO_COLOR.
const (
	ansiReset  = "\x1b[0m"
	ansiBold   = "\x1b[1m"
	ansiRed    = "\x1b[31m"
	ansiYellow = "\x1b[33m"
	ansiGreen  = "\x1b[32m"
)

func printStatus(w io.Writer, st poolstatus.Status, color bool) error {
	paint := func(code, s string) string {
		if !color {
			return s
		}
		return code + s + ansiReset
	}
	fmt.Fprintf(w, "%s: %d accounts; quota response mode %s\n\n", paint(ansiBold, "weir pool"), st.Accounts, st.QuotaResponseMode)
	tw := table(w)
	fmt.Fprintln(tw, "PROVIDER\tTOTAL\tSERVING\tOVERLOADED\tCOOLING\tPAUSED\tBROKEN\tIN FLIGHT\t5H USED min/med\t5H RESET\tWEEK USED min/med\tWEEK RESET")
	for _, p := range st.Providers {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d/%d\t%s\t%s\t%s\t%s\n", p.Provider, p.Total, p.Serving, p.Overloaded, p.Cooling, p.Paused, p.Broken,
			p.InFlight, p.Capacity, windowUsed(p.FiveHour), windowReset(p.FiveHour, st.At), windowUsed(p.Weekly), windowReset(p.Weekly, st.At))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range st.Providers {
		for _, f := range p.Families {
			fmt.Fprintf(w, "  %s %s: %d of %d can serve it (%d gated)\n", p.Provider, f.Family, f.Serving, p.Total, f.Gated)
		}
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
				line += fmt.Sprintf(" (expires %s)", poolstatus.RelTime(*p.Until, st.At))
			} else {
				line += fmt.Sprintf(" (until %s)", poolstatus.RelTime(*p.Until, st.At))
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
func printStorm(w io.Writer, st poolstatus.Status, paint func(code, s string) string) error {
	if len(st.Breakers) > 0 {
		fmt.Fprintln(w, paint(ansiBold, "Overloaded providers (breaker open: requests wait while weir probes):"))
		for _, b := range st.Breakers {
			fmt.Fprintf(w, "  %s %s: %s; probing an account every %s, the next %s; %d overload answers in the window\n",
				paint(ansiRed, b.Provider), b.Family, "breaker open", roundDuration(b.ProbeEvery), poolstatus.RelTime(b.NextProbeAt, st.At), b.Overloads)
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
func printSeats(w io.Writer, st poolstatus.Status, paint func(code, s string) string) error {
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
		fmt.Fprintf(w, "  %s: %s, %d active: %s\n", owner, poolstatus.Plural(len(s.Seats), "seat"), s.Active, strings.Join(seats, ", "))
	}
	_, err := fmt.Fprintln(w)
	return err
}

// printSpills prints the recent spills to metered accounts, or that there
// were none.
func printSpills(w io.Writer, st poolstatus.Status, paint func(code, s string) string) error {
	if len(st.Spills) == 0 {
		_, err := fmt.Fprintf(w, "No spills to metered accounts in the last %s.\n\n", shortDuration(poolstatus.SpillWindow))
		return err
	}
	n := 0
	for _, sp := range st.Spills {
		n += sp.Requests
	}
	fmt.Fprintf(w, "%s in the last %s: %d requests served by a metered account because no subscription could\n",
		paint(ansiBold, "Spills to metered accounts"), shortDuration(poolstatus.SpillWindow), n)
	tw := table(w)
	fmt.Fprintln(tw, "  ACCOUNT\tSURFACE\tREQUESTS\tLATEST")
	for _, sp := range st.Spills {
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\n", sp.Account, sp.Surface, sp.Requests, poolstatus.RelTime(sp.Latest, st.At))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w)
	return err
}

func windowUsed(s *poolstatus.Window) string {
	if s == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f%%/%.0f%%", s.MinUsed*100, s.MedianUsed*100)
}

func windowReset(s *poolstatus.Window, now time.Time) string {
	if s == nil || s.SoonestReset.IsZero() {
		return "-"
	}
	return "in " + resetIn(s.SoonestReset.Sub(now))
}
