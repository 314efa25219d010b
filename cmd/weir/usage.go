package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/usagetable"
)

// groupings is a repeatable --by flag (also comma-separated).
type groupings []string

func (g *groupings) String() string { return strings.Join(*g, ",") }

func (g *groupings) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*g = append(*g, s)
		}
	}
	return nil
}

func runUsage(ctx context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("weir usage", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	var af adminFlags
	af.register(fs, e)
	var by groupings
	fs.Var(&by, "by", "group by key, account, model, session, day or hour (repeatable, or comma-separated)")
	since := fs.String("since", "24h", "from: a duration ago (24h, 7d), a date (2026-12-01) or an RFC 3339 time")
	untilFlag := fs.String("until", "", "to (default now): the same forms as --since")
	key := fs.String("key", "", "only this key's usage (name or id)")
	tz := fs.String("tz", "", "the time zone days begin in for --by day (default UTC), e.g. Europe/Berlin")
	asCSV := fs.Bool("csv", false, "print CSV")
	cache := fs.Bool("cache", false, "the prompt cache per session: hit ratio, and each request that should have read the cache and did not, with the cause")
	session := fs.String("session", "", "with --cache: only this session")
	limit := fs.Int("limit", 1000, "at most this many rows")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	now := time.Now()
	req := &weirv1.QueryUsageRequest{GroupBy: by, Key: *key, TimeZone: *tz, Limit: int32(*limit)}
	from, err := parseWhen(*since, now)
	if err != nil {
		return fmt.Errorf("--since: %w", err)
	}
	req.Since = timestamppb.New(from)
	if *untilFlag != "" {
		to, err := parseWhen(*untilFlag, now)
		if err != nil {
			return fmt.Errorf("--until: %w", err)
		}
		req.Until = timestamppb.New(to)
	}
	c, err := af.clients()
	if err != nil {
		return err
	}
	if *cache {
		return printCache(ctx, c, e, af.json, &weirv1.ExplainCacheRequest{Key: *key, SessionKey: *session,
			Since: req.Since, Until: req.Until, Limit: int32(min(*limit, 1000))})
	}
	resp, err := c.usage.QueryUsage(ctx, connect.NewRequest(req))
	if err != nil {
		return rpcError("query usage", err)
	}
	loc := time.UTC
	if *tz != "" {
		if loc, err = time.LoadLocation(*tz); err != nil {
			return fmt.Errorf("--tz: %w", err)
		}
	}
	cols := usagetable.Columns(by)
	switch {
	case af.json:
		enc := json.NewEncoder(e.stdout)
		for _, r := range resp.Msg.Rows {
			obj := map[string]any{}
			for _, col := range cols {
				obj[col] = usagetable.Field(r, col, loc)
			}
			if err := enc.Encode(obj); err != nil {
				return err
			}
		}
		return nil
	case *asCSV:
		return usagetable.WriteCSV(e.stdout, by, resp.Msg.Rows, loc)
	}
	tw := table(e.stdout)
	head := make([]string, len(cols))
	for i, col := range cols {
		head[i] = strings.ToUpper(strings.ReplaceAll(strings.TrimSuffix(col, "_tokens"), "_", " "))
	}
	head = append(head, "CACHE HIT")
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, r := range resp.Msg.Rows {
		cells := make([]string, 0, len(cols)+1)
		for _, col := range cols {
			v := usagetable.Field(r, col, loc)
			switch x := v.(type) {
			case int64:
				v = humanCount(x)
			case float64:
				v = fmt.Sprintf("$%.2f", x)
			case string:
				if x == "" {
					v = "-"
				}
			}
			cells = append(cells, fmt.Sprint(v))
		}
		cells = append(cells, fmt.Sprintf("%.0f%%", r.CacheHitRatio*100))
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(resp.Msg.Rows) == 0 {
		fmt.Fprintln(e.stdout, "no usage in the range")
	}
	if resp.Msg.HasUnpriced {
		fmt.Fprintln(e.stdout, "\nSome models have no price (counted at $0): set one with 'weir prices set MODEL --input … --output …'.")
	}
	fmt.Fprintf(e.stdout, "Costs at API-equivalent list prices as of %s ('weir prices list').\n", resp.Msg.PricesAsOf)
	return nil
}

// humanCount renders a token count for a table: 1234567 as 1.23M.
func humanCount(n int64) string {
	switch {
	case n >= 1e9:
		return strconv.FormatFloat(float64(n)/1e9, 'f', 2, 64) + "B"
	case n >= 1e6:
		return strconv.FormatFloat(float64(n)/1e6, 'f', 2, 64) + "M"
	case n >= 1e4:
		return strconv.FormatFloat(float64(n)/1e3, 'f', 1, 64) + "k"
	}
	return strconv.FormatInt(n, 10)
}

// parseWhen reads a point in time: a duration before now ("90m", "24h",
// "7d"), a date (midnight UTC), or an RFC 3339 time.
func parseWhen(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n >= 0 {
			return now.Add(-time.Duration(n) * 24 * time.Hour), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, errors.New("a duration ago must not be negative")
		}
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%q is not a duration ago (24h, 7d), a date (2026-12-01) or an RFC 3339 time", s)
}

func runPrices(ctx context.Context, args []string, e env) error {
	if len(args) == 0 {
		args = []string{"list"}
	}
	fs := flag.NewFlagSet("weir prices "+args[0], flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	var af adminFlags
	af.register(fs, e)
	switch args[0] {
	case "list":
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		c, err := af.clients()
		if err != nil {
			return err
		}
		resp, err := c.usage.ListPrices(ctx, connect.NewRequest(&weirv1.ListPricesRequest{}))
		if err != nil {
			return rpcError("list prices", err)
		}
		if af.json {
			return printJSON(e.stdout, resp.Msg)
		}
		tw := table(e.stdout)
		fmt.Fprintln(tw, "MODEL\tINPUT\tOUTPUT\tCACHE READ\tCACHE WRITE\tSOURCE")
		for _, p := range resp.Msg.Prices {
			src := "weir " + resp.Msg.AsOf
			if !p.Shipped {
				src = "operator"
			}
			fmt.Fprintf(tw, "%s\t$%g\t$%g\t$%g\t$%g\t%s\n", p.Pattern, p.InputUsd, p.OutputUsd, p.CacheReadUsd, p.CacheWriteUsd, src)
		}
		fmt.Fprintln(tw, "(US dollars per million tokens)")
		return tw.Flush()
	case "set":
		in := fs.Float64("input", 0, "dollars per million input tokens")
		out := fs.Float64("output", 0, "dollars per million output tokens")
		read := fs.Float64("cache-read", -1, "dollars per million cache-read tokens (default a tenth of --input)")
		write := fs.Float64("cache-write", -1, "dollars per million cache-write tokens (default 1.25× --input)")
		ref, c, err := af.refClients(fs, args[1:])
		if err != nil {
			return err
		}
		if *read < 0 {
			*read = *in / 10
		}
		if *write < 0 {
			*write = *in * 1.25
		}
		resp, err := c.usage.SetPrice(ctx, connect.NewRequest(&weirv1.SetPriceRequest{Price: &weirv1.ModelPrice{
			Pattern: ref, InputUsd: *in, OutputUsd: *out, CacheReadUsd: *read, CacheWriteUsd: *write}}))
		if err != nil {
			return rpcError("set price", err)
		}
		if af.json {
			return printJSON(e.stdout, resp.Msg)
		}
		p := resp.Msg.Price
		fmt.Fprintf(e.stdout, "%s: $%g in, $%g out, $%g cache read, $%g cache write per million tokens, for usage from now on\n",
			p.Pattern, p.InputUsd, p.OutputUsd, p.CacheReadUsd, p.CacheWriteUsd)
		return nil
	case "rm":
		ref, c, err := af.refClients(fs, args[1:])
		if err != nil {
			return err
		}
		if _, err := c.usage.DeletePrice(ctx, connect.NewRequest(&weirv1.DeletePriceRequest{Pattern: ref})); err != nil {
			return rpcError("remove price", err)
		}
		fmt.Fprintf(e.stdout, "removed the price of %s\n", ref)
		return nil
	}
	return fmt.Errorf("unknown subcommand %q (list, set, rm)", args[0])
}

// printCache prints the prompt cache per session (UsageService.ExplainCache).
func printCache(ctx context.Context, c *clients, e env, asJSON bool, req *weirv1.ExplainCacheRequest) error {
	resp, err := c.usage.ExplainCache(ctx, connect.NewRequest(req))
	if err != nil {
		return rpcError("explain the prompt cache", err)
	}
	if asJSON {
		return printJSON(e.stdout, resp.Msg)
	}
	if len(resp.Msg.Sessions) == 0 {
		fmt.Fprintln(e.stdout, "no sessions in the range (a session is a Claude Code or Codex conversation weir saw)")
		return nil
	}
	now := time.Now()
	tw := table(e.stdout)
	fmt.Fprintln(tw, "SESSION\tKEY\tREQUESTS\tCACHE HIT\tMISSES\tMOVED\tEXPIRED\tPREFIX CHANGED\tLAST")
	for _, s := range resp.Msg.Sessions {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f%%\t%d\t%d\t%d\t%d\t%s\n", shortSession(s.SessionKey), orDash(usagetable.OrID(s.KeyName, s.KeyId)),
			s.Requests, s.CacheHitRatio*100, len(s.Misses), s.Causes["moved"], s.Causes["expired"], s.Causes["prefix_changed"], ago(s.LastAt, now))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range resp.Msg.Sessions {
		if len(s.Misses) == 0 {
			continue
		}
		fmt.Fprintf(e.stdout, "\n%s: %d misses\n", shortSession(s.SessionKey), len(s.Misses))
		for _, m := range s.Misses {
			fmt.Fprintf(e.stdout, "  %s  %s  %-14s %s (%s uncached)\n", ago(m.StartedAt, now), m.RequestId, m.Cause, m.Why,
				humanCount(m.UncachedInputTokens))
		}
	}
	return nil
}

// shortSession shortens a long session key for a table.
func shortSession(s string) string {
	if len(s) > 40 {
		return s[:37] + "..."
	}
	return s
}
