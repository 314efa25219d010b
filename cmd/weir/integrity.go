package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// runIntegrity prints the integrity check's last report: what it repaired
// on its own and what an operator must look at.
func runIntegrity(ctx context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("weir integrity", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	var af adminFlags
	af.register(fs, e)
	pos, err := parsePositional(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("weir integrity: unexpected argument %q", pos[0])
	}
	c, err := af.clients()
	if err != nil {
		return err
	}
	resp, err := c.ops.LastIntegrityReport(ctx, connect.NewRequest(&weirv1.LastIntegrityReportRequest{}))
	if err != nil {
		return rpcError("last integrity report", err)
	}
	if af.json {
		return printJSON(e.stdout, resp.Msg)
	}
	return printIntegrity(e.stdout, resp.Msg.Report, time.Now())
}

func printIntegrity(w io.Writer, rep *weirv1.IntegrityReport, now time.Time) error {
	if rep == nil {
		_, err := fmt.Fprintln(w, "no integrity report yet (the check runs every 5 minutes)")
		return err
	}
	fmt.Fprintf(w, "integrity check ran %s (%s)\n\n", ago(rep.RanAt, now), rep.RanAt.AsTime().UTC().Format(time.RFC3339))
	tw := table(w)
	fmt.Fprintln(tw, "KIND\tACTION\tCOUNT\tACCOUNTS")
	var attention int64
	for _, f := range rep.Findings {
		names := make([]string, 0, len(f.Accounts))
		for _, a := range f.Accounts {
			if a.Reason != "" {
				names = append(names, fmt.Sprintf("%s (%s)", a.Label, a.Reason))
			} else {
				names = append(names, a.Label)
			}
		}
		list := "-"
		if len(names) > 0 {
			list = strings.Join(names, ", ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", f.Kind, f.Action, f.Count, list)
		if f.Action == "reported" {
			attention += f.Count
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if attention > 0 {
		_, err := fmt.Fprintf(w, "\n%d finding(s) need an operator: repaired ones were fixed by the check.\n", attention)
		return err
	}
	_, err := fmt.Fprintln(w, "\nnothing needs an operator.")
	return err
}
