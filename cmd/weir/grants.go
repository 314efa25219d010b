package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// bankedFlags are accounts set's banked-reset flags.
type bankedFlags struct {
	banked onOff
	org    string
}

func (b *bankedFlags) register(fs *flag.FlagSet) {
	fs.Var(&b.banked, "banked-resets", "claim banked-reset grants automatically: on or off")
	fs.StringVar(&b.org, "org", "", "the provider organization id, for the reset claim URL")
}

// apply sets the request field and mask path of a flag that was given.
func (b *bankedFlags) apply(name string, req *weirv1.UpdateAccountRequest) {
	switch name {
	case "banked-resets":
		req.BankedResetsEnabled = bool(b.banked)
		req.UpdateMask.Paths = append(req.UpdateMask.Paths, "banked_resets_enabled")
	case "org":
		req.OrgId = b.org
		req.UpdateMask.Paths = append(req.UpdateMask.Paths, "org_id")
	}
}

// onOff is a flag that takes on or off (or true/false).
type onOff bool

func (o *onOff) String() string {
	if o != nil && bool(*o) {
		return "on"
	}
	return "off"
}

func (o *onOff) Set(v string) error {
	switch v {
	case "on", "true", "yes", "1":
		*o = true
	case "off", "false", "no", "0":
		*o = false
	default:
		return errors.New("want on or off")
	}
	return nil
}

func accountsGrants(ctx context.Context, fs *flag.FlagSet, af *adminFlags, args []string, e env) error {
	ref, c, err := af.refClients(fs, args)
	if err != nil {
		return err
	}
	resp, err := c.accounts.ListResetGrants(ctx, connect.NewRequest(&weirv1.ListResetGrantsRequest{Id: ref}))
	if err != nil {
		return rpcError("list reset grants", err)
	}
	if af.json {
		return printJSON(e.stdout, resp.Msg)
	}
	printGrants(e.stdout, resp.Msg, time.Now())
	return nil
}

func accountsClaimGrant(ctx context.Context, fs *flag.FlagSet, af *adminFlags, args []string, e env) error {
	pos, err := parsePositional(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return errors.New("weir accounts claim-grant: want ID|LABEL and GRANT")
	}
	c, err := af.clients()
	if err != nil {
		return err
	}
	resp, err := c.accounts.ClaimResetGrant(ctx, connect.NewRequest(&weirv1.ClaimResetGrantRequest{Id: pos[0], GrantId: pos[1]}))
	if err != nil {
		return rpcError("claim reset grant", err)
	}
	if af.json {
		return printJSON(e.stdout, resp.Msg)
	}
	switch cl := resp.Msg.Claim; {
	case !resp.Msg.Sent:
		fmt.Fprintf(e.stdout, "not claimed: %s\n", resp.Msg.Reason)
	case cl == nil || cl.Status == "pending":
		fmt.Fprintf(e.stdout, "claim sent, no answer yet; it is replayed on the next tick\n")
	default:
		fmt.Fprintf(e.stdout, "grant %s: %s (%s)\n", cl.GrantId, cl.Result, cl.Status)
	}
	return nil
}

func printGrants(w io.Writer, r *weirv1.ListResetGrantsResponse, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GRANT\tPROGRAM\tSTATUS\tEXPIRES")
	for _, g := range r.Grants {
		exp := "never"
		if g.ExpiresAt != nil {
			exp = g.ExpiresAt.AsTime().Local().Format(time.DateTime) + " (" + until(g.ExpiresAt, now) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", g.GrantId, g.Program, g.Status, exp)
	}
	tw.Flush()
	if len(r.Claims) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CLAIMED\tGRANT\tSTATUS\tRESULT\tREQUEST")
	for _, c := range r.Claims {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.CreatedAt.AsTime().Local().Format(time.DateTime), c.GrantId, c.Status, c.Result, c.RequestId)
	}
	tw.Flush()
}
