package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/weirhq/weir/internal/pgtest"
)

// composeFile is the part of compose.yaml the test runs.
type composeFile struct {
	Services map[string]struct {
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		DependsOn map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
	} `yaml:"services"`
}

// TestComposeTopology runs compose.yaml's weir services (the control plane,
// both data planes and the simulator) as the file describes them: their
// commands and environment, with only the addresses a container network
// would provide rewritten, and waits on their own health checks. Then an
// agent's request goes through each data plane. No Docker engine is needed:
// the file is checked against the binary it starts.
func TestComposeTopology(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cf composeFile
	if err := yaml.Unmarshal(raw, &cf); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	for _, name := range []string{"postgres", "controlplane", "dataplane-1", "dataplane-2", "sim"} {
		if _, ok := cf.Services[name]; !ok {
			t.Fatalf("compose.yaml has no service %q", name)
		}
	}
	for _, dp := range []string{"dataplane-1", "dataplane-2"} {
		if cf.Services[dp].DependsOn["controlplane"].Condition != "service_healthy" {
			t.Errorf("%s does not wait for a healthy control plane", dp)
		}
	}

	// What a container network provides: the hosts, and one port per
	// service (here each process gets its own loopback port).
	ports := map[string]string{}
	for _, name := range []string{"controlplane", "dataplane-1", "dataplane-2", "sim"} {
		ports[name] = freePort(t)
	}
	secrets := map[string]string{
		"WEIR_ADMIN_TOKEN":     "compose-admin-" + randomHex(12),
		"WEIR_DATAPLANE_TOKEN": "compose-dp-" + randomHex(12),
		"WEIR_SECRET_KEY":      randomHex(32),
	}
	dbURL := pgtest.NewURL(t)
	required := regexp.MustCompile(`^\$\{(\w+):\?[^}]*\}$`)
	rewrite := func(service, v string) string {
		if m := required.FindStringSubmatch(v); m != nil {
			s, ok := secrets[m[1]]
			if !ok {
				t.Fatalf("%s needs %s, which the test does not know", service, m[1])
			}
			return s
		}
		if strings.HasPrefix(v, "postgres://") {
			return dbURL
		}
		v = strings.ReplaceAll(v, "http://controlplane:7481", "http://127.0.0.1:"+ports["controlplane"])
		for _, p := range []string{"7480", "7481", "7482"} {
			v = strings.ReplaceAll(v, "0.0.0.0:"+p, "127.0.0.1:"+ports[service])
			v = strings.ReplaceAll(v, "127.0.0.1:"+p+"/", "127.0.0.1:"+ports[service]+"/")
		}
		return v
	}

	ctx, cancel := context.WithCancel(t.Context())
	done := map[string]chan error{}
	start := func(name string) {
		svc := cf.Services[name]
		vars := map[string]string{}
		for k, v := range svc.Environment {
			vars[k] = rewrite(name, v)
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
		check := svc.Healthcheck.Test
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
	for _, name := range []string{"sim", "controlplane", "dataplane-1", "dataplane-2"} {
		start(name)
	}

	// An operator adds an account pointed at the simulator, and a key.
	admin := map[string]string{"WEIR_CONTROLPLANE_URL": "http://127.0.0.1:" + ports["controlplane"],
		"WEIR_ADMIN_TOKEN": secrets["WEIR_ADMIN_TOKEN"]}
	e, _, errOut := testEnv(admin, "sk-ant-api03-compose-"+randomHex(8))
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
	for _, dp := range []string{"dataplane-1", "dataplane-2"} {
		resp, body := postMessage(t, "http://127.0.0.1:"+ports[dp], key, hello)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "weir upstream simulator") {
			t.Errorf("%s: %d %s", dp, resp.StatusCode, body)
		}
	}
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
