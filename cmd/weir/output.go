package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/internal/poolstatus"
)

func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: false}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

func table(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
}

// shortEnum renders AUTH_KIND_OAUTH as "oauth".
func shortEnum(s, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(s, prefix))
}

// ago renders a past time relative to now, "-" when unset.
func ago(t *timestamppb.Timestamp, now time.Time) string {
	if t == nil {
		return "-"
	}
	d := now.Sub(t.AsTime())
	if d < 0 {
		return "in " + roundDuration(-d).String()
	}
	return roundDuration(d).String() + " ago"
}

func until(t *timestamppb.Timestamp, now time.Time) string {
	if t == nil {
		return "-"
	}
	d := t.AsTime().Sub(now)
	if d <= 0 {
		return "now"
	}
	return "in " + roundDuration(d).String()
}

func roundDuration(d time.Duration) time.Duration { return poolstatus.RoundDuration(d) }
