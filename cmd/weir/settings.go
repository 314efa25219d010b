package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/bytesize"
	"github.com/weirhq/weir/internal/quotamode"
)

const settingsUsage = `Usage:
  weir settings get                                            show the settings in effect
  weir settings set capacity_hold=5m [request_deadline=25m]    change them
  weir settings set egress_proxy URL                           (one setting may also be KEY VALUE)
  weir settings history [--limit N]                            who changed what, when (newest first)

  capacity_hold        how long a request may wait for capacity (0s to 6h; 0 fails fast)
  unreachable_hold     how long it may wait while every account that could serve it is unreachable
                       (refused, unresolved, failing TLS or timing out); then a 503 naming the cause
                       (0s to 6h, default 30s; capacity_hold caps it)
  request_deadline     a request's budget from arrival to first byte, holds included (1m to 6h)
  quota_response_mode  retryable (default): a pool out of quota answers the usual retryable error;
                       usage_limit: when every eligible account is blocked by quota and the first
                       reset is more than 5 minutes away (or none is known: out of credits), a final
                       usage limit with the reset time (429, X-Should-Retry: false), so that clients
                       pause instead of retrying
  metered_accounts     how metered accounts (API keys) are spent where a subscription (an OAuth
                       login) could serve (Messages, Responses): normal (default) ranks them with
                       the subscriptions; last_resort only when no subscription can serve; never
                       not at all. A key's own setting (weir keys update --metered) wins
  owned_accounts       how seats (OAuth subscriptions with an owner: weir accounts set L --owner
                       key:NAME|team:NAME) serve other keys: shared (default) serves anyone, their
                       owners first; owners_only serves their owners alone (a key owns what is
                       owned by it or by its team)
  body_buffer_bytes    the request-body bytes one worker buffers at once (reading, and kept while a
                       request may be retried or is held); past it a request gets a 503 with
                       Retry-After before its body is read (1MiB to 1TiB, default 1GiB)
  body_buffer_per_key_bytes
                       the same for one key's requests on one worker; past it a 429 (default 128MiB)
  route_events_retention
                       how long route events and refusal counts are kept (1h to 87600h, default 720h)
  usage_retention      how long the hourly usage rollup (tokens, cost) is kept (24h to 87600h,
                       default 9600h: 400 days)
  budget_time_zone     the IANA time zone budgets' days, weeks (from Monday) and months begin in
                       (default UTC), e.g. Europe/Berlin
  pool_low_accounts    notifications: a pool of more than this many accounts is low (pool_low) when
                       1 to this many of them can serve now (0 to 100, default 1; 0 never reports low)
  breaker_notify_after notifications: how long an overload breaker stays open before breaker_open_long
                       (0s to 24h, default 5m)
  egress_proxy         the egress proxy of every account that names none of its own (weir accounts
                       set L --proxy; an account set to direct bypasses it): http://, https://,
                       socks5:// or socks5h://[user:pass@]host:port, or "" for none. Inference,
                       usage reads, token refreshes and profile reads go through it. Sealed like a
                       credential; shown as scheme://host:port

Data planes pick changes up without restart. Every command takes --json,
--controlplane and --data-dir.
`

// settingKeys are the names `weir settings set` accepts, as the API's
// update_mask spells them.
var settingKeys = []string{"capacity_hold", "unreachable_hold", "request_deadline", "quota_response_mode", "metered_accounts",
	"body_buffer_bytes", "body_buffer_per_key_bytes", "route_events_retention", "usage_retention", "budget_time_zone",
	"pool_low_accounts", "breaker_notify_after", "egress_proxy", "owned_accounts"}

func runSettings(ctx context.Context, args []string, e env) error {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, settingsUsage)
		return errUsageShown
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("weir settings "+sub, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	var af adminFlags
	af.register(fs, e)
	switch sub {
	case "get":
		pos, err := parsePositional(fs, args)
		if err != nil {
			return err
		}
		if len(pos) > 0 {
			return fmt.Errorf("weir settings get: unexpected argument %q", pos[0])
		}
		c, err := af.clients()
		if err != nil {
			return err
		}
		resp, err := c.settings.GetSettings(ctx, connect.NewRequest(&weirv1.GetSettingsRequest{}))
		if err != nil {
			return rpcError("get settings", err)
		}
		if af.json {
			return printJSON(e.stdout, resp.Msg)
		}
		return printSettings(e.stdout, resp.Msg.Settings)
	case "set":
		pos, err := parsePositional(fs, args)
		if err != nil {
			return err
		}
		req, err := settingsUpdate(pos)
		if err != nil {
			return fmt.Errorf("weir settings set: %w", err)
		}
		c, err := af.clients()
		if err != nil {
			return err
		}
		resp, err := c.settings.UpdateSettings(ctx, connect.NewRequest(req))
		if err != nil {
			return rpcError("update settings", err)
		}
		if af.json {
			return printJSON(e.stdout, resp.Msg)
		}
		return printSettings(e.stdout, resp.Msg.Settings)
	case "history":
		limit := fs.Int("limit", 50, "how many changes to show (at most 500)")
		pos, err := parsePositional(fs, args)
		if err != nil {
			return err
		}
		if len(pos) > 0 {
			return fmt.Errorf("weir settings history: unexpected argument %q", pos[0])
		}
		c, err := af.clients()
		if err != nil {
			return err
		}
		resp, err := c.settings.ListSettingChanges(ctx, connect.NewRequest(&weirv1.ListSettingChangesRequest{Limit: int32(*limit)}))
		if err != nil {
			return rpcError("list setting changes", err)
		}
		if af.json {
			return printJSON(e.stdout, resp.Msg)
		}
		tw := table(e.stdout)
		fmt.Fprintln(tw, "WHEN\tSETTING\tFROM\tTO\tBY")
		for _, ch := range resp.Msg.Changes {
			from := ch.OldValue
			if from == "" {
				from = "(default)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", ch.ChangedAt.AsTime().Local().Format(time.DateTime), ch.Name, from, ch.NewValue, ch.Actor)
		}
		return tw.Flush()
	}
	fmt.Fprintf(e.stderr, "weir settings: unknown subcommand %q\n\n%s", sub, settingsUsage)
	return errUsageShown
}

// settingsUpdate turns key=value arguments into an update naming exactly
// those fields. Ranges are the control plane's to check, so the rules live
// in one place.
func settingsUpdate(pairs []string) (*weirv1.UpdateSettingsRequest, error) {
	if len(pairs) == 0 {
		return nil, fmt.Errorf("name at least one KEY=VALUE (keys: %s)", strings.Join(settingKeys, ", "))
	}
	if len(pairs) == 2 && !strings.Contains(pairs[0], "=") && slices.Contains(settingKeys, pairs[0]) {
		// One setting as KEY VALUE: a URL reads better apart.
		pairs = []string{pairs[0] + "=" + pairs[1]}
	}
	req := &weirv1.UpdateSettingsRequest{Settings: &weirv1.Settings{}, UpdateMask: fieldMask()}
	seen := map[string]bool{}
	for _, p := range pairs {
		key, value, ok := strings.Cut(p, "=")
		if !ok {
			return nil, fmt.Errorf("want KEY=VALUE, got %q (keys: %s)", p, strings.Join(settingKeys, ", "))
		}
		if seen[key] {
			return nil, fmt.Errorf("%s: given more than once", key)
		}
		seen[key] = true
		var dst **durationpb.Duration
		switch key {
		case "capacity_hold":
			dst = &req.Settings.CapacityHold
		case "unreachable_hold":
			dst = &req.Settings.UnreachableHold
		case "request_deadline":
			dst = &req.Settings.RequestDeadline
		case "route_events_retention":
			dst = &req.Settings.RouteEventsRetention
		case "usage_retention":
			dst = &req.Settings.UsageRetention
		case "budget_time_zone":
			req.Settings.BudgetTimeZone = value
		case "breaker_notify_after":
			dst = &req.Settings.BreakerNotifyAfter
		case "pool_low_accounts":
			n, err := strconv.ParseInt(value, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("pool_low_accounts: %q is not a whole number", value)
			}
			req.Settings.PoolLowAccounts = int32(n)
		case "quota_response_mode":
			m, ok := quotamode.Parse(value)
			if !ok {
				return nil, fmt.Errorf("quota_response_mode: %q is not a mode (retryable or usage_limit)", value)
			}
			req.Settings.QuotaResponseMode = m
		case "metered_accounts":
			m, ok := parseMetered(value)
			if !ok || m == weirv1.MeteredAccounts_METERED_ACCOUNTS_UNSPECIFIED {
				return nil, fmt.Errorf("metered_accounts: %q is not a mode (normal, last_resort or never)", value)
			}
			req.Settings.MeteredAccounts = m
		case "owned_accounts":
			v, ok := weirv1.OwnedAccounts_value["OWNED_ACCOUNTS_"+strings.ToUpper(value)]
			if !ok || v == 0 || value != strings.ToLower(value) {
				return nil, fmt.Errorf("owned_accounts: %q is not a mode (shared or owners_only)", value)
			}
			req.Settings.OwnedAccounts = weirv1.OwnedAccounts(v)
		case "egress_proxy":
			// The control plane checks it (and never quotes it back).
			req.Settings.EgressProxy = value
		case "body_buffer_bytes", "body_buffer_per_key_bytes":
			n, err := bytesize.Parse(value)
			if err != nil {
				return nil, fmt.Errorf("%s: %q is %v", key, value, err)
			}
			if key == "body_buffer_bytes" {
				req.Settings.BodyBufferBytes = n
			} else {
				req.Settings.BodyBufferPerKeyBytes = n
			}
		default:
			return nil, fmt.Errorf("unknown setting %q (valid keys: %s)", key, strings.Join(settingKeys, ", "))
		}
		if dst != nil {
			d, err := time.ParseDuration(value)
			if err != nil {
				return nil, fmt.Errorf("%s: %q is not a duration (like 0, 90s, 20m or 1h30m)", key, value)
			}
			*dst = durationpb.New(d)
		}
		req.UpdateMask.Paths = append(req.UpdateMask.Paths, key)
	}
	return req, nil
}

func printSettings(w io.Writer, st *weirv1.Settings) error {
	hold := st.GetCapacityHold().AsDuration()
	note := ""
	if hold == 0 {
		note = "  (no holding: requests fail fast when no account can serve)"
	}
	tw := table(w)
	fmt.Fprintf(tw, "capacity_hold\t%s%s\n", shortDuration(hold), note)
	fmt.Fprintf(tw, "unreachable_hold\t%s\n", shortDuration(st.GetUnreachableHold().AsDuration()))
	fmt.Fprintf(tw, "request_deadline\t%s\n", shortDuration(st.GetRequestDeadline().AsDuration()))
	mode := "retryable"
	if st.GetQuotaResponseMode() == weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT {
		mode = "usage_limit  (a pool out of quota answers a final usage limit with its reset)"
	}
	fmt.Fprintf(tw, "quota_response_mode\t%s\n", mode)
	fmt.Fprintf(tw, "metered_accounts\t%s\n", meteredName(st.GetMeteredAccounts()))
	switch st.GetOwnedAccounts() {
	case weirv1.OwnedAccounts_OWNED_ACCOUNTS_OWNERS_ONLY:
		fmt.Fprintf(tw, "owned_accounts\towners_only  (seats serve their owners alone)\n")
	case weirv1.OwnedAccounts_OWNED_ACCOUNTS_SHARED:
		fmt.Fprintf(tw, "owned_accounts\tshared\n")
	}
	fmt.Fprintf(tw, "body_buffer_bytes\t%s\n", bytesize.Format(st.GetBodyBufferBytes()))
	fmt.Fprintf(tw, "body_buffer_per_key_bytes\t%s\n", bytesize.Format(st.GetBodyBufferPerKeyBytes()))
	if r := st.GetRouteEventsRetention(); r != nil { // nil: a control plane older than the setting
		fmt.Fprintf(tw, "route_events_retention\t%s\n", shortDuration(r.AsDuration()))
	}
	if r := st.GetUsageRetention(); r != nil {
		fmt.Fprintf(tw, "usage_retention\t%s\n", shortDuration(r.AsDuration()))
	}
	if tz := st.GetBudgetTimeZone(); tz != "" {
		fmt.Fprintf(tw, "budget_time_zone\t%s\n", tz)
	}
	if b := st.GetBreakerNotifyAfter(); b != nil { // nil: a control plane older than the notifications
		low := strconv.Itoa(int(st.GetPoolLowAccounts()))
		if st.GetPoolLowAccounts() == 0 {
			low += "  (pool_low is never raised)"
		}
		fmt.Fprintf(tw, "pool_low_accounts\t%s\n", low)
		fmt.Fprintf(tw, "breaker_notify_after\t%s\n", shortDuration(b.AsDuration()))
	}
	proxy := st.GetEgressProxy()
	if proxy == "" {
		proxy = "none (accounts without a proxy of their own go direct)"
	}
	fmt.Fprintf(tw, "egress_proxy\t%s\n", proxy)
	return tw.Flush()
}

// parseMetered reads a metered_accounts mode by its name; "default" is
// UNSPECIFIED (a key then follows the global setting).
func parseMetered(name string) (weirv1.MeteredAccounts, bool) {
	if name == "default" {
		return weirv1.MeteredAccounts_METERED_ACCOUNTS_UNSPECIFIED, true
	}
	v, ok := weirv1.MeteredAccounts_value["METERED_ACCOUNTS_"+strings.ToUpper(name)]
	return weirv1.MeteredAccounts(v), ok && v != 0 && name == strings.ToLower(name)
}

// meteredName is a mode's name; "default" for UNSPECIFIED.
func meteredName(m weirv1.MeteredAccounts) string {
	if m == weirv1.MeteredAccounts_METERED_ACCOUNTS_UNSPECIFIED {
		return "default"
	}
	return shortEnum(m.String(), "METERED_ACCOUNTS_")
}

// shortDuration renders 20m0s as 20m and 1h0m0s as 1h.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
