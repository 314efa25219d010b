package controlplane

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/weirhq/weir/controlplane/db"
)

// poolCollector reports the pool's state at scrape time: accounts by
// provider and state, and usage utilization per window. It reads two
// aggregate queries and caches their answer for poolMetricsTTL, so that
// several scrapers (or a scrape storm) cost one read.
type poolCollector struct {
	q   *db.Queries
	now func() time.Time
	log *slog.Logger
	// labelsMax is the largest pool that gets per-account series; 0 none.
	labelsMax int

	mu      sync.Mutex
	readAt  time.Time
	metrics []prometheus.Metric
}

// poolMetricsTTL bounds how stale a scrape's pool view may be.
const poolMetricsTTL = 10 * time.Second

// Account states, most severe first: an account counts in one only.
var accountStates = []string{"active", "cooling", "paused", "broken"}

var (
	accountsDesc = prometheus.NewDesc("weir_controlplane_accounts",
		"Accounts by provider and state (active, cooling, paused, broken; the most severe wins).",
		[]string{"provider", "state"}, nil)
	utilizationDesc = prometheus.NewDesc("weir_controlplane_usage_utilization_ratio",
		"Usage utilization (0..1) of the pool per window: min, max and avg over the accounts with a current reading.",
		[]string{"window", "stat"}, nil)
	accountUtilizationDesc = prometheus.NewDesc("weir_controlplane_account_usage_utilization_ratio",
		"Usage utilization (0..1) per window of each account, by account label; only while the pool has at most WEIR_METRICS_ACCOUNT_LABELS_MAX accounts.",
		[]string{"window", "account"}, nil)
)

func newPoolCollector(s *Server) *poolCollector {
	return &poolCollector{q: s.q, now: s.now, log: s.log, labelsMax: max(s.cfg.MetricsAccountLabelsMax, 0)}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- accountsDesc
	ch <- utilizationDesc
	ch <- accountUtilizationDesc
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.metrics == nil || time.Since(c.readAt) >= poolMetricsTTL {
		// A scrape carries no context; the timeout keeps a slow database
		// from holding the scrape past the scraper's own timeout.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ms, err := c.read(ctx)
		cancel()
		if err != nil {
			// The last good view, if any, is better than a gap.
			c.log.Warn("read pool metrics", "err", err)
		} else {
			c.metrics, c.readAt = ms, time.Now()
		}
	}
	for _, m := range c.metrics {
		ch <- m
	}
}

func (c *poolCollector) read(ctx context.Context) ([]prometheus.Metric, error) {
	now := c.now()
	states, err := c.q.MetricsAccountStates(ctx, now)
	if err != nil {
		return nil, err
	}
	usage, err := c.q.MetricsUsage(ctx, now)
	if err != nil {
		return nil, err
	}
	return poolMetrics(states, usage, c.labelsMax), nil
}

// poolMetrics turns the aggregates into series. Every provider × state
// series is present (0 when empty), so an alert on "no active account"
// sees the zero. Pure.
func poolMetrics(states []db.MetricsAccountStatesRow, usage []db.MetricsUsageRow, labelsMax int) []prometheus.Metric {
	providers := []string{providerAnthropic, providerOpenAI, providerCodex}
	counts := map[[2]string]float64{}
	total, other := 0, false
	for _, r := range states {
		p := r.Provider
		if !slices.Contains(providers, p) {
			p, other = "other", true
		}
		counts[[2]string{p, r.State}] += float64(r.Accounts)
		total += int(r.Accounts)
	}
	if other {
		providers = append(providers, "other")
	}
	var out []prometheus.Metric
	for _, p := range providers {
		for _, st := range accountStates {
			out = append(out, prometheus.MustNewConstMetric(accountsDesc, prometheus.GaugeValue, counts[[2]string{p, st}], p, st))
		}
	}

	type agg struct {
		min, max, sum float64
		n             int
	}
	perWindow := map[string]*agg{}
	perAccount := labelsMax > 0 && total <= labelsMax
	for _, u := range usage {
		if !slices.Contains(usageWindows, u.WindowName) {
			continue // a window weir does not know would be an unbounded label
		}
		a := perWindow[u.WindowName]
		if a == nil {
			a = &agg{min: u.Utilization, max: u.Utilization}
			perWindow[u.WindowName] = a
		}
		a.min, a.max = min(a.min, u.Utilization), max(a.max, u.Utilization)
		a.sum += u.Utilization
		a.n++
		if perAccount {
			out = append(out, prometheus.MustNewConstMetric(accountUtilizationDesc, prometheus.GaugeValue, u.Utilization, u.WindowName, u.Label))
		}
	}
	for _, w := range usageWindows {
		a := perWindow[w]
		if a == nil {
			continue // no reading is no evidence, never 0
		}
		out = append(out,
			prometheus.MustNewConstMetric(utilizationDesc, prometheus.GaugeValue, a.min, w, "min"),
			prometheus.MustNewConstMetric(utilizationDesc, prometheus.GaugeValue, a.max, w, "max"),
			prometheus.MustNewConstMetric(utilizationDesc, prometheus.GaugeValue, a.sum/float64(a.n), w, "avg"),
		)
	}
	return out
}
