package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

const aliasesUsage = `Usage:
  weir aliases list                      show the model aliases
  weir aliases set ALIAS MODEL[,MODEL...] [--translate] [--key KEY]
                                         create or replace an alias
  weir aliases rm ALIAS [--key KEY]      delete an alias

A request naming ALIAS is served on the first MODEL with an eligible
account, in the order given; the upstream sees that model. A concrete model
id is never changed. A MODEL of the other wire's provider (a GPT model for
Claude Code, a Claude model for Codex) is served only with --translate:
weir then translates the request and its answer between the Anthropic and
OpenAI wires (docs/translation.md), and refuses by name what the other
wire cannot carry. With --key (a key's id or name) the alias is that key's
own: its requests take it before the global alias of the same name. Every
command takes --json, --controlplane and --data-dir.
`

func runAliases(ctx context.Context, args []string, e env) error {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, aliasesUsage)
		return errUsageShown
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("weir aliases "+sub, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	var af adminFlags
	af.register(fs, e)
	translate := fs.Bool("translate", false, "set: serve targets of the other wire's provider through translation")
	key := fs.String("key", "", "set, rm: the key (id or name) whose own alias it is; empty: the global alias")
	var want int
	switch sub {
	case "list", "ls":
		want = 0
	case "set":
		want = 2
	case "rm", "delete":
		want = 1
	default:
		fmt.Fprintf(e.stderr, "weir aliases: unknown subcommand %q\n\n%s", sub, aliasesUsage)
		return errUsageShown
	}
	pos, err := parsePositional(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != want {
		fmt.Fprintf(e.stderr, "weir aliases %s: want %d argument(s), got %d\n\n%s", sub, want, len(pos), aliasesUsage)
		return errUsageShown
	}
	c, err := af.clients()
	if err != nil {
		return err
	}
	switch sub {
	case "set":
		targets := splitModels(pos[1])
		resp, err := c.aliases.SetAlias(ctx, connect.NewRequest(&weirv1.SetAliasRequest{Alias: pos[0], Targets: targets, Translate: *translate, Key: *key}))
		if err != nil {
			return rpcError("set alias", err)
		}
		if af.json {
			return printJSON(e.stdout, resp.Msg)
		}
		printAliases(e.stdout, []*weirv1.Alias{resp.Msg.Alias})
		return nil
	case "rm", "delete":
		if _, err := c.aliases.DeleteAlias(ctx, connect.NewRequest(&weirv1.DeleteAliasRequest{Alias: pos[0], Key: *key})); err != nil {
			return rpcError("delete alias", err)
		}
		if af.json {
			return printJSON(e.stdout, &weirv1.DeleteAliasResponse{})
		}
		fmt.Fprintf(e.stdout, "deleted %s\n", pos[0])
		return nil
	}
	resp, err := c.aliases.ListAliases(ctx, connect.NewRequest(&weirv1.ListAliasesRequest{}))
	if err != nil {
		return rpcError("list aliases", err)
	}
	if af.json {
		return printJSON(e.stdout, resp.Msg)
	}
	printAliases(e.stdout, resp.Msg.Aliases)
	return nil
}

// splitModels splits "a,b, c" into its model ids; empty pieces are the
// control plane's to refuse.
func splitModels(s string) []string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return parts
}

func printAliases(w io.Writer, as []*weirv1.Alias) {
	tw := table(w)
	fmt.Fprintln(tw, "ALIAS\tKEY\tMODELS (in order)\tTRANSLATE")
	for _, a := range as {
		tr := "no"
		if a.Translate {
			tr = "yes"
		}
		key := "(every key)"
		if a.KeyId != "" {
			key = a.KeyName
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", a.Alias, key, strings.Join(a.Targets, ", "), tr)
	}
	tw.Flush()
}
