package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/weirhq/weir/internal/pgtest"
	"github.com/weirhq/weir/internal/randid"
)

// The weir services of compose.yaml, in the order its depends_on starts
// them.
var (
	composeControlPlanes = []string{"controlplane-1", "controlplane-2"}
	composeDataPlanes    = []string{"dataplane-1", "dataplane-2", "dataplane-3"}
)

// TestComposeTopology runs compose.yaml's weir services (both control
// planes, the three data planes and the simulator) as the compose loader
// reads them: their commands and environment, with only the addresses a
// container network would provide rewritten, and waits on their own
// health checks. Then an agent's request goes through each data plane. No
// Docker engine is needed: the file is checked against the binary it
// starts.
func TestComposeTopology(t *testing.T) {
	t.Parallel()
	secrets := map[string]string{
		"WEIR_ADMIN_TOKEN":     "compose-admin-" + randid.Hex(12),
		"WEIR_DATAPLANE_TOKEN": "compose-dp-" + randid.Hex(12),
		"WEIR_SECRET_KEY":      randid.Hex(32),
	}
	project := loadCompose(t, secrets)
	services := map[string]types.ServiceConfig{}
	for _, name := range append(append([]string{"postgres", "sim"}, composeControlPlanes...), composeDataPlanes...) {
		svc, err := project.GetService(name)
		if err != nil {
			t.Fatalf("compose.yaml: %v", err)
		}
		services[name] = svc
	}
	// One address for every control plane: the alias Docker's DNS answers
	// with all of them.
	for _, cp := range composeControlPlanes {
		if n := services[cp].Networks["default"]; n == nil || !slices.Contains(n.Aliases, "controlplane") {
			t.Errorf("%s is not reachable as controlplane", cp)
		}
		if services[cp].DependsOn["postgres"].Condition != types.ServiceConditionHealthy {
			t.Errorf("%s does not wait for a healthy Postgres", cp)
		}
	}
	for _, dp := range composeDataPlanes {
		for _, cp := range composeControlPlanes {
			if services[dp].DependsOn[cp].Condition != types.ServiceConditionHealthy {
				t.Errorf("%s does not wait for a healthy %s", dp, cp)
			}
		}
	}

	// What a container network provides: the hosts, and one port per
	// service (here each process gets its own loopback port). The alias
	// controlplane resolves to either control plane; here the data planes
	// take them in turn, so both serve leases.
	ports := map[string]string{}
	for name := range services {
		if name != "postgres" { // the test's own cluster stands in for it
			ports[name] = freePort(t)
		}
	}
	dbURL := pgtest.NewURL(t)
	rewrite := func(service, v string) string {
		if strings.HasPrefix(v, "postgres://") {
			return dbURL
		}
		if i := slices.Index(composeDataPlanes, service); i >= 0 {
			cp := composeControlPlanes[i%len(composeControlPlanes)]
			v = strings.ReplaceAll(v, "http://controlplane:7481", "http://127.0.0.1:"+ports[cp])
		}
		for _, p := range []string{"7480", "7481", "7482"} {
			v = strings.ReplaceAll(v, "0.0.0.0:"+p, "127.0.0.1:"+ports[service])
			v = strings.ReplaceAll(v, "127.0.0.1:"+p+"/", "127.0.0.1:"+ports[service]+"/")
		}
		return v
	}

	ctx, cancel := context.WithCancel(t.Context())
	done := map[string]chan error{}
	start := func(name string) {
		svc := services[name]
		vars := map[string]string{}
		for k, v := range svc.Environment {
			if v == nil {
				t.Fatalf("%s: %s has no value", name, k)
			}
			vars[k] = rewrite(name, *v)
		}
		var args []string
		for _, a := range svc.Command {
			args = append(args, rewrite(name, a))
		}
		e, _, errOut := testEnv(vars, "")
		ch := make(chan error, 1)
		done[name] = ch
		go func() { ch <- run(ctx, args, e) }()
		// The service's own health check, as compose runs it.
		if svc.HealthCheck == nil {
			t.Fatalf("%s has no health check", name)
		}
		check := svc.HealthCheck.Test
		if len(check) < 4 || check[0] != "CMD" || check[1] != "/usr/local/bin/weir" || check[2] != "health" {
			t.Fatalf("%s: health check %q is not `weir health URL`", name, check)
		}
		url := rewrite(name, check[3])
		deadline := time.Now().Add(60 * time.Second)
		for {
			he, _, _ := testEnv(nil, "")
			if run(ctx, []string{"health", url}, he) == nil {
				return
			}
			select {
			case err := <-ch:
				t.Fatalf("%s exited: %v\n%s", name, err, errOut.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not healthy at %s after 60s\n%s", name, url, errOut.String())
			}
			time.Sleep(50 * time.Millisecond) //nolint:forbidigo // polling another process's health, as compose does
		}
	}
	t.Cleanup(func() {
		cancel()
		for name, ch := range done {
			select {
			case <-ch:
			case <-time.After(15 * time.Second):
				t.Errorf("%s did not stop", name)
			}
		}
	})
	// The order compose's depends_on gives.
	for _, name := range append(append([]string{"sim"}, composeControlPlanes...), composeDataPlanes...) {
		start(name)
	}

	// An operator adds an account pointed at the simulator, and a key.
	admin := map[string]string{"WEIR_CONTROLPLANE_URL": "http://127.0.0.1:" + ports["controlplane-1"],
		"WEIR_ADMIN_TOKEN": secrets["WEIR_ADMIN_TOKEN"]}
	e, _, errOut := testEnv(admin, "sk-ant-api03-compose-"+randid.Hex(8))
	if err := run(ctx, []string{"accounts", "add", "--label", "compose", "--secret-stdin",
		"--base-url", "http://127.0.0.1:" + ports["sim"]}, e); err != nil {
		t.Fatalf("accounts add: %v\n%s", err, errOut.String())
	}
	e, out, errOut := testEnv(admin, "")
	if err := run(ctx, []string{"keys", "create", "compose-agent", "--json"}, e); err != nil {
		t.Fatalf("keys create: %v\n%s", err, errOut.String())
	}
	var created struct{ Secret string }
	json.Unmarshal([]byte(out.String()), &created) //nolint:errcheck // checked below
	key := created.Secret
	if !strings.HasPrefix(key, "weir_sk_") {
		t.Fatalf("no key in %s", out.String())
	}
	for _, dp := range composeDataPlanes {
		resp, body := postMessage(t, "http://127.0.0.1:"+ports[dp], key, hello)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "weir upstream simulator") {
			t.Errorf("%s: %d %s", dp, resp.StatusCode, body)
		}
	}
}

// loadCompose loads compose.yaml as `docker compose --profile simulate`
// would, with the secrets in its environment.
func loadCompose(t *testing.T, env map[string]string) *types.Project {
	t.Helper()
	raw, err := os.ReadFile("../../compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	project, err := loader.LoadWithContext(t.Context(), types.ConfigDetails{
		WorkingDir:  "../..",
		ConfigFiles: []types.ConfigFile{{Filename: "compose.yaml", Content: raw}},
		Environment: env,
	}, func(o *loader.Options) { o.Profiles = []string{"simulate"} })
	if err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	return project
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}
