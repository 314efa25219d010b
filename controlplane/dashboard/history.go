package dashboard

import (
	"fmt"
	"html/template"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// ranges are the history page's choices.
var ranges = []struct {
	Name string
	D    time.Duration
}{{"1h", time.Hour}, {"6h", 6 * time.Hour}, {"24h", 24 * time.Hour}, {"7d", 7 * 24 * time.Hour}}

type accountChart struct {
	Label    string
	Chart    template.HTML
	Legend   []usageSeries
	Forecast []usageView
}

type historyData struct {
	Range    string
	Ranges   []string
	Pool     template.HTML
	Bucket   string
	Totals   poolBucket
	Accounts []accountChart
	// NoHistory are the accounts without usage windows (API keys) or
	// without snapshots in the range.
	NoHistory []string
}

func (h *Handler) historyPage(w http.ResponseWriter, r *http.Request, s session) {
	name := r.URL.Query().Get("range")
	rng := ranges[2] // 24h
	for _, c := range ranges {
		if c.Name == name {
			rng = c
		}
	}
	ctx := r.Context()
	now := h.cfg.Now()
	accts, err := h.cfg.Accounts.ListAccounts(ctx, connect.NewRequest(&weirv1.ListAccountsRequest{}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	usage, err := h.cfg.Dashboard.UsageHistory(ctx, connect.NewRequest(&weirv1.UsageHistoryRequest{Range: durationpb.New(rng.D)}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	stats, err := h.cfg.Dashboard.RouteStats(ctx, connect.NewRequest(&weirv1.RouteStatsRequest{Range: durationpb.New(rng.D)}))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	d := historyData{Range: rng.Name, Bucket: shortDuration(stats.Msg.Bucket.AsDuration())}
	for _, c := range ranges {
		d.Ranges = append(d.Ranges, c.Name)
	}

	// One time axis for every chart of the page: from the range's start,
	// or its first data when that came later (a pool a few minutes old is
	// not drawn as a sliver at the end of a day), to a quarter of the range
	// ahead of now, where the usage forecasts reach.
	from := now.Add(-rng.D)
	if first, ok := firstData(usage.Msg.Series, stats.Msg.Buckets); ok && first.After(from) {
		from = first.Add(-stats.Msg.Bucket.AsDuration())
	}
	axis := timeAxis{from: from, to: now.Add(rng.D / forecastHorizonDivisor)}
	var buckets []poolBucket
	for _, k := range stats.Msg.Buckets {
		pb := poolBucket{Start: k.Start.AsTime(), Requests: k.Requests, Holds: k.Holds, Errors: k.Errors}
		buckets = append(buckets, pb)
		d.Totals.Requests += pb.Requests
		d.Totals.Holds += pb.Holds
		d.Totals.Errors += pb.Errors
	}
	d.Pool = poolChart(axis, stats.Msg.Bucket.AsDuration(), now, buckets)

	byAccount := map[string][]*weirv1.UsageSeries{}
	for _, s := range usage.Msg.Series {
		byAccount[s.AccountId] = append(byAccount[s.AccountId], s)
	}
	for _, a := range accts.Msg.Accounts {
		c, ok := newAccountChart(fmt.Sprint(len(d.Accounts)), a, byAccount[a.Id], axis, now)
		if !ok {
			d.NoHistory = append(d.NoHistory, a.Label)
			continue
		}
		d.Accounts = append(d.Accounts, c)
	}
	h.render(w, r, http.StatusOK, "history", view{Title: "History", Nav: "history", CSRF: s.csrf, Role: s.role, Data: d})
}

// newAccountChart is an account's usage windows over time (its snapshots'
// series, and a window with a reading but no snapshot yet as a point at
// now) on axis; ok is false when it has neither.
func newAccountChart(id string, a *weirv1.Account, snapshots []*weirv1.UsageSeries, axis timeAxis, now time.Time) (accountChart, bool) {
	views := accountViews([]*weirv1.Account{a}, now)[0]
	if len(snapshots) == 0 && len(views.Usage) == 0 {
		return accountChart{}, false
	}
	current := map[string]usageView{}
	for _, u := range views.Usage {
		current[u.Window] = u
	}
	var series []usageSeries
	class := map[string]int{}
	classOf := func(w string) int {
		if c, ok := class[w]; ok {
			return c
		}
		class[w] = len(class) % seriesClasses
		return class[w]
	}
	seen := map[string]bool{}
	for _, s := range snapshots {
		win := windowText(s.Window)
		us := usageSeries{Window: win, Class: classOf(win)}
		for _, p := range s.Points {
			pt := usagePoint{At: p.At.AsTime(), Utilization: p.Utilization}
			if p.ResetsAt != nil {
				pt.ResetsAt = p.ResetsAt.AsTime()
			}
			us.Points = append(us.Points, pt)
		}
		if u, ok := current[win]; ok {
			us.Now, us.Full = u.Utilization, u.Full
		}
		seen[win] = true
		series = append(series, us)
	}
	for _, u := range views.Usage { // windows with a reading but no snapshots yet
		if !seen[u.Window] {
			series = append(series, usageSeries{Window: u.Window, Class: classOf(u.Window), Now: u.Utilization, Full: u.Full,
				Points: []usagePoint{{At: now, Utilization: u.Utilization}}})
		}
	}
	return accountChart{Label: a.Label, Chart: usageChart(id, a.Label+" utilization", axis, now, series), Legend: series, Forecast: views.Usage}, true
}

// firstData is the time of the earliest usage point or request bucket.
func firstData(series []*weirv1.UsageSeries, buckets []*weirv1.RouteBucket) (time.Time, bool) {
	var first time.Time
	see := func(t time.Time) {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	for _, s := range series {
		for _, p := range s.Points {
			see(p.At.AsTime())
		}
	}
	for _, b := range buckets {
		if b.Requests > 0 || b.Holds > 0 {
			see(b.Start.AsTime())
		}
	}
	return first, !first.IsZero()
}
