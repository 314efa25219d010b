package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/weirhq/weir/internal/sim"
)

// weirMetric finds weir's metric names in a PromQL expression.
var weirMetric = regexp.MustCompile(`\bweir_[a-z0-9_]+`)

// TestMonitoringDocsMatchMetrics: every metric the example Grafana
// dashboard and the alert rules in docs/monitoring use is one the data
// plane or the control plane registers, so the two never drift apart.
func TestMonitoringDocsMatchMetrics(t *testing.T) {
	t.Parallel()
	cpReg, dpReg := prometheus.NewRegistry(), prometheus.NewRegistry()
	e := setup(t, options{cpRegistry: cpReg, dpRegistry: dpReg, accounts: []account{{label: "max", oauth: true, windows: &sim.Windows{
		FiveHour: &sim.Window{Limit: 1_000_000, Used: 300_000},
		SevenDay: &sim.Window{Limit: 10_000_000, Used: 2_000_000},
	}}}})
	// One request fills the series that exist only once something
	// happened: attempts, latencies, the usage readings it brought back.
	if r := e.post(false); r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	e.leasesReleased()

	registered := map[string]bool{}
	for _, reg := range []*prometheus.Registry{cpReg, dpReg} {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatalf("gather: %v", err)
		}
		for _, mf := range mfs {
			name := mf.GetName()
			registered[name] = true
			switch mf.GetType() {
			case dto.MetricType_HISTOGRAM:
				registered[name+"_bucket"], registered[name+"_sum"], registered[name+"_count"] = true, true, true
			case dto.MetricType_SUMMARY:
				registered[name+"_sum"], registered[name+"_count"] = true, true
			}
		}
	}

	check := func(file string, exprs []string) {
		t.Helper()
		if len(exprs) == 0 {
			t.Errorf("%s: no expressions found", file)
		}
		used := 0
		for _, expr := range exprs {
			for _, name := range weirMetric.FindAllString(expr, -1) {
				used++
				if !registered[name] {
					t.Errorf("%s uses %s, which neither process registers", file, name)
				}
			}
		}
		if used == 0 {
			t.Errorf("%s: no weir metric referenced", file)
		}
	}

	raw, err := os.ReadFile("../../docs/monitoring/grafana-weir.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("grafana-weir.json: %v", err)
	}
	var exprs []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("grafana-weir.json: panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	check("grafana-weir.json", exprs)

	raw, err = os.ReadFile("../../docs/monitoring/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	exprs = nil
	var names []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" {
				t.Errorf("alerts.yml: a rule without alert or expr: %+v", r)
			}
			names = append(names, r.Alert)
			exprs = append(exprs, r.Expr)
		}
	}
	check("alerts.yml", exprs)
	if !slices.Contains(names, "WeirControlPlaneDown") {
		t.Error("alerts.yml: no WeirControlPlaneDown")
	}
}
