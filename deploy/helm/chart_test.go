// Package helm_test renders deploy/helm/weir with Helm's own engine and
// checks every manifest against the Kubernetes API types, strictly, and
// against the binary it deploys: the paths its probes hit, the variables
// it sets, the ports its metrics listen on.
package helm_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

const chartDir = "weir"

// secretValues are what an install without an existing Secret must give.
var secretValues = map[string]any{
	"adminToken":     "admin-" + strings.Repeat("a", 24),
	"dataplaneToken": "dp-" + strings.Repeat("b", 24),
	"secretKey":      strings.Repeat("0", 64),
	"databaseURL":    "postgres://weir:weir@db:5432/weir?sslmode=require",
	"metricsToken":   "metrics-" + strings.Repeat("c", 24), // used with metrics.token only
}

// manifests is one rendering, decoded into the typed objects.
type manifests struct {
	deployments     map[string]*appsv1.Deployment // by component
	services        []*corev1.Service
	pdbs            []*policyv1.PodDisruptionBudget
	secrets         []*corev1.Secret
	configMaps      []*corev1.ConfigMap
	serviceMonitors []*serviceMonitor
	rules           []*prometheusRule
}

// render renders the chart with values over its defaults, as
// `helm template` would, and decodes every document strictly.
func render(t *testing.T, values map[string]any) *manifests {
	t.Helper()
	out, err := renderRaw(values)
	if err != nil {
		t.Fatal(err)
	}
	m := &manifests{deployments: map[string]*appsv1.Deployment{}}
	for name, text := range out {
		if !strings.HasSuffix(name, ".yaml") {
			continue // NOTES.txt, _helpers.tpl
		}
		for i, doc := range strings.Split(text, "\n---") {
			if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" {
				continue
			}
			where := fmt.Sprintf("%s (document %d)", name, i)
			var head struct{ APIVersion, Kind string }
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			switch head.APIVersion + " " + head.Kind {
			case "apps/v1 Deployment":
				d := decode[appsv1.Deployment](t, where, doc)
				m.deployments[d.Labels["app.kubernetes.io/component"]] = d
			case "v1 Service":
				m.services = append(m.services, decode[corev1.Service](t, where, doc))
			case "policy/v1 PodDisruptionBudget":
				m.pdbs = append(m.pdbs, decode[policyv1.PodDisruptionBudget](t, where, doc))
			case "v1 Secret":
				m.secrets = append(m.secrets, decode[corev1.Secret](t, where, doc))
			case "v1 ConfigMap":
				m.configMaps = append(m.configMaps, decode[corev1.ConfigMap](t, where, doc))
			case "monitoring.coreos.com/v1 ServiceMonitor":
				m.serviceMonitors = append(m.serviceMonitors, decode[serviceMonitor](t, where, doc))
			case "monitoring.coreos.com/v1 PrometheusRule":
				m.rules = append(m.rules, decode[prometheusRule](t, where, doc))
			default:
				t.Fatalf("%s: %s %s is not a kind this test validates", where, head.APIVersion, head.Kind)
			}
		}
	}
	for _, c := range []string{"dataplane", "controlplane"} {
		if m.deployments[c] == nil {
			t.Fatalf("no %s Deployment", c)
		}
	}
	return m
}

func renderRaw(values map[string]any) (map[string]string, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	vals, err := chartutil.ToRenderValues(ch, values,
		common.ReleaseOptions{Name: "weir", Namespace: "weir", IsInstall: true}, common.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	return engine.Render(ch, vals)
}

// decode decodes one YAML document into T, refusing fields T does not
// have: a misspelt or misplaced field fails here, not in a cluster.
func decode[T any](t *testing.T, where, doc string) *T {
	t.Helper()
	j, err := yaml.YAMLToJSONStrict([]byte(doc))
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	v := new(T)
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v\n%s", where, err, doc)
	}
	return v
}

// The prometheus-operator kinds are not in k8s.io/api: these are the
// fields the chart uses, so a field outside them is a mistake.
type objectMeta struct {
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type serviceMonitor struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		Endpoints []struct {
			Port     string `json:"port"`
			Path     string `json:"path"`
			Interval string `json:"interval"`
			// The bearer token, when metrics.token is on.
			Authorization *struct {
				Type        string                   `json:"type"`
				Credentials corev1.SecretKeySelector `json:"credentials"`
			} `json:"authorization,omitempty"`
			Relabelings []struct {
				TargetLabel string `json:"targetLabel"`
				Replacement string `json:"replacement"`
			} `json:"relabelings"`
		} `json:"endpoints"`
	} `json:"spec"`
}

type prometheusRule struct {
	APIVersion string     `json:"apiVersion"`
	Kind       string     `json:"kind"`
	Metadata   objectMeta `json:"metadata"`
	Spec       ruleFile   `json:"spec"`
}

// ruleFile is Prometheus's rule file, which is also PrometheusRule's spec.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for,omitempty"`
			Labels      map[string]string `json:"labels,omitempty"`
			Annotations map[string]string `json:"annotations,omitempty"`
		} `json:"rules"`
	} `json:"groups"`
}

// TestChartDefaults renders a minimal install (the defaults and the
// secrets they require) and checks it against the binary.
func TestChartDefaults(t *testing.T) {
	m := render(t, map[string]any{"secrets": secretValues})
	checkWiring(t, m)
	if len(m.secrets) != 1 {
		t.Fatalf("%d Secrets, want the chart's one", len(m.secrets))
	}
	for _, c := range []string{"dataplane", "controlplane"} {
		if got := *m.deployments[c].Spec.Replicas; got != 2 {
			t.Errorf("%s: %d replicas by default, docs/deploy.md sizes 2", c, got)
		}
	}
	for c, d := range m.deployments {
		if _, ok := envOf(d)["WEIR_METRICS_TOKEN"]; ok {
			t.Errorf("%s: WEIR_METRICS_TOKEN set though metrics.token is off", c)
		}
	}
	if len(m.secrets[0].StringData) != 4 {
		t.Errorf("the Secret holds %d keys, want the four the processes read", len(m.secrets[0].StringData))
	}
	if len(m.serviceMonitors)+len(m.rules)+len(m.configMaps) != 0 {
		t.Error("monitoring objects rendered though their values are off by default")
	}
}

// TestChartLint runs `helm lint`'s rules (Chart.yaml, values, templates)
// over a minimal install.
func TestChartLint(t *testing.T) {
	l := lint.RunAll(chartDir, map[string]any{"secrets": secretValues}, "weir")
	for _, msg := range l.Messages {
		if msg.Severity > support.InfoSev {
			t.Error(msg)
		} else {
			t.Log(msg)
		}
	}
}

// TestChartRequiresSecrets: without an existing Secret or the values to
// make one, rendering fails and says what is missing.
func TestChartRequiresSecrets(t *testing.T) {
	_, err := renderRaw(nil)
	if err == nil || !strings.Contains(err.Error(), "secrets.adminToken is required") {
		t.Fatalf("rendered without secrets: %v", err)
	}
}

// TestChartExistingSecret: the chart makes no Secret and every reference
// names the operator's Secret and its keys.
func TestChartExistingSecret(t *testing.T) {
	keys := map[string]any{"adminToken": "a", "dataplaneToken": "d", "secretKey": "k", "databaseURL": "u"}
	m := render(t, map[string]any{"secrets": map[string]any{"existingSecret": "ops-weir", "keys": keys}})
	checkWiring(t, m)
	if len(m.secrets) != 0 {
		t.Fatalf("the chart made %d Secrets beside the existing one", len(m.secrets))
	}
	want := map[string]bool{"a": true, "d": true, "k": true, "u": true}
	for c, d := range m.deployments {
		for _, e := range d.Spec.Template.Spec.Containers[0].Env {
			if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil {
				if r.SecretKeyRef.Name != "ops-weir" || !want[r.SecretKeyRef.Key] {
					t.Errorf("%s: %s from %s/%s", c, e.Name, r.SecretKeyRef.Name, r.SecretKeyRef.Key)
				}
			}
		}
		if _, ok := d.Spec.Template.Annotations["checksum/secret"]; ok {
			t.Errorf("%s: checksums a Secret the chart does not make", c)
		}
	}
}

// TestChartOverrides: replicas, ports, extra env and every monitoring
// object on.
func TestChartOverrides(t *testing.T) {
	m := render(t, map[string]any{
		"secrets": secretValues,
		"dataplane": map[string]any{"replicas": 5, "port": 8080, "metricsPort": 9090,
			"service": map[string]any{"type": "LoadBalancer", "port": 80},
			"env":     map[string]any{"WEIR_LOG_LEVEL": "debug"}},
		"controlplane": map[string]any{"replicas": 3, "metricsPort": 9091,
			"env": map[string]any{"WEIR_CAPACITY_HOLD": "10m", "WEIR_METRICS_ACCOUNT_LABELS_MAX": 0}},
		"metrics": map[string]any{"token": true,
			"serviceMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prom"}}},
		"monitoring": map[string]any{"dashboard": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}},
	})
	checkWiring(t, m)
	if *m.deployments["dataplane"].Spec.Replicas != 5 || *m.deployments["controlplane"].Spec.Replicas != 3 {
		t.Error("replicas not taken from values")
	}
	for c, d := range m.deployments {
		if r := envOf(d)["WEIR_METRICS_TOKEN"].ValueFrom; r == nil || r.SecretKeyRef == nil {
			t.Errorf("%s: metrics.token on, but WEIR_METRICS_TOKEN does not come from the Secret", c)
		}
	}
	env := envOf(m.deployments["controlplane"])
	if env["WEIR_METRICS_ACCOUNT_LABELS_MAX"].Value != "0" || env["WEIR_CAPACITY_HOLD"].Value != "10m" {
		t.Errorf("control plane's extra env: %v", env)
	}

	// The dashboard, verbatim, where Grafana's sidecar finds it.
	if len(m.configMaps) != 1 {
		t.Fatalf("%d ConfigMaps, want the dashboard's", len(m.configMaps))
	}
	cm := m.configMaps[0]
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap labels %v lack grafana_dashboard: \"1\"", cm.Labels)
	}
	if cm.Data["grafana-weir.json"] != strings.TrimRight(readFile(t, "../../docs/monitoring/grafana-weir.json"), "\n") {
		t.Error("the dashboard ConfigMap is not docs/monitoring/grafana-weir.json")
	}

	// The rules, the same as alerts.yml's.
	if len(m.rules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(m.rules))
	}
	var file ruleFile
	if err := yaml.UnmarshalStrict([]byte(readFile(t, "../../docs/monitoring/alerts.yml")), &file); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	got, _ := json.Marshal(m.rules[0].Spec)
	want, _ := json.Marshal(file)
	if !bytes.Equal(got, want) || len(file.Groups) == 0 {
		t.Errorf("the PrometheusRule's groups are not alerts.yml's:\n%s\n%s", got, want)
	}

	// One ServiceMonitor per component, on a Service that has its pods and
	// only their metrics port, under the job names the alerts use.
	if len(m.serviceMonitors) != 2 {
		t.Fatalf("%d ServiceMonitors, want 2", len(m.serviceMonitors))
	}
	for _, sm := range m.serviceMonitors {
		c := sm.Metadata.Labels["app.kubernetes.io/component"]
		if sm.Metadata.Labels["release"] != "prom" {
			t.Errorf("%s: labels %v lack the values' release: prom", sm.Metadata.Name, sm.Metadata.Labels)
		}
		var svcs []*corev1.Service
		for _, s := range m.services {
			if labels.SelectorFromSet(sm.Spec.Selector.MatchLabels).Matches(labels.Set(s.Labels)) {
				svcs = append(svcs, s)
			}
		}
		if len(svcs) != 1 || len(svcs[0].Spec.Ports) != 1 {
			t.Fatalf("ServiceMonitor %s selects %d Services, want its metrics Service alone", sm.Metadata.Name, len(svcs))
		}
		if ep := sm.Spec.Endpoints; len(ep) != 1 || ep[0].Port != svcs[0].Spec.Ports[0].Name || ep[0].Path != "/metrics" {
			t.Errorf("ServiceMonitor %s endpoints %+v", sm.Metadata.Name, ep)
		}
		// alerts.yml names its jobs in its header (and selects on weir-controlplane).
		if job := sm.Spec.Endpoints[0].Relabelings[0]; job.TargetLabel != "job" || job.Replacement != "weir-"+c ||
			!strings.Contains(readFile(t, "../../docs/monitoring/alerts.yml"), job.Replacement) {
			t.Errorf("ServiceMonitor %s: job %+v is not one alerts.yml names", sm.Metadata.Name, job)
		}
		// It sends the token the processes read, from the same Secret key.
		a := sm.Spec.Endpoints[0].Authorization
		tok := envOf(m.deployments[c])["WEIR_METRICS_TOKEN"].ValueFrom.SecretKeyRef
		if a == nil || a.Type != "Bearer" || a.Credentials.Name != tok.Name || a.Credentials.Key != tok.Key {
			t.Errorf("ServiceMonitor %s: authorization %+v, want the Bearer token in %s/%s", sm.Metadata.Name, a, tok.Name, tok.Key)
		}
		if p := svcs[0].Spec.Ports[0]; p.TargetPort != intstr.FromString("metrics") ||
			containerPort(t, m.deployments[c], "metrics") != metricsPortOf(t, m.deployments[c]) {
			t.Errorf("%s: metrics Service port %+v", svcs[0].Name, p)
		}
	}
}

// TestChartOIDC: with an issuer, the control planes read the sign-in
// settings (checkWiring holds every name to the ones weir reads) and the
// client secret from the Secret; the data planes read none of them; an
// issuer without a client id does not render.
func TestChartOIDC(t *testing.T) {
	sv := map[string]any{}
	for k, v := range secretValues {
		sv[k] = v
	}
	sv["oidcClientSecret"] = "client-secret-" + strings.Repeat("x", 8)
	m := render(t, map[string]any{"secrets": sv, "oidc": map[string]any{
		"issuer": "https://id.example.com", "clientID": "weir", "clientSecret": true,
		"redirectURL": "https://weir.example.com/dashboard/oidc/callback", "roles": "admin=alice@example.com",
		"trustedProxies": []any{"10.0.0.0/8", "192.168.0.0/16"}}})
	checkWiring(t, m)
	env := envOf(m.deployments["controlplane"])
	if env["WEIR_OIDC_ISSUER"].Value != "https://id.example.com" || env["WEIR_OIDC_CLIENT_ID"].Value != "weir" ||
		env["WEIR_OIDC_ROLES"].Value != "admin=alice@example.com" || env["WEIR_TRUSTED_PROXIES"].Value != "10.0.0.0/8,192.168.0.0/16" {
		t.Errorf("control plane's sign-in env: %v", env)
	}
	if r := env["WEIR_OIDC_CLIENT_SECRET"].ValueFrom; r == nil || r.SecretKeyRef == nil {
		t.Error("the client secret does not come from the Secret")
	}
	for k := range envOf(m.deployments["dataplane"]) {
		if strings.HasPrefix(k, "WEIR_OIDC_") {
			t.Errorf("the data plane reads %s", k)
		}
	}
	if _, err := renderRaw(map[string]any{"secrets": secretValues, "oidc": map[string]any{"issuer": "https://id.example.com"}}); err == nil ||
		!strings.Contains(err.Error(), "oidc.clientID is required") {
		t.Errorf("an issuer without a client id: %v", err)
	}
}

// TestChartMonitoringCopies: Helm reads only files inside the chart, so it
// ships copies of docs/monitoring; they must not drift from the originals.
func TestChartMonitoringCopies(t *testing.T) {
	for _, f := range []string{"grafana-weir.json", "alerts.yml"} {
		if readFile(t, chartDir+"/files/"+f) != readFile(t, "../../docs/monitoring/"+f) {
			t.Errorf("%s/files/%s differs from docs/monitoring/%s: cp docs/monitoring/%s deploy/helm/weir/files/", chartDir, f, f, f)
		}
	}
}

// checkWiring checks what every rendering must hold, whatever the values.
func checkWiring(t *testing.T, m *manifests) {
	t.Helper()
	vars := configuredVars(t)
	secretKeys := map[string]map[string]bool{}
	for _, s := range m.secrets {
		secretKeys[s.Name] = map[string]bool{}
		for k, v := range s.StringData {
			if v == "" {
				t.Errorf("Secret %s: %s is empty", s.Name, k)
			}
			secretKeys[s.Name][k] = true
		}
	}
	for c, d := range m.deployments {
		pod := d.Spec.Template
		if !labels.SelectorFromSet(d.Spec.Selector.MatchLabels).Matches(labels.Set(pod.Labels)) {
			t.Errorf("%s: the Deployment's selector misses its own pods", c)
		}
		for _, k := range []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
			"app.kubernetes.io/component", "app.kubernetes.io/part-of", "app.kubernetes.io/managed-by", "helm.sh/chart"} {
			if d.Labels[k] == "" || pod.Labels[k] == "" {
				t.Errorf("%s: no %s label", c, k)
			}
		}
		if len(pod.Spec.Containers) != 1 {
			t.Fatalf("%s: %d containers", c, len(pod.Spec.Containers))
		}
		ct := pod.Spec.Containers[0]
		if len(ct.Args) != 3 || ct.Args[0] != c || ct.Args[1] != "--listen" {
			t.Fatalf("%s: args %q, want %s --listen ADDR as compose.yaml runs it", c, ct.Args, c)
		}
		listenPort := portOf(t, ct.Args[2])
		if ct.Resources.Requests.Cpu().IsZero() || ct.Resources.Requests.Memory().IsZero() || ct.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: resources %+v", c, ct.Resources)
		}

		// Probes hit paths the process serves, on the port it listens on.
		probes := map[string]*corev1.Probe{"liveness": ct.LivenessProbe, "readiness": ct.ReadinessProbe, "startup": ct.StartupProbe}
		want := map[string]string{"liveness": "/healthz", "readiness": "/healthz"}
		if c == "controlplane" {
			want = map[string]string{"liveness": "/healthz", "readiness": "/readyz", "startup": "/healthz"}
		}
		for kind, p := range probes {
			if p == nil {
				if want[kind] != "" {
					t.Errorf("%s: no %s probe", c, kind)
				}
				continue
			}
			g := p.HTTPGet
			if g == nil || g.Path != want[kind] {
				t.Errorf("%s: %s probe %+v, want GET %s", c, kind, p.ProbeHandler, want[kind])
				continue
			}
			if !servesPath(t, c, g.Path) {
				t.Errorf("%s: %s probe hits %s, which %s/server.go does not serve", c, kind, g.Path, c)
			}
			if port := resolvePort(t, ct, g.Port); port != listenPort {
				t.Errorf("%s: %s probe on port %d, the process listens on %d", c, kind, port, listenPort)
			}
		}

		// Every variable is one the process reads; secrets come from the
		// Secret, by keys it has.
		for _, e := range ct.Env {
			usedBy, ok := vars[e.Name]
			if !ok {
				t.Errorf("%s: sets %s, which docs/configuration.md does not list", c, e.Name)
			} else if !strings.Contains(usedBy, c) && usedBy != "all" {
				t.Errorf("%s: sets %s, which only %s reads", c, e.Name, usedBy)
			}
			if r := e.ValueFrom; r != nil && r.SecretKeyRef != nil && len(m.secrets) > 0 {
				if !secretKeys[r.SecretKeyRef.Name][r.SecretKeyRef.Key] {
					t.Errorf("%s: %s from Secret %s key %s, which the chart's Secret lacks", c, e.Name, r.SecretKeyRef.Name, r.SecretKeyRef.Key)
				}
			}
		}
		for _, name := range map[string][]string{
			"controlplane": {"WEIR_DATABASE_URL", "WEIR_ADMIN_TOKEN", "WEIR_DATAPLANE_TOKEN", "WEIR_SECRET_KEY"},
			"dataplane":    {"WEIR_DATAPLANE_TOKEN"},
		}[c] {
			if e := envOf(d)[name]; e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.Value != "" {
				t.Errorf("%s: %s does not come from a Secret", c, name)
			}
		}

		// Metrics: the port the variable listens on, and what the
		// annotations tell Prometheus.
		mp := metricsPortOf(t, d)
		if mp == listenPort {
			t.Errorf("%s: metrics on the serving port", c)
		}
		if containerPort(t, d, "metrics") != mp {
			t.Errorf("%s: container port metrics is not %d, where WEIR_*_METRICS_ADDR listens", c, mp)
		}
		a := pod.Annotations
		if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != strconv.Itoa(int(mp)) || a["prometheus.io/path"] != "/metrics" {
			t.Errorf("%s: prometheus.io annotations %v, want port %d", c, a, mp)
		}
	}

	// Services and PDBs select the pods of exactly one component.
	selects := func(what string, sel map[string]string) *appsv1.Deployment {
		var hit []*appsv1.Deployment
		for _, d := range m.deployments {
			if len(sel) > 0 && labels.SelectorFromSet(sel).Matches(labels.Set(d.Spec.Template.Labels)) {
				hit = append(hit, d)
			}
		}
		if len(hit) != 1 {
			t.Errorf("%s selects the pods of %d Deployments", what, len(hit))
			return nil
		}
		return hit[0]
	}
	for _, p := range m.pdbs {
		if p.Spec.Selector == nil {
			t.Errorf("PodDisruptionBudget %s has no selector", p.Name)
			continue
		}
		selects("PodDisruptionBudget "+p.Name, p.Spec.Selector.MatchLabels)
	}
	if len(m.pdbs) != 2 {
		t.Errorf("%d PodDisruptionBudgets, want one per component", len(m.pdbs))
	}
	svcs := map[string]*corev1.Service{}
	for _, s := range m.services {
		d := selects("Service "+s.Name, s.Spec.Selector)
		if d == nil {
			continue
		}
		for _, p := range s.Spec.Ports {
			resolvePort(t, d.Spec.Template.Spec.Containers[0], p.TargetPort)
		}
		svcs[s.Name] = s
	}

	// Data planes reach the control planes through their Service, on its
	// port, which leads to the port they listen on.
	u, err := url.Parse(envOf(m.deployments["dataplane"])["WEIR_CONTROLPLANE_URL"].Value)
	if err != nil {
		t.Fatal(err)
	}
	cps := svcs[u.Hostname()]
	if cps == nil || cps.Spec.Selector["app.kubernetes.io/component"] != "controlplane" {
		t.Fatalf("WEIR_CONTROLPLANE_URL %s is not the control plane's Service", u)
	}
	cp := m.deployments["controlplane"].Spec.Template.Spec.Containers[0]
	if p := cps.Spec.Ports[0]; strconv.Itoa(int(p.Port)) != u.Port() || resolvePort(t, cp, p.TargetPort) != portOf(t, cp.Args[2]) {
		t.Errorf("WEIR_CONTROLPLANE_URL %s does not reach the control plane's listener through %+v", u, p)
	}
}

// configuredVars reads docs/configuration.md's table (generated from the
// binary): variable -> the processes that read it.
func configuredVars(t *testing.T) map[string]string {
	t.Helper()
	row := regexp.MustCompile("(?m)^\\| `(WEIR_[A-Z0-9_]+)` \\| ([^|]+) \\|")
	vars := map[string]string{}
	for _, r := range row.FindAllStringSubmatch(readFile(t, "../../docs/configuration.md"), -1) {
		vars[r[1]] = strings.TrimSpace(r[2])
	}
	if len(vars) < 20 {
		t.Fatalf("docs/configuration.md: %d variables read, the table's format changed", len(vars))
	}
	return vars
}

// servesPath says whether the process's handler registers GET path.
func servesPath(t *testing.T, process, path string) bool {
	return strings.Contains(readFile(t, "../../"+process+"/server.go"), `"GET `+path+`"`)
}

func envOf(d *appsv1.Deployment) map[string]corev1.EnvVar {
	env := map[string]corev1.EnvVar{}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		env[e.Name] = e
	}
	return env
}

// metricsPortOf is the port WEIR_{DATAPLANE,CONTROLPLANE}_METRICS_ADDR
// listens on.
func metricsPortOf(t *testing.T, d *appsv1.Deployment) int32 {
	t.Helper()
	c := d.Labels["app.kubernetes.io/component"]
	name := "WEIR_" + strings.ToUpper(c) + "_METRICS_ADDR"
	v := envOf(d)[name].Value
	if v == "" {
		t.Fatalf("%s: %s unset, so /metrics is on the serving port", c, name)
	}
	return portOf(t, v)
}

func containerPort(t *testing.T, d *appsv1.Deployment, name string) int32 {
	t.Helper()
	return resolvePort(t, d.Spec.Template.Spec.Containers[0], intstr.FromString(name))
}

// resolvePort is the container port a probe or Service port names.
func resolvePort(t *testing.T, c corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntVal
	}
	i := slices.IndexFunc(c.Ports, func(cp corev1.ContainerPort) bool { return cp.Name == p.StrVal })
	if i < 0 {
		t.Fatalf("%s: no container port named %q", c.Name, p.StrVal)
	}
	return c.Ports[i].ContainerPort
}

func portOf(t *testing.T, addr string) int32 {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	n, err2 := strconv.Atoi(port)
	if err != nil || err2 != nil {
		t.Fatalf("address %q has no port", addr)
	}
	return int32(n)
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
