package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// runAudit prints the audit log of admin changes, newest first.
func runAudit(ctx context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("weir audit", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	var af adminFlags
	af.register(fs, e)
	since := fs.Duration("since", 0, "only the last DURATION (e.g. 24h); default all")
	actor := fs.String("actor", "", "only this actor, as recorded")
	procedure := fs.String("procedure", "", "only this call (CreateKey, or /weir.v1.KeyService/CreateKey)")
	target := fs.String("target", "", "only calls that named this: an id or a name (an account's id and label, comma-separated, give all of its)")
	limit := fs.Int("limit", 50, "how many, newest first (max 500)")
	page := fs.String("page", "", "continue after an earlier page (the token it printed)")
	pos, err := parsePositional(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("weir audit: unexpected argument %q", pos[0])
	}
	if *since < 0 {
		return fmt.Errorf("weir audit: --since must not be negative")
	}
	c, err := af.clients()
	if err != nil {
		return err
	}
	now := time.Now()
	req := &weirv1.ListAuditEventsRequest{Actor: *actor, Procedure: *procedure, PageSize: int32(*limit), PageToken: *page}
	for t := range strings.SplitSeq(*target, ",") {
		if t = strings.TrimSpace(t); t != "" {
			req.Targets = append(req.Targets, t)
		}
	}
	if *since > 0 {
		req.Since = timestamppb.New(now.Add(-*since))
	}
	resp, err := c.audit.ListAuditEvents(ctx, connect.NewRequest(req))
	if err != nil {
		return rpcError("list audit events", err)
	}
	if af.json {
		return printJSON(e.stdout, resp.Msg)
	}
	tw := table(e.stdout)
	fmt.Fprintln(tw, "WHEN\tAT\tACTOR\tCALL\tTARGET\tOUTCOME\tPEER\tREQUEST")
	for _, ev := range resp.Msg.Events {
		call := ev.Procedure[strings.LastIndex(ev.Procedure, "/")+1:]
		target := ev.Target
		if target == "" {
			target = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ago(ev.At, now), ev.At.AsTime().UTC().Format(time.RFC3339),
			ev.Actor, call, target, ev.Outcome, ev.Peer, ev.Summary)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if resp.Msg.NextPageToken != "" {
		fmt.Fprintf(e.stdout, "\nolder: the same command with --page %s\n", resp.Msg.NextPageToken)
	}
	return nil
}
