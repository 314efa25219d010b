package main

import (
	"context"
	"flag"
	"fmt"
	"io"
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
	fmt.Fprintf(tw, "status\t%d\n", ev.Status)
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
	case ev.Pending:
		_, err := fmt.Fprintln(w, "\nin progress: the request is still being served (or held); its record is complete once it ends")
		return err
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
	for _, r := range ev.AttemptRecords {
		at := "+" + roundDuration(r.At.AsDuration()).String()
		if r.AccountId == "" { // a hold
			fmt.Fprintf(tw, "%s\thold\t-\t-\t-\t-\t%s\t%s\n", at, optDuration(r.Duration), orDash(r.HoldReason))
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
		reason := orDash(strings.Join(reasons, "; "))
		errText := r.ErrorType
		if r.TransportCause != weirv1.TransportCause_TRANSPORT_CAUSE_UNSPECIFIED {
			// The error of an attempt that got no answer is its cause.
			errText = shortEnum(r.TransportCause.String(), "TRANSPORT_CAUSE_")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", at, accountName(accounts, r.AccountId), outcome, status,
			orDash(errText), action, optDuration(r.Duration), reason)
	}
	return tw.Flush()
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
