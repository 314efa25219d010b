package dashboard

import (
	"cmp"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/usagetable"
)

// The Usage page: QueryUsage over a range, grouped by one dimension
// (and by day or hour when asked), with totals, a chart of tokens and
// cost over time and the table as CSV.

// Bounds: the table's rows (a page people read), the chart's rows (one
// per group and bucket) and the CSV's, the most QueryUsage gives.
const (
	usageTableRows = 1000
	usageChartRows = 10000
	usageCSVRows   = 10000
	// usageTopN is how many groups the chart draws apart; the rest are
	// "other".
	usageTopN = seriesClasses - 1
	// hourlyChartSpan is the longest range the chart draws by the hour
	// unless asked to: beyond it, by the day.
	hourlyChartSpan = 7*24*time.Hour + time.Hour
)

// usageBys are the group-by choices, usagePers the time splits.
var (
	usageBys  = []option{{"key", "Key"}, {"account", "Account"}, {"model", "Model"}, {"session", "Session"}}
	usagePers = []option{{"", "whole range"}, {"day", "by day"}, {"hour", "by hour"}}
)

// usageQuery is the Usage page's query string.
type usageQuery struct {
	timeRange
	// By is key, account, model or session; Per is "", day or hour.
	By, Per string
}

func parseUsageQuery(q url.Values, now time.Time) (usageQuery, error) {
	u := usageQuery{By: strings.TrimSpace(q.Get("by")), Per: strings.TrimSpace(q.Get("per"))}
	var err error
	u.timeRange, err = parseRange(q, now, "24h")
	if u.By == "" {
		u.By = "key"
	}
	if err != nil {
		return u, err
	}
	if !slices.ContainsFunc(usageBys, func(o option) bool { return o.Value == u.By }) {
		return u, fmt.Errorf("by: %q is not one of key, account, model or session", u.By)
	}
	if !slices.ContainsFunc(usagePers, func(o option) bool { return o.Value == u.Per }) {
		return u, fmt.Errorf("per: %q is not day or hour (or empty, for the whole range)", u.Per)
	}
	return u, nil
}

// Query is the whole query as a query string (a URL part: built by
// url.Values, safe in an href).
func (u usageQuery) Query() template.URL {
	v := u.values()
	v.Set("by", u.By)
	if u.Per != "" {
		v.Set("per", u.Per)
	}
	return template.URL(v.Encode()) //nolint:gosec // url.Values encoded it
}

// WithRange is the query with another preset range.
func (u usageQuery) WithRange(name string) template.URL {
	u.Range = name
	return u.Query()
}

// Tabs is the usage pages' navigation from this page.
func (d usageData) Tabs() tabs { return tabs{Tab: "usage", Query: d.Q.RangeQuery()} }

// groupBy is the table's grouping: By, then Per.
func (u usageQuery) groupBy() []string {
	if u.Per == "" {
		return []string{u.By}
	}
	return []string{u.By, u.Per}
}

// chartPer is the chart's bucket: Per when asked, else hours up to a
// week and days beyond.
func (u usageQuery) chartPer() string {
	switch {
	case u.Per != "":
		return u.Per
	case u.Until.Sub(u.Since) <= hourlyChartSpan:
		return "hour"
	}
	return "day"
}

func (u usageQuery) request(groupBy []string, limit int32) *weirv1.QueryUsageRequest {
	tz := ""
	if u.loc != time.UTC {
		tz = u.loc.String()
	}
	return &weirv1.QueryUsageRequest{GroupBy: groupBy, Since: timestamppb.New(u.Since), Until: timestamppb.New(u.Until),
		TimeZone: tz, Limit: limit}
}

// usageRowView is one row of the table.
type usageRowView struct {
	Groups                                                       []groupCell
	Requests, Input, Output, CacheRead, CacheCreation, Reasoning int64
	Cost, Hit                                                    float64
}

// groupCell is a grouping's cell: its header, its text, and a link.
type groupCell struct {
	Label, Text, Link string
	// Code: shown as code (a session key, a model id).
	Code bool
}

type usageData struct {
	Q      usageQuery
	Bys    []option
	Pers   []option
	Error  string
	Groups []string
	Rows   []usageRowView
	Total  usageRowView
	// Truncated: the table stops at its bound; the totals do not.
	Truncated   bool
	TableRows   int
	From, To    string
	PricesAsOf  string
	Unpriced    int64
	Chart       template.HTML
	Legend      []legendItem
	ChartBucket string
	// ChartTop is how many groups the chart draws apart from other.
	ChartTop                      int
	ChartTruncated, HourlyRollups bool
}

// tabs is the usage pages' navigation: the page it is on, and the range
// the others keep.
type tabs struct {
	Tab   string
	Query template.URL
}

type legendItem struct {
	Label string
	Class int
}

func (h *Handler) usagePage(w http.ResponseWriter, r *http.Request, s session) {
	q, err := parseUsageQuery(r.URL.Query(), h.cfg.Now())
	d := usageData{Q: q, Bys: usageBys, Pers: usagePers, TableRows: usageTableRows}
	if err != nil {
		d.Error = err.Error()
		h.render(w, r, http.StatusBadRequest, "usage", view{Title: "Usage", Nav: "usage", CSRF: s.csrf, Role: s.role, Data: d})
		return
	}
	if err := h.usageData(r, &d); err != nil {
		if connect.CodeOf(err) == connect.CodeInvalidArgument || connect.CodeOf(err) == connect.CodeNotFound {
			d.Error = rpcMessage(err)
			h.render(w, r, http.StatusBadRequest, "usage", view{Title: "Usage", Nav: "usage", CSRF: s.csrf, Role: s.role, Data: d})
			return
		}
		h.fail(w, r, err)
		return
	}
	h.render(w, r, http.StatusOK, "usage", view{Title: "Usage", Nav: "usage", CSRF: s.csrf, Role: s.role, Data: d})
}

// usageData fills d from three queries: the table's, the totals' (no
// grouping, so they hold whatever the table's bound left out) and the
// chart's (by group and bucket).
func (h *Handler) usageData(r *http.Request, d *usageData) error {
	ctx, q := r.Context(), d.Q
	table, err := h.cfg.Usage.QueryUsage(ctx, connect.NewRequest(q.request(q.groupBy(), usageTableRows)))
	if err != nil {
		return err
	}
	totals, err := h.cfg.Usage.QueryUsage(ctx, connect.NewRequest(q.request(nil, 1)))
	if err != nil {
		return err
	}
	chart, err := h.cfg.Usage.QueryUsage(ctx, connect.NewRequest(q.request([]string{q.By, q.chartPer()}, usageChartRows)))
	if err != nil {
		return err
	}
	// The rollup is by the hour: the range counts from the start of the
	// hour it begins in.
	from := q.Since.Truncate(time.Hour)
	d.From, d.To = q.fmtIn(from, "2006-01-02 15:04"), q.fmtIn(q.Until, "2006-01-02 15:04")
	d.HourlyRollups = !from.Equal(q.Since)
	d.PricesAsOf = table.Msg.PricesAsOf
	for _, g := range q.groupBy() {
		d.Groups = append(d.Groups, groupHeader(g))
	}
	for _, row := range table.Msg.Rows {
		v := rowView(row)
		for _, g := range q.groupBy() {
			v.Groups = append(v.Groups, newGroupCell(row, g, q))
		}
		d.Rows = append(d.Rows, v)
	}
	d.Truncated = len(table.Msg.Rows) >= usageTableRows
	if len(totals.Msg.Rows) > 0 {
		d.Total = rowView(totals.Msg.Rows[0])
		d.Unpriced = totals.Msg.Rows[0].UnpricedTokens
	}
	d.ChartBucket = q.chartPer()
	d.ChartTruncated = len(chart.Msg.Rows) >= usageChartRows
	d.Chart, d.Legend, d.ChartTop = usageStack(chart.Msg.Rows, q)
	return nil
}

// Tokens is every token the row counts.
func (v usageRowView) Tokens() int64 { return v.Input + v.Output + v.CacheRead + v.CacheCreation }

func rowView(r *weirv1.UsageRow) usageRowView {
	return usageRowView{Requests: r.Requests, Input: r.InputTokens, Output: r.OutputTokens, CacheRead: r.CacheReadTokens,
		CacheCreation: r.CacheCreationTokens, Reasoning: r.ReasoningTokens, Cost: r.CostUsd, Hit: r.CacheHitRatio}
}

func groupHeader(g string) string {
	for _, o := range usageBys {
		if o.Value == g {
			return o.Label
		}
	}
	return strings.ToUpper(g[:1]) + g[1:]
}

// groupText is a row's grouping as the page shows it.
func groupText(r *weirv1.UsageRow, g string, q usageQuery) string {
	switch g {
	case "key":
		return cmp.Or(usagetable.OrID(r.KeyName, r.KeyId), "(no key)")
	case "account":
		return cmp.Or(usagetable.OrID(r.AccountLabel, r.AccountId), "(no account)")
	case "model":
		return cmp.Or(r.Model, "(no model)")
	case "session":
		return cmp.Or(r.SessionKey, "(no session)")
	case "day":
		return q.fmtIn(r.PeriodStart.AsTime(), "Mon 2006-01-02")
	case "hour":
		return q.fmtIn(r.PeriodStart.AsTime(), "2006-01-02 15:04")
	}
	return ""
}

// newGroupCell is a row's grouping cell; a session links to its prompt
// cache over the same range.
func newGroupCell(r *weirv1.UsageRow, g string, q usageQuery) groupCell {
	c := groupCell{Label: groupHeader(g), Text: groupText(r, g, q), Code: g == "session" || g == "model"}
	if g == "session" && r.SessionKey != "" {
		v := q.values()
		v.Set("session", r.SessionKey)
		c.Link = Prefix + "usage/cache?" + v.Encode()
	}
	return c
}

// usageCSV is the table as `weir usage --csv` prints it.
func (h *Handler) usageCSV(w http.ResponseWriter, r *http.Request, _ session) {
	q, err := parseUsageQuery(r.URL.Query(), h.cfg.Now())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	res, err := h.cfg.Usage.QueryUsage(r.Context(), connect.NewRequest(q.request(q.groupBy(), usageCSVRows)))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	name := fmt.Sprintf("weir-usage-%s-%s.csv", strings.Join(q.groupBy(), "-"), q.fmtIn(q.Since, "20060102T1504"))
	w.Header().Set("Content-Type", "text/csv; charset=utf-8")
	w.Header().Set("Content-Disposition", `attachment; filename="`+name+`"`)
	w.Header().Set("Cache-Control", "no-store")
	if err := usagetable.WriteCSV(w, q.groupBy(), res.Msg.Rows, q.loc); err != nil {
		h.cfg.Logger.WarnContext(r.Context(), "dashboard usage csv cut short", "err", err)
	}
}

// usageStack is the chart: each bucket's tokens and cost stacked by the
// top groups (by cost, then tokens), the rest as "other".
func usageStack(rows []*weirv1.UsageRow, q usageQuery) (template.HTML, []legendItem, int) {
	if len(rows) == 0 {
		return "", nil, 0
	}
	per := q.chartPer()
	start := func(t time.Time) time.Time {
		if per == "day" {
			t = t.In(q.loc)
			return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, q.loc)
		}
		return t.Truncate(time.Hour)
	}
	next := func(t time.Time) time.Time {
		if per == "day" {
			return t.In(q.loc).AddDate(0, 0, 1)
		}
		return t.Add(time.Hour)
	}
	var buckets []time.Time
	index := map[int64]int{}
	for t := start(q.Since); t.Before(q.Until); t = next(t) {
		index[t.Unix()] = len(buckets)
		buckets = append(buckets, t)
	}
	end := next(buckets[len(buckets)-1])

	type group struct {
		label  string
		cost   float64
		tokens int64
	}
	groups := map[string]*group{}
	for _, r := range rows {
		id := groupText(r, q.By, q)
		g := groups[id]
		if g == nil {
			g = &group{label: id}
			groups[id] = g
		}
		g.cost += r.CostUsd
		g.tokens += rowTokens(r)
	}
	ranked := make([]*group, 0, len(groups))
	for _, g := range groups {
		ranked = append(ranked, g)
	}
	slices.SortFunc(ranked, func(a, b *group) int {
		return cmp.Or(cmp.Compare(b.cost, a.cost), cmp.Compare(b.tokens, a.tokens), cmp.Compare(a.label, b.label))
	})
	named := len(ranked)
	if named > usageTopN+1 {
		named = usageTopN
	}
	series := make([]stackSeries, 0, named+1)
	slot := map[string]int{}
	for i, g := range ranked[:named] {
		slot[g.label] = i
		series = append(series, stackSeries{Label: g.label, Class: i})
	}
	if named < len(ranked) {
		series = append(series, stackSeries{Label: fmt.Sprintf("other (%d)", len(ranked)-named), Class: seriesClasses - 1})
	}
	for i := range series {
		series[i].Tokens = make([]int64, len(buckets))
		series[i].Cost = make([]float64, len(buckets))
	}
	for _, r := range rows {
		i, ok := slot[groupText(r, q.By, q)]
		if !ok {
			i = len(series) - 1
		}
		b, ok := index[start(r.PeriodStart.AsTime()).Unix()]
		if !ok {
			continue
		}
		series[i].Tokens[b] += rowTokens(r)
		series[i].Cost[b] += r.CostUsd
	}
	legend := make([]legendItem, len(series))
	for i, s := range series {
		legend[i] = legendItem{Label: s.Label, Class: s.Class}
	}
	return stackedUsage(buckets, end, q.loc, per, series), legend, named
}

// rowTokens is every token a row counts: input, output (reasoning is
// part of it), cache reads and cache writes.
func rowTokens(r *weirv1.UsageRow) int64 {
	return r.InputTokens + r.OutputTokens + r.CacheReadTokens + r.CacheCreationTokens
}
