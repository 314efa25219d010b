package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

const keysUsage = `Usage:
  weir keys create NAME [restrictions]    create a client key (its secret is shown once)
  weir keys update ID|NAME restrictions   change a key's restrictions
  weir keys list [--all]                  list keys (--all includes revoked ones)
  weir keys revoke ID|NAME                revoke a key
Restrictions (each optional):
  --models LIST       model names or prefixes ending in *, comma-separated
                      (claude-sonnet-*,gpt-5*); "any" lifts the restriction
  --accounts LIST     account ids or labels the key may use, comma-separated;
                      "any" lifts the restriction
  --rate-limit N/m    requests per minute across every worker (60/m);
                      "none" lifts the limit
  --metered MODE      how the key spends metered accounts (API keys) where a
                      subscription could serve: normal, last_resort or never;
                      "default" follows the global metered_accounts setting
  --team NAME         the key's team (its budgets apply too); "" for none
  --budget AMOUNT/PERIOD
                      a budget of the key's own: 5usd/day, $100/month,
                      2000000tok/week (repeatable; update replaces them all;
                      "none" removes them). Over it, the key's requests get a
                      final 429 naming the budget and its reset
  --session-budget AMOUNT
                      a cap on each of the key's agent sessions (1usd, 500ktok)
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
		var lf keyLimitFlags
		lf.register(fs)
		var bf budgetFlags
		bf.register(fs)
		team := fs.String("team", "", "the key's team")
		name, err := parseWithRef(fs, args)
		if err != nil {
			return err
		}
		req := &weirv1.CreateKeyRequest{Name: name, Team: *team}
		if err := lf.apply(fs, &req.AllowedModels, &req.PinnedAccounts, &req.RateLimitPerMinute, &req.MeteredAccounts, nil); err != nil {
			return err
		}
		if req.Budgets, err = bf.limits(); err != nil {
			return err
		}
		c, err := af.clients()
		if err != nil {
			return err
		}
		resp, err := c.keys.CreateKey(ctx, connect.NewRequest(req))
		if err != nil {
			return rpcError("create key", err)
		}
		if af.json {
			return printJSON(e.stdout, resp.Msg)
		}
		fmt.Fprintf(e.stdout, "created key %s (%s)\n\n  %s\n\nThis secret is shown once; store it now.\n", resp.Msg.Key.Name, resp.Msg.Key.Id, resp.Msg.Secret)
		if r := keyRestrictions(resp.Msg.Key); r != "" {
			fmt.Fprintf(e.stdout, "Restricted to %s.\n", r)
		}
		if len(resp.Msg.Key.Budgets) > 0 {
			fmt.Fprintf(e.stdout, "Budgets: %s.\n", budgetsText(resp.Msg.Key.Budgets))
		}
		return nil
	case "update", "set":
		var lf keyLimitFlags
		lf.register(fs)
		var bf budgetFlags
		bf.register(fs)
		team := fs.String("team", "", "the key's team (\"\" for none)")
		ref, err := parseWithRef(fs, args)
		if err != nil {
			return err
		}
		req := &weirv1.UpdateKeyRequest{Id: ref, UpdateMask: &fieldmaskpb.FieldMask{}}
		if err := lf.apply(fs, &req.AllowedModels, &req.PinnedAccounts, &req.RateLimitPerMinute, &req.MeteredAccounts, &req.UpdateMask.Paths); err != nil {
			return err
		}
		fs.Visit(func(fl *flag.Flag) {
			if fl.Name == "team" {
				req.Team = *team
				addPath(&req.UpdateMask.Paths, "team")
			}
		})
		if bf.given {
			if req.Budgets, err = bf.limits(); err != nil {
				return err
			}
			addPath(&req.UpdateMask.Paths, "budgets")
		}
		if len(req.UpdateMask.Paths) == 0 {
			return errors.New("weir keys update: name something to change (--models, --accounts, --rate-limit, --metered, --team, --budget, --session-budget)")
		}
		c, err := af.clients()
		if err != nil {
			return err
		}
		resp, err := c.keys.UpdateKey(ctx, connect.NewRequest(req))
		if err != nil {
			return rpcError("update key", err)
		}
		if af.json {
			return printJSON(e.stdout, resp.Msg.Key)
		}
		printKeys(e.stdout, []*weirv1.Key{resp.Msg.Key}, time.Now())
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

// keyLimitFlags are the restriction flags of create and update.
type keyLimitFlags struct {
	models, accounts, rate, metered string
}

func (f *keyLimitFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.models, "models", "", `allowed models, comma-separated (claude-sonnet-*,gpt-5*); "any" lifts it`)
	fs.StringVar(&f.accounts, "accounts", "", `account ids or labels the key may use, comma-separated; "any" lifts it`)
	fs.StringVar(&f.rate, "rate-limit", "", `requests per minute across every worker, as N/m; "none" lifts it`)
	fs.StringVar(&f.metered, "metered", "", `metered accounts where a subscription could serve: normal, last_resort or never; "default" follows the global setting`)
}

// apply fills a request from the flags given; paths, when not nil, gets
// the update mask's path of each.
func (f *keyLimitFlags) apply(fs *flag.FlagSet, models, accounts *[]string, rate *int32, metered *weirv1.MeteredAccounts, paths *[]string) error {
	var err error
	fs.Visit(func(fl *flag.Flag) {
		if err != nil {
			return
		}
		switch fl.Name {
		case "models":
			*models = splitList(f.models, "any")
			addPath(paths, "allowed_models")
		case "accounts":
			*accounts = splitList(f.accounts, "any")
			addPath(paths, "pinned_accounts")
		case "rate-limit":
			*rate, err = parseRate(f.rate)
			addPath(paths, "rate_limit_per_minute")
		case "metered":
			var ok bool
			if *metered, ok = parseMetered(strings.TrimSpace(f.metered)); !ok {
				err = fmt.Errorf("--metered %q: want normal, last_resort, never or default", f.metered)
			}
			addPath(paths, "metered_accounts")
		}
	})
	return err
}

func addPath(paths *[]string, p string) {
	if paths != nil {
		*paths = append(*paths, p)
	}
}

// splitList reads a comma-separated list; empty or lift (any) is none.
func splitList(s, lift string) []string {
	s = strings.TrimSpace(s)
	if s == "" || s == lift {
		return nil
	}
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// parseRate reads N/m (or N/min) as requests per minute; "none" is no
// limit (0).
func parseRate(s string) (int32, error) {
	s = strings.TrimSpace(s)
	if s == "none" || s == "" {
		return 0, nil
	}
	num, unit, ok := strings.Cut(s, "/")
	if !ok || (unit != "m" && unit != "min") {
		return 0, fmt.Errorf("--rate-limit %q: want requests per minute as N/m (e.g. 60/m), or none", s)
	}
	n, err := strconv.ParseInt(num, 10, 32)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("--rate-limit %q: the number of requests must be a whole number of at least 1", s)
	}
	return int32(n), nil
}

// keyRestrictions is one line of what restricts k; "" when nothing does.
func keyRestrictions(k *weirv1.Key) string {
	var parts []string
	if len(k.AllowedModels) > 0 {
		parts = append(parts, "models "+keyModels(k))
	}
	if k.Pinned {
		parts = append(parts, "accounts "+keyAccounts(k))
	}
	if k.RateLimitPerMinute > 0 {
		parts = append(parts, keyRate(k)+" requests")
	}
	if k.MeteredAccounts != weirv1.MeteredAccounts_METERED_ACCOUNTS_UNSPECIFIED {
		parts = append(parts, "metered accounts "+meteredName(k.MeteredAccounts))
	}
	return strings.Join(parts, ", ")
}

func keyModels(k *weirv1.Key) string {
	if len(k.AllowedModels) == 0 {
		return "any"
	}
	return strings.Join(k.AllowedModels, ",")
}

func keyAccounts(k *weirv1.Key) string {
	if !k.Pinned {
		return "any"
	}
	if len(k.PinnedAccounts) == 0 {
		return "none (pinned accounts deleted)"
	}
	labels := make([]string, 0, len(k.PinnedAccounts))
	for _, a := range k.PinnedAccounts {
		labels = append(labels, a.Label)
	}
	return strings.Join(labels, ",")
}

func keyRate(k *weirv1.Key) string {
	if k.RateLimitPerMinute == 0 {
		return "-"
	}
	return strconv.Itoa(int(k.RateLimitPerMinute)) + "/m"
}

func printKeys(w io.Writer, keys []*weirv1.Key, now time.Time) {
	tw := table(w)
	fmt.Fprintln(tw, "NAME\tPREFIX\tTEAM\tMODELS\tACCOUNTS\tRATE\tMETERED\tBUDGETS\tCREATED\tLAST USED\tREVOKED\tID")
	for _, k := range keys {
		revoked := "-"
		if k.RevokedAt != nil {
			revoked = ago(k.RevokedAt, now)
		}
		fmt.Fprintf(tw, "%s\t%s…\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.Name, k.Prefix, orDash(k.Team), keyModels(k), keyAccounts(k), keyRate(k),
			meteredName(k.MeteredAccounts), budgetsText(k.Budgets), ago(k.CreatedAt, now), ago(k.LastUsedAt, now), revoked, k.Id)
	}
	tw.Flush()
}
