package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

const explainUsage = `Usage:
  weir explain REQUEST_ID   one request's outcome and timeline of attempts and holds
The request id is the Weir-Request-Id response header. Takes --json,
--controlplane and --data-dir.
`

func runExplain(ctx context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("weir explain", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	var af adminFlags
	af.register(fs, e)
	pos, err := parsePositional(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fmt.Fprint(e.stderr, explainUsage)
		return errUsageShown
	}
	c, err := af.clients()
	if err != nil {
		return err
	}
	resp, err := c.routes.GetRouteEvent(ctx, connect.NewRequest(&weirv1.GetRouteEventRequest{RequestId: pos[0]}))
	if err != nil {
		return rpcError("explain", err)
	}
	if af.json {
		return printJSON(e.stdout, resp.Msg)
	}
	// Labels are a courtesy: without them the ids still identify everything.
	accounts := map[string]string{}
	if r, err := c.accounts.ListAccounts(ctx, connect.NewRequest(&weirv1.ListAccountsRequest{})); err == nil {
		for _, a := range r.Msg.Accounts {
			accounts[a.Id] = a.Label
		}
	}
	keys := map[string]string{}
	if r, err := c.keys.ListKeys(ctx, connect.NewRequest(&weirv1.ListKeysRequest{IncludeRevoked: true})); err == nil {
		for _, k := range r.Msg.Keys {
			keys[k.Id] = k.Name
		}
	}
	return printExplain(e.stdout, resp.Msg.Event, accounts, keys, time.Now())
}

func printExplain(w io.Writer, ev *weirv1.RouteEvent, accounts, keys map[string]string, now time.Time) error {
	model := ev.Model
	if model == "" {
		model = "-"
	}
	if ev.Stream {
		model += " (stream)"
	}
	failure := "-"
	if ev.FailureStage != weirv1.FailureStage_FAILURE_STAGE_UNSPECIFIED {
		failure = shortEnum(ev.FailureStage.String(), "FAILURE_STAGE_")
	}
	started := "-"
	if ev.StartedAt != nil {
		started = fmt.Sprintf("%s (%s)", ev.StartedAt.AsTime().UTC().Format(time.RFC3339), ago(ev.StartedAt, now))
	}
	tw := table(w)
	fmt.Fprintf(tw, "request\t%s\n", ev.RequestId)
	fmt.Fprintf(tw, "started\t%s\n", started)
	fmt.Fprintf(tw, "model\t%s\n", model)
	fmt.Fprintf(tw, "status\t%s\n", statusText(ev))
	if ev.Verdict != "" {
		fmt.Fprintf(tw, "why\t%s\n", ev.Verdict)
	}
	if ev.Pending && ev.HeldSince != nil {
		fmt.Fprintf(tw, "held now\t%s\n", heldNowText(ev, now))
	}
	fmt.Fprintf(tw, "error\t%s\n", orDash(ev.ErrorType))
	fmt.Fprintf(tw, "failure stage\t%s\n", failure)
	fmt.Fprintf(tw, "attempts\t%d\n", ev.Attempts)
	fmt.Fprintf(tw, "duration\t%s\n", optDuration(ev.Duration))
	fmt.Fprintf(tw, "ttfb\t%s\n", optDuration(ev.TimeToFirstByte))
	fmt.Fprintf(tw, "held\t%s\n", heldText(ev))
	fmt.Fprintf(tw, "tokens\t%d in / %d out\n", ev.InputTokens, ev.OutputTokens)
	fmt.Fprintf(tw, "key\t%s\n", accountName(keys, ev.KeyId))
	account := accountName(accounts, ev.AccountId)
	if ev.SpilledToMetered {
		account += " (metered: a spill, no subscription could serve)"
	}
	fmt.Fprintf(tw, "account\t%s\n", account)
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case ev.Pending && len(ev.AttemptRecords) == 0:
		_, err := fmt.Fprintln(w, "\nin progress: the request is still being served (or held); its record is complete once it ends")
		return err
	case ev.Pending:
		fmt.Fprintln(w, "\nin progress: the timeline so far; the record is complete once the request ends")
	case ev.ErrorType == "worker_lost":
		_, err := fmt.Fprintln(w, "\nlost: the worker serving the request stopped reporting (it died, or was cut off from every control plane) before the request ended")
		return err
	case len(ev.AttemptRecords) == 0:
		_, err := fmt.Fprintln(w, "\nno timeline: the data plane recorded no attempts for this request")
		return err
	}
	fmt.Fprintln(w, "\ntimeline")
	tw = table(w)
	fmt.Fprintln(tw, "AT\tACCOUNT\tOUTCOME\tSTATUS\tERROR\tDECISION\tDURATION\tREASON")
	for _, row := range foldTimeline(timelineRows(ev.AttemptRecords, accounts)) {
		fmt.Fprintln(tw, row.text())
	}
	return tw.Flush()
}

// timelineRow is one attempt or hold of the timeline, as printed.
type timelineRow struct {
	at       time.Duration
	account  string
	accounts map[string]bool // the accounts a folded row covers
	// cols are OUTCOME, STATUS, ERROR and DECISION.
	cols     [4]string
	duration time.Duration
	timed    bool // duration is known
	reason   string
	// times counts the repeats a folded row stands for (0 or 1: one).
	times int
}

// same says whether two rows repeat each other, whatever their time and,
// for attempts, their account and its notes (a storm's probes go round
// the pool, a metered account among them); a wait repeats a wait for the
// same reason.
func (r timelineRow) same(o timelineRow) bool {
	hold := r.account == "hold"
	return hold == (o.account == "hold") && r.cols == o.cols && (!hold || r.reason == o.reason)
}

func (r timelineRow) text() string {
	account, duration, reason := r.account, "-", r.reason
	if len(r.accounts) > 1 {
		account = fmt.Sprintf("%d accounts", len(r.accounts))
	}
	if r.timed {
		duration = roundDuration(r.duration).String()
	}
	if r.times > 1 {
		reason = fmt.Sprintf("%s (×%d)", reason, r.times)
	}
	return fmt.Sprintf("+%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", roundDuration(r.at), account,
		r.cols[0], r.cols[1], r.cols[2], r.cols[3], duration, reason)
}

// foldTimeline folds repeats, so that a long hold reads in a screen: a
// run of rows that repeat one row, or a cycle of up to maxFoldCycle rows
// (a probe and the waits after it), becomes that row or cycle once,
// counted, with the durations summed and the accounts counted. Pure.
func foldTimeline(rows []timelineRow) []timelineRow {
	var out []timelineRow
	for i := 0; i < len(rows); {
		folded, used := foldAt(rows, i)
		out = append(out, folded...)
		i += used
	}
	return out
}

// maxFoldCycle is the longest cycle of rows foldTimeline folds: a probe,
// the wait for the next, and the wait with the worker's other held
// requests.
const maxFoldCycle = 4

// foldAt folds the repeats that begin at rows[i], trying a single row
// first, then longer cycles; it returns the rows to print and how many it
// used.
func foldAt(rows []timelineRow, i int) ([]timelineRow, int) {
	for period := 1; period <= maxFoldCycle; period++ {
		n := 1 // repeats of rows[i:i+period]
		for i+(n+1)*period <= len(rows) && repeats(rows[i:i+period], rows[i+n*period:i+(n+1)*period]) {
			n++
		}
		if n < 2 {
			continue
		}
		folded := make([]timelineRow, period)
		for p := range period {
			f := rows[i+p]
			f.accounts, f.times, f.duration = map[string]bool{}, n, 0
			var reasons []string
			for k := range n {
				r := rows[i+k*period+p]
				f.accounts[r.account] = true
				f.duration += r.duration
				if r.reason != "-" && !slices.Contains(reasons, r.reason) {
					reasons = append(reasons, r.reason)
				}
			}
			f.reason = orDash(strings.Join(reasons, "; "))
			folded[p] = f
		}
		return folded, n * period
	}
	return rows[i : i+1], 1
}

func repeats(a, b []timelineRow) bool {
	for k := range a {
		if !a[k].same(b[k]) {
			return false
		}
	}
	return true
}

// timelineRows turns a request's records into rows.
func timelineRows(recs []*weirv1.AttemptRecord, accounts map[string]string) []timelineRow {
	rows := make([]timelineRow, 0, len(recs))
	for _, r := range recs {
		row := timelineRow{at: r.At.AsDuration(), duration: r.Duration.AsDuration(), timed: r.Duration != nil}
		if r.AccountId == "" { // a hold
			row.account, row.cols, row.reason = "hold", [4]string{"-", "-", "-", "-"}, orDash(r.HoldReason)
			rows = append(rows, row)
			continue
		}
		status := "-"
		if r.Status != 0 {
			status = fmt.Sprint(r.Status)
		}
		outcome, action := "-", "-"
		if r.Class != weirv1.OutcomeClass_OUTCOME_CLASS_UNSPECIFIED {
			outcome = shortEnum(r.Class.String(), "OUTCOME_CLASS_")
		}
		if r.Action != weirv1.Action_ACTION_UNSPECIFIED {
			action = shortEnum(r.Action.String(), "ACTION_")
		}
		var reasons []string
		if r.SpilledToMetered {
			reasons = append(reasons, "spill to a metered account")
		}
		if r.Rung != "" {
			reasons = append(reasons, "429 ladder: "+strings.ReplaceAll(r.Rung, "_", " "))
		}
		if r.Translation != "" {
			reasons = append(reasons, "translated "+strings.ReplaceAll(r.Translation, ">", " → ")+" as "+r.Model)
		}
		reason := orDash(strings.Join(reasons, "; "))
		errText := r.ErrorType
		if r.TransportCause != weirv1.TransportCause_TRANSPORT_CAUSE_UNSPECIFIED {
			// The error of an attempt that got no answer is its cause.
			errText = shortEnum(r.TransportCause.String(), "TRANSPORT_CAUSE_")
			if r.TransportCause == weirv1.TransportCause_TRANSPORT_CAUSE_PROXY && r.TransportError != "" {
				// It names the proxy: "egress proxy socks5://10.0.0.7:1080
				// could not be reached (connection refused)".
				errText = r.TransportError
			}
		}
		row.account, row.cols, row.reason = accountName(accounts, r.AccountId), [4]string{outcome, status, orDash(errText), action}, reason
		rows = append(rows, row)
	}
	return rows
}

// statusText is the status the client saw, and for a stream that failed
// after output that it did: such a request is a failure, not a 200.
func statusText(ev *weirv1.RouteEvent) string {
	switch {
	case ev.Pending && ev.HeldSince != nil:
		return "held"
	case ev.Pending:
		return "in progress"
	case ev.FailureStage == weirv1.FailureStage_FAILURE_STAGE_AFTER_OUTPUT:
		return fmt.Sprintf("%d, failed mid-stream", ev.Status)
	}
	return fmt.Sprint(ev.Status)
}

// heldNowText is a held request's hold: for how long, why, and its next
// try.
func heldNowText(ev *weirv1.RouteEvent, now time.Time) string {
	text := fmt.Sprintf("for %s (since %s), %d attempts so far", roundDuration(now.Sub(ev.HeldSince.AsTime())),
		ev.HeldSince.AsTime().UTC().Format(time.RFC3339), ev.Attempts)
	if ev.NextTryAt != nil {
		text += ", next try " + nextTry(ev, now)
	}
	if ev.HoldReason != "" {
		text += ": " + ev.HoldReason
	}
	return text
}

// heldText is a request's time in capacity holds, "-" when it had none.
func heldText(ev *weirv1.RouteEvent) string {
	if ev.HoldCount == 0 && ev.Held.AsDuration() == 0 {
		return "-"
	}
	holds := "holds"
	if ev.HoldCount == 1 {
		holds = "hold"
	}
	return fmt.Sprintf("%s (%d %s)", roundDuration(ev.Held.AsDuration()), ev.HoldCount, holds)
}

func optDuration(d *durationpb.Duration) string {
	if d == nil {
		return "-"
	}
	return roundDuration(d.AsDuration()).String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
