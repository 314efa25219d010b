package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

func runRoutes(ctx context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("weir routes", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	var af adminFlags
	af.register(fs, e)
	limit := fs.Int("limit", 20, "how many, newest first (max 1000)")
	account := fs.String("account", "", "only requests served by this account (id or label)")
	held := fs.Bool("held", false, "only requests held now: since when, why, attempts so far and the next try")
	refusals := fs.Bool("refusals", false, "requests refused before routing instead (bad keys, rate limits, body buffer, bad input): counts per minute, key and reason")
	since := fs.Duration("since", time.Hour, "with --refusals: the last DURATION")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := af.clients()
	if err != nil {
		return err
	}
	if *refusals {
		return printRefusals(ctx, c, e, af.json, *limit, *since)
	}
	resp, err := c.routes.ListRouteEvents(ctx, connect.NewRequest(&weirv1.ListRouteEventsRequest{Limit: int32(*limit), AccountId: *account, HeldOnly: *held}))
	if err != nil {
		return rpcError("list routes", err)
	}
	if af.json {
		return printJSON(e.stdout, resp.Msg)
	}
	labels := map[string]string{}
	if accts, err := c.accounts.ListAccounts(ctx, connect.NewRequest(&weirv1.ListAccountsRequest{})); err == nil {
		for _, a := range accts.Msg.Accounts {
			labels[a.Id] = a.Label
		}
	}
	now := time.Now()
	tw := table(e.stdout)
	if *held {
		fmt.Fprintln(tw, "WHEN\tREQUEST\tMODEL\tHELD FOR\tATTEMPTS\tNEXT TRY\tWHY")
		for _, r := range resp.Msg.Events {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", ago(r.StartedAt, now), r.RequestId, r.Model,
				roundDuration(now.Sub(r.HeldSince.AsTime())), r.Attempts, nextTry(r, now), orDash(r.HoldReason))
		}
		return tw.Flush()
	}
	fmt.Fprintln(tw, "WHEN\tREQUEST\tMODEL\tSTATUS\tATTEMPTS\tDURATION\tTTFB\tHELD\tTOKENS IN/OUT\tACCOUNT")
	for _, r := range resp.Msg.Events {
		ttfb := "-"
		if r.TimeToFirstByte != nil {
			ttfb = roundDuration(r.TimeToFirstByte.AsDuration()).String()
		}
		duration, heldFor := roundDuration(r.Duration.AsDuration()).String(), heldText(r)
		if r.Pending {
			// In progress: how long so far, and for a held request how long
			// it has been held.
			duration = roundDuration(now.Sub(r.StartedAt.AsTime())).String() + " so far"
			if r.HeldSince != nil {
				heldFor = roundDuration(now.Sub(r.HeldSince.AsTime())).String() + " now"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d/%d\t%s\n", ago(r.StartedAt, now), r.RequestId, r.Model, statusText(r),
			r.Attempts, duration, ttfb, heldFor, r.InputTokens, r.OutputTokens, accountName(labels, r.AccountId))
	}
	return tw.Flush()
}

// nextTry is when a held request tries again, from now.
func nextTry(r *weirv1.RouteEvent, now time.Time) string {
	if r.NextTryAt == nil {
		return "-"
	}
	if d := r.NextTryAt.AsTime().Sub(now); d > 0 {
		return "in " + roundDuration(d).String()
	}
	return "now"
}

// printRefusals lists the refusal counts (RouteService.ListRefusals):
// refused requests leave no route event, only these.
func printRefusals(ctx context.Context, c *clients, e env, asJSON bool, limit int, since time.Duration) error {
	if since <= 0 {
		return fmt.Errorf("weir routes: --since must be positive")
	}
	now := time.Now()
	resp, err := c.routes.ListRefusals(ctx, connect.NewRequest(&weirv1.ListRefusalsRequest{
		Since: timestamppb.New(now.Add(-since)), Limit: int32(limit)}))
	if err != nil {
		return rpcError("list refusals", err)
	}
	if asJSON {
		return printJSON(e.stdout, resp.Msg)
	}
	keys := map[string]string{}
	if r, err := c.keys.ListKeys(ctx, connect.NewRequest(&weirv1.ListKeysRequest{IncludeRevoked: true})); err == nil {
		for _, k := range r.Msg.Keys {
			keys[k.Id] = k.Name
		}
	}
	tw := table(e.stdout)
	fmt.Fprintln(tw, "INTERVAL\tKEY\tREASON\tREFUSED")
	for _, r := range resp.Msg.Refusals {
		key := "(none)"
		if r.KeyId != "" {
			key = accountName(keys, r.KeyId)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", ago(r.IntervalStart, now), key, r.Reason, r.Count)
	}
	return tw.Flush()
}

// accountName prefers an account's label; a deleted account shows its id.
func accountName(labels map[string]string, id string) string {
	if l, ok := labels[id]; ok {
		return l
	}
	if id == "" {
		return "-"
	}
	return id
}
