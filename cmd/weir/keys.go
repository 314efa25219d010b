package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

const keysUsage = `Usage:
  weir keys create NAME     create a client key (its secret is shown once)
  weir keys list [--all]    list keys (--all includes revoked ones)
  weir keys revoke ID|NAME  revoke a key
Every command takes --json, --controlplane and --data-dir.
`

func runKeys(ctx context.Context, args []string, e env) error {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, keysUsage)
		return errUsageShown
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("weir keys "+sub, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	var af adminFlags
	af.register(fs, e)
	switch sub {
	case "create":
		name, c, err := af.refClients(fs, args)
		if err != nil {
			return err
		}
		resp, err := c.keys.CreateKey(ctx, connect.NewRequest(&weirv1.CreateKeyRequest{Name: name}))
		if err != nil {
			return rpcError("create key", err)
		}
		if af.json {
			return printJSON(e.stdout, resp.Msg)
		}
		fmt.Fprintf(e.stdout, "created key %s (%s)\n\n  %s\n\nThis secret is shown once; store it now.\n", resp.Msg.Key.Name, resp.Msg.Key.Id, resp.Msg.Secret)
		return nil
	case "list", "ls":
		all := fs.Bool("all", false, "include revoked keys")
		if err := fs.Parse(args); err != nil {
			return err
		}
		c, err := af.clients()
		if err != nil {
			return err
		}
		resp, err := c.keys.ListKeys(ctx, connect.NewRequest(&weirv1.ListKeysRequest{IncludeRevoked: *all}))
		if err != nil {
			return rpcError("list keys", err)
		}
		if af.json {
			return printJSON(e.stdout, resp.Msg)
		}
		printKeys(e.stdout, resp.Msg.Keys, time.Now())
		return nil
	case "revoke":
		ref, c, err := af.refClients(fs, args)
		if err != nil {
			return err
		}
		resp, err := c.keys.RevokeKey(ctx, connect.NewRequest(&weirv1.RevokeKeyRequest{Id: ref}))
		if err != nil {
			return rpcError("revoke key", err)
		}
		if af.json {
			return printJSON(e.stdout, resp.Msg.Key)
		}
		printKeys(e.stdout, []*weirv1.Key{resp.Msg.Key}, time.Now())
		return nil
	}
	fmt.Fprintf(e.stderr, "weir keys: unknown subcommand %q\n\n%s", sub, keysUsage)
	return errUsageShown
}

func printKeys(w io.Writer, keys []*weirv1.Key, now time.Time) {
	tw := table(w)
	fmt.Fprintln(tw, "NAME\tPREFIX\tCREATED\tLAST USED\tREVOKED\tID")
	for _, k := range keys {
		revoked := "-"
		if k.RevokedAt != nil {
			revoked = ago(k.RevokedAt, now)
		}
		fmt.Fprintf(tw, "%s\t%s…\t%s\t%s\t%s\t%s\n", k.Name, k.Prefix, ago(k.CreatedAt, now), ago(k.LastUsedAt, now), revoked, k.Id)
	}
	tw.Flush()
}
