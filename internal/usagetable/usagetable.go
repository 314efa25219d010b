// Package usagetable is a usage answer as a table: the columns `weir
// usage` prints and the dashboard's Usage page shows, and their CSV, one
// definition for both.
package usagetable

import (
	"encoding/csv"
	"fmt"
	"io"
	"strings"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// Counts are the columns after the groupings, in order.
var Counts = []string{"requests", "input_tokens", "output_tokens", "cache_read_tokens",
	"cache_creation_tokens", "reasoning_tokens", "cost_usd"}

// Columns are the grouping fields named by by, then the counts.
func Columns(by []string) []string {
	var cols []string
	for _, g := range by {
		cols = append(cols, strings.ToLower(strings.TrimSpace(g)))
	}
	return append(cols, Counts...)
}

// Field is one column of a row: a grouping by its name (a key's name, an
// account's label, falling back to their ids; a day or an hour in loc),
// else a count (int64), or the cost in dollars to the millionth
// (float64).
func Field(r *weirv1.UsageRow, col string, loc *time.Location) any {
	switch col {
	case "key":
		return OrID(r.KeyName, r.KeyId)
	case "account":
		return OrID(r.AccountLabel, r.AccountId)
	case "model":
		return r.Model
	case "session":
		return r.SessionKey
	case "day":
		return r.PeriodStart.AsTime().In(loc).Format(time.DateOnly)
	case "hour":
		return r.PeriodStart.AsTime().In(loc).Format(time.RFC3339)
	case "requests":
		return r.Requests
	case "input_tokens":
		return r.InputTokens
	case "output_tokens":
		return r.OutputTokens
	case "cache_read_tokens":
		return r.CacheReadTokens
	case "cache_creation_tokens":
		return r.CacheCreationTokens
	case "reasoning_tokens":
		return r.ReasoningTokens
	case "cost_usd":
		return float64(int64(r.CostUsd*1e6+0.5)) / 1e6
	}
	return ""
}

// OrID is a name, else the id it names.
func OrID(name, id string) string {
	if name != "" {
		return name
	}
	return id
}

// WriteCSV writes rows grouped by by as CSV: a header of Columns(by),
// then a record per row.
func WriteCSV(w io.Writer, by []string, rows []*weirv1.UsageRow, loc *time.Location) error {
	cols := Columns(by)
	cw := csv.NewWriter(w)
	cw.Write(cols) //nolint:errcheck // the flush reports it
	for _, r := range rows {
		rec := make([]string, len(cols))
		for i, col := range cols {
			rec[i] = fmt.Sprint(Field(r, col, loc))
		}
		cw.Write(rec) //nolint:errcheck // the flush reports it
	}
	cw.Flush()
	return cw.Error()
}
