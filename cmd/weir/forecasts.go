package main

import (
	"fmt"
	"io"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// printForecasts shows each usage window's burn rate and when it would be
// full at that rate: "full in 3h", or "not before reset". Nothing when the
// account has no forecast (no recent history).
func printForecasts(w io.Writer, a *weirv1.Account, now time.Time) {
	if len(a.GetForecasts()) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := table(w)
	fmt.Fprintln(tw, "WINDOW\tBURN\tFORECAST")
	for _, f := range a.GetForecasts() {
		fmt.Fprintf(tw, "%s\t%.1f%%/h\t%s\n", f.Window, f.BurnPerHour*100, fullIn(f, now))
	}
	tw.Flush()
}

// fullIn renders a forecast's exhaustion as "full in 3h", "full now" or
// "not before reset".
func fullIn(f *weirv1.Forecast, now time.Time) string {
	if f.ExhaustsAt == nil {
		return "not before reset"
	}
	d := f.ExhaustsAt.AsTime().Sub(now)
	if d <= 0 {
		return "full now"
	}
	return "full in " + resetIn(d)
}
