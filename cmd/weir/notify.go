package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

const notifyUsage = `Usage:
  weir notify add NAME --url URL [--slack] [--events a,b] [--secret S]
                                   add a target: a signed JSON webhook, or a Slack-compatible
                                   incoming webhook (--slack); a webhook's signing secret is
                                   generated unless given, and shown once
  weir notify list [--limit N]     the targets, and the latest deliveries with their status
  weir notify test NAME [--wait D] send a test event to NAME and print how its delivery went
  weir notify remove NAME          remove a target and its deliveries

  --url and --secret take "-" to read the value from standard input (a
  Slack URL holds its secret: keep it out of shell history). Events (default
  every kind): account_broken, account_recovered, pool_exhausted, pool_low,
  pool_restored, breaker_open_long, breaker_closed, budget_threshold,
  session_cap. The thresholds are settings: weir settings set
  pool_low_accounts=1 breaker_notify_after=5m. docs/notifications.md has the
  payloads and how to verify a signature.

Every command takes --json, --controlplane and --data-dir.
`

func runNotify(ctx context.Context, args []string, e env) error { //nolint:gocognit // a switch over its subcommands, each a few lines of its own
	if len(args) == 0 {
		fmt.Fprint(e.stderr, notifyUsage)
		return errUsageShown
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("weir notify "+sub, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	var af adminFlags
	af.register(fs, e)
	switch sub {
	case "add":
		url := fs.String("url", "", `where to post: an http or https URL ("-" reads it from standard input)`)
		slack := fs.Bool("slack", false, `a Slack-compatible incoming webhook: {"text": ...}, not signed`)
		events := fs.String("events", "", "event kinds, comma-separated (default every kind)")
		secret := fs.String("secret", "", `a webhook's signing secret, at least 16 characters ("-" reads it from standard input; default: generated and shown once)`)
		name, err := parseWithRef(fs, args)
		if err != nil {
			return err
		}
		stdin := bufio.NewReader(e.stdin)
		if *url == "-" && *secret == "-" {
			return errors.New("weir notify add: only one of --url and --secret can read standard input")
		}
		for _, v := range []*string{url, secret} {
			if *v == "-" {
				if *v, err = readLine(stdin); err != nil {
					return fmt.Errorf("weir notify add: read standard input: %w", err)
				}
			}
		}
		if *url == "" {
			return errors.New("weir notify add: --url is required")
		}
		req := &weirv1.CreateTargetRequest{Name: name, Url: *url, Secret: *secret, Events: splitList(*events, "all"),
			Kind: weirv1.NotifyTargetKind_NOTIFY_TARGET_KIND_WEBHOOK}
		if *slack {
			req.Kind = weirv1.NotifyTargetKind_NOTIFY_TARGET_KIND_SLACK
		}
		c, err := af.clients()
		if err != nil {
			return err
		}
		resp, err := c.notify.CreateTarget(ctx, connect.NewRequest(req))
		if err != nil {
			return rpcError("add notification target", err)
		}
		if af.json {
			return printJSON(e.stdout, resp.Msg)
		}
		t := resp.Msg.Target
		fmt.Fprintf(e.stdout, "added %s target %s (%s), %s\n", targetKind(t.Kind), t.Name, t.UrlHint, eventList(t.Events))
		if resp.Msg.Secret != "" {
			fmt.Fprintf(e.stdout, "\nSigning secret (Weir-Signature, HMAC-SHA256):\n\n  %s\n\nThis secret is shown once; store it with the receiver now.\n", resp.Msg.Secret)
		}
		return nil
	case "list", "ls":
		limit := fs.Int("limit", 20, "how many deliveries to show (at most 500)")
		pos, err := parsePositional(fs, args)
		if err != nil {
			return err
		}
		if len(pos) > 0 {
			return fmt.Errorf("weir notify list: unexpected argument %q", pos[0])
		}
		c, err := af.clients()
		if err != nil {
			return err
		}
		targets, err := c.notify.ListTargets(ctx, connect.NewRequest(&weirv1.ListTargetsRequest{}))
		if err != nil {
			return rpcError("list notification targets", err)
		}
		deliveries, err := c.notify.ListDeliveries(ctx, connect.NewRequest(&weirv1.ListDeliveriesRequest{Limit: int32(*limit)}))
		if err != nil {
			return rpcError("list deliveries", err)
		}
		if af.json {
			return printMerged(e.stdout, targets.Msg, deliveries.Msg)
		}
		printNotify(e.stdout, targets.Msg.Targets, deliveries.Msg.Deliveries, time.Now())
		return nil
	case "test":
		wait := fs.Duration("wait", 10*time.Second, "how long to wait for the first attempt's outcome")
		ref, c, err := af.refClients(fs, args)
		if err != nil {
			return err
		}
		resp, err := c.notify.SendTest(ctx, connect.NewRequest(&weirv1.SendTestRequest{Id: ref}))
		if err != nil {
			return rpcError("send a test notification", err)
		}
		d, err := awaitDelivery(ctx, c, resp.Msg.Delivery, *wait)
		if err != nil {
			return err
		}
		if af.json {
			if err := printJSON(e.stdout, d); err != nil {
				return err
			}
		}
		switch {
		case d.Status == weirv1.NotifyDeliveryStatus_NOTIFY_DELIVERY_STATUS_DELIVERED:
			if !af.json {
				fmt.Fprintf(e.stdout, "delivered to %s (attempt %d)\n", d.TargetName, d.Attempts)
			}
			return nil
		case d.Attempts == 0:
			return fmt.Errorf("the test notification to %s was not attempted within %v: is a control plane running its jobs?", d.TargetName, *wait)
		}
		return fmt.Errorf("the test notification to %s failed (attempt %d): %s; weir retries it (weir notify list shows how it goes)",
			d.TargetName, d.Attempts, d.LastError)
	case "remove", "rm":
		ref, c, err := af.refClients(fs, args)
		if err != nil {
			return err
		}
		if _, err := c.notify.DeleteTarget(ctx, connect.NewRequest(&weirv1.DeleteTargetRequest{Id: ref})); err != nil {
			return rpcError("remove notification target", err)
		}
		if af.json {
			return printJSON(e.stdout, &weirv1.DeleteTargetResponse{})
		}
		fmt.Fprintf(e.stdout, "removed %s\n", ref)
		return nil
	}
	fmt.Fprintf(e.stderr, "weir notify: unknown subcommand %q\n\n%s", sub, notifyUsage)
	return errUsageShown
}

// readLine reads one line, without its end.
func readLine(r *bufio.Reader) (string, error) {
	s, err := r.ReadString('\n')
	if err != nil && (!errors.Is(err, io.EOF) || s == "") {
		return "", err
	}
	return strings.TrimRight(s, "\r\n"), nil
}

// awaitDelivery asks for d until its first attempt ended or wait passed.
func awaitDelivery(ctx context.Context, c *clients, d *weirv1.NotifyDelivery, wait time.Duration) (*weirv1.NotifyDelivery, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for d.Attempts == 0 && d.Status == weirv1.NotifyDeliveryStatus_NOTIFY_DELIVERY_STATUS_PENDING {
		select {
		case <-ctx.Done():
			return d, nil
		case <-tick.C:
		}
		resp, err := c.notify.ListDeliveries(ctx, connect.NewRequest(&weirv1.ListDeliveriesRequest{DeliveryId: d.Id, Limit: 1}))
		if ctx.Err() != nil {
			return d, nil
		}
		if err != nil {
			return nil, rpcError("read the test delivery", err)
		}
		if len(resp.Msg.Deliveries) != 1 {
			return nil, errors.New("the test delivery is gone (its target was removed)")
		}
		d = resp.Msg.Deliveries[0]
	}
	return d, nil
}

func printNotify(w io.Writer, targets []*weirv1.NotifyTarget, deliveries []*weirv1.NotifyDelivery, now time.Time) {
	if len(targets) == 0 {
		fmt.Fprintln(w, "No notification targets (weir notify add NAME --url URL).")
	} else {
		tw := table(w)
		fmt.Fprintln(tw, "NAME\tKIND\tURL\tEVENTS\tCREATED")
		for _, t := range targets {
			events := strings.Join(t.Events, ",")
			if events == "" {
				events = "all"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Name, targetKind(t.Kind), t.UrlHint, events, ago(t.CreatedAt, now))
		}
		tw.Flush()
	}
	if len(deliveries) == 0 {
		fmt.Fprintln(w, "\nNo deliveries yet.")
		return
	}
	fmt.Fprintln(w, "\nLatest deliveries:")
	tw := table(w)
	fmt.Fprintln(tw, "WHEN\tTARGET\tEVENT\tSTATUS\tATTEMPTS\tLAST ERROR\tTEXT")
	for _, d := range deliveries {
		lastErr := d.LastError
		if lastErr == "" {
			lastErr = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", ago(d.CreatedAt, now), d.TargetName, d.EventKind,
			shortEnum(d.Status.String(), "NOTIFY_DELIVERY_STATUS_"), d.Attempts, lastErr, d.Text)
	}
	tw.Flush()
}

func targetKind(k weirv1.NotifyTargetKind) string {
	return shortEnum(k.String(), "NOTIFY_TARGET_KIND_")
}

func eventList(events []string) string {
	if len(events) == 0 {
		return "every event"
	}
	return "events " + strings.Join(events, ",")
}

// printMerged prints the fields of several messages as one JSON object.
func printMerged(w io.Writer, msgs ...proto.Message) error {
	out := map[string]json.RawMessage{}
	for _, m := range msgs {
		b, err := protojson.Marshal(m)
		if err != nil {
			return err
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(b, &fields); err != nil {
			return err
		}
		maps.Copy(out, fields)
	}
	for _, k := range []string{"targets", "deliveries"} {
		if out[k] == nil {
			out[k] = json.RawMessage("[]")
		}
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}
