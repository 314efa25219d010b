package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/weirhq/weir/controlplane"
	"github.com/weirhq/weir/controlplane/seal"
	"github.com/weirhq/weir/dataplane"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/rpcclient"
	"github.com/weirhq/weir/internal/sim"
	"github.com/weirhq/weir/internal/stack"
	"github.com/weirhq/weir/internal/telemetry"
)

// demoAccounts are seeded by `weir dev --simulate`, pointed at the simulator.
// The two subscriptions have usage windows in the simulator: demo-max-1's
// week resets sooner, so weir drains it first (HARVEST). The two ChatGPT
// logins serve Codex on /v1/responses (demo-codex-1's week resets sooner);
// the OpenAI key serves /v1/chat/completions and /v1/responses too.
var demoAccounts = []struct {
	label, credential string
	provider          weirv1.Provider
	kind              weirv1.AuthKind
	windows           *sim.Windows
	// chatgptID is a ChatGPT login's account id.
	chatgptID string
}{
	{"demo-api-key", "sk-ant-api03-weir-demo-0000000000000001", weirv1.Provider_PROVIDER_ANTHROPIC, weirv1.AuthKind_AUTH_KIND_API_KEY, nil, ""},
	{"demo-max-1", "sk-ant-oat01-weir-demo-0000000000000002", weirv1.Provider_PROVIDER_ANTHROPIC, weirv1.AuthKind_AUTH_KIND_OAUTH, &sim.Windows{
		FiveHour: &sim.Window{Limit: 2_000_000, Used: 300_000, ResetIn: sim.Duration(3 * time.Hour)},
		SevenDay: &sim.Window{Limit: 20_000_000, Used: 12_000_000, ResetIn: sim.Duration(30 * time.Hour)},
	}, ""},
	{"demo-max-2", "sk-ant-oat01-weir-demo-0000000000000003", weirv1.Provider_PROVIDER_ANTHROPIC, weirv1.AuthKind_AUTH_KIND_OAUTH, &sim.Windows{
		FiveHour: &sim.Window{Limit: 2_000_000, Used: 100_000, ResetIn: sim.Duration(4 * time.Hour)},
		SevenDay: &sim.Window{Limit: 20_000_000, Used: 2_000_000, ResetIn: sim.Duration(100 * time.Hour)},
	}, ""},
	{"demo-codex-1", "weir-demo-chatgpt-access-0000000000000004", weirv1.Provider_PROVIDER_CODEX, weirv1.AuthKind_AUTH_KIND_OAUTH, &sim.Windows{
		FiveHour: &sim.Window{Limit: 2_000_000, Used: 200_000, ResetIn: sim.Duration(2 * time.Hour)},
		SevenDay: &sim.Window{Limit: 20_000_000, Used: 9_000_000, ResetIn: sim.Duration(40 * time.Hour)},
	}, "00000000-0000-4000-8000-000000000004"},
	{"demo-codex-2", "weir-demo-chatgpt-access-0000000000000005", weirv1.Provider_PROVIDER_CODEX, weirv1.AuthKind_AUTH_KIND_OAUTH, &sim.Windows{
		FiveHour: &sim.Window{Limit: 2_000_000, Used: 50_000, ResetIn: sim.Duration(4 * time.Hour)},
		SevenDay: &sim.Window{Limit: 20_000_000, Used: 1_000_000, ResetIn: sim.Duration(120 * time.Hour)},
	}, "00000000-0000-4000-8000-000000000005"},
	{"demo-openai", "sk-proj-weir-demo-0000000000000006", weirv1.Provider_PROVIDER_OPENAI, weirv1.AuthKind_AUTH_KIND_API_KEY, nil, ""},
}

// demoBaseURL is where a demo account points in the simulator: the
// provider's layout under the simulator's root.
func demoBaseURL(simURL string, p weirv1.Provider) string {
	switch p {
	case weirv1.Provider_PROVIDER_CODEX:
		return simURL + "/backend-api"
	case weirv1.Provider_PROVIDER_OPENAI:
		return simURL + "/v1"
	}
	return simURL
}

func runDev(ctx context.Context, args []string, e env) error {
	fs := flag.NewFlagSet("weir dev", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	dataDir := fs.String("data-dir", defaultDataDir(e), "where weir keeps its Postgres cluster, secrets and dev.json (env WEIR_DATA_DIR)")
	simulate := fs.Bool("simulate", false, "run the upstream simulator and seed demo accounts pointed at it")
	dpAddr := fs.String("listen", envOr(e, "WEIR_DATAPLANE_LISTEN", defaultDataplaneAddr), "data-plane address (what agents connect to)")
	cpAddr := fs.String("controlplane-listen", envOr(e, "WEIR_CONTROLPLANE_LISTEN", defaultControlplaneAddr), "control-plane address")
	simAddr := fs.String("sim-listen", defaultSimAddr, "simulator address (with --simulate)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("weir dev: unexpected argument %q", fs.Arg(0))
	}
	log := newLogger(e)
	if err := os.MkdirAll(*dataDir, 0o700); err != nil {
		return fmt.Errorf("weir dev: data dir: %w", err)
	}
	prev, _ := readDevInfo(*dataDir)
	secrets, err := devSecrets(e, *dataDir, prev)
	if err != nil {
		return fmt.Errorf("weir dev: %w", err)
	}

	// Listen first: a busy port should fail before Postgres starts.
	dpLn, err := listen(*dpAddr, "data plane")
	if err != nil {
		return err
	}
	defer dpLn.Close()
	cpLn, err := listen(*cpAddr, "control plane")
	if err != nil {
		return err
	}
	defer cpLn.Close()
	var simLn net.Listener
	if *simulate {
		if simLn, err = listen(*simAddr, "simulator"); err != nil {
			return err
		}
		defer simLn.Close()
	}

	// Everything stops when the user interrupts or any part fails.
	ctx, cancelAll := context.WithCancelCause(ctx)
	defer cancelAll(nil)
	opts := stack.Options{Logger: log, ControlPlaneListener: cpLn, SimListener: simLn,
		Exited: func(part string, err error) {
			if err == nil {
				err = fmt.Errorf("%s stopped", part)
			}
			cancelAll(err)
		}}
	if dbURL := e.getenv("WEIR_DATABASE_URL"); dbURL != "" {
		pool, err := openPool(ctx, dbURL)
		if err != nil {
			return fmt.Errorf("weir dev: %w", err)
		}
		defer pool.Close()
		opts.Pool = pool
	} else {
		opts.PostgresDir = filepath.Join(*dataDir, "postgres")
		fmt.Fprintln(e.stderr, "starting embedded Postgres in", opts.PostgresDir, "…")
	}

	opts.ControlPlane = controlplane.Config{AdminToken: secrets.admin, DataplaneToken: secrets.dataplane,
		SecretKey: secrets.key, PreviousSecretKeys: secrets.previous, Logger: log}
	if err := capacityConfig(e, &opts.ControlPlane); err != nil {
		return fmt.Errorf("weir dev: %w", err)
	}
	if err := metricsConfig(e, &opts.ControlPlane); err != nil {
		return fmt.Errorf("weir dev: %w", err)
	}
	cpTP, stopCPTracing, err := tracing(ctx, e, telemetry.ServiceControlplane, log)
	if err != nil {
		return fmt.Errorf("weir dev: %w", err)
	}
	defer stopCPTracing()
	opts.ControlPlane.TracerProvider = cpTP
	dpTP, stopDPTracing, err := tracing(ctx, e, telemetry.ServiceDataplane, log)
	if err != nil {
		return fmt.Errorf("weir dev: %w", err)
	}
	defer stopDPTracing()
	if *simulate {
		opts.Sim = &sim.Config{Logger: log.With("component", "sim"), Script: demoScript(), DeltaDelay: 30 * time.Millisecond}
	}
	st, err := stack.Start(ctx, opts)
	if err != nil {
		return fmt.Errorf("weir dev: %w", err)
	}

	info := devInfo{DataplaneURL: "http://" + dpLn.Addr().String(), ControlplaneURL: st.ControlPlaneURL, SimulatorURL: st.SimURL,
		AdminToken: secrets.admin, DataplaneToken: secrets.dataplane}
	if *simulate {
		key, err := seedDemo(ctx, st.ControlPlaneURL, secrets, st.SimURL, prev.ClientKey)
		if err != nil {
			st.Stop(ctx) //nolint:errcheck // the seeding's error is the news
			return fmt.Errorf("weir dev: seed demo: %w", err)
		}
		info.ClientKey = key
	}
	if err := writeDevInfo(*dataDir, info); err != nil {
		log.Warn("write dev.json", "err", err)
	}
	// Operator commands without --data-dir find this data dir through it.
	if err := writeDevPointer(e, devPointer{ControlplaneURL: st.ControlPlaneURL, DataDir: *dataDir}); err != nil {
		log.Warn("write the dev pointer", "path", devPointerPath(e), "err", err)
	} else {
		// A pointer left behind names a data dir whose weir dev is gone:
		// the CLI then says it cannot reach it.
		defer os.Remove(devPointerPath(e)) //nolint:errcheck // as above
	}
	if _, err := st.StartWorker(dataplane.Config{TracerProvider: dpTP}, dpLn); err != nil {
		st.Stop(ctx) //nolint:errcheck // the worker's error is the news
		return fmt.Errorf("weir dev: %w", err)
	}
	printBanner(e.stdout, info, *dataDir)

	<-ctx.Done()
	// The stack stops the data plane first: its requests in flight
	// release their leases through the control plane, which stops after.
	if err := st.Stop(ctx); err != nil {
		return err
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}

// demoScript names the demo accounts in the simulator after their labels,
// so faults can be scripted per account: POST /_sim/accounts/demo-max-1/faults.
func demoScript() sim.Script {
	sc := sim.Script{AcceptUnknown: true}
	for _, d := range demoAccounts {
		kind := sim.KindAPIKey
		switch {
		case d.provider == weirv1.Provider_PROVIDER_CODEX:
			kind = sim.KindChatGPT
		case d.provider == weirv1.Provider_PROVIDER_OPENAI:
			kind = sim.KindOpenAIKey
		case d.kind == weirv1.AuthKind_AUTH_KIND_OAUTH:
			kind = sim.KindOAuth
		}
		sc.Accounts = append(sc.Accounts, sim.AccountScript{Name: d.label, Credential: d.credential, Kind: kind,
			Windows: d.windows, ChatGPTAccountID: d.chatgptID})
	}
	return sc
}

type secretSet struct {
	admin, dataplane string
	key              []byte
	previous         [][]byte
}

// devSecrets takes tokens and the sealing key from the environment, else
// from an earlier run's files, else makes new ones (kept with mode 0600).
func devSecrets(e env, dataDir string, prev devInfo) (secretSet, error) {
	s := secretSet{admin: e.getenv("WEIR_ADMIN_TOKEN"), dataplane: e.getenv("WEIR_DATAPLANE_TOKEN")}
	if s.admin == "" {
		s.admin = prev.AdminToken
	}
	if s.admin == "" {
		s.admin = "weir_admin_" + randid.Hex(24)
	}
	if s.dataplane == "" {
		s.dataplane = prev.DataplaneToken
	}
	if s.dataplane == "" {
		s.dataplane = "weir_dp_" + randid.Hex(24)
	}
	var err error
	if s.previous, err = previousSecretKeys(e); err != nil {
		return s, err
	}
	if raw := e.getenv("WEIR_SECRET_KEY"); raw != "" {
		k, err := seal.ParseSecretKey(raw)
		if err != nil {
			return s, fmt.Errorf("WEIR_SECRET_KEY: %w", err)
		}
		s.key = k
		return s, nil
	}
	path := filepath.Join(dataDir, "secret.key")
	if raw, err := os.ReadFile(path); err == nil {
		k, err := seal.ParseSecretKey(string(raw))
		if err != nil {
			return s, fmt.Errorf("%s: %w", path, err)
		}
		s.key = k
		return s, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return s, err
	}
	s.key = randid.Bytes(32)
	if err := os.WriteFile(path, []byte(hex.EncodeToString(s.key)+"\n"), 0o600); err != nil {
		return s, fmt.Errorf("write %s: %w", path, err)
	}
	return s, nil
}

func writeDevInfo(dataDir string, d devInfo) error {
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dataDir, ".dev.json.tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dataDir, "dev.json"))
}

// seedDemo points the demo accounts at this run's simulator and returns a
// working client key, reusing the previous run's when it is still valid.
func seedDemo(ctx context.Context, cpURL string, secrets secretSet, simURL, prevKey string) (string, error) {
	hc := rpcclient.HTTPClient()
	admin := connect.WithInterceptors(rpcclient.Token(secrets.admin), rpcclient.Actor("weir dev"))
	accounts := weirv1connect.NewAccountServiceClient(hc, cpURL, admin)
	keys := weirv1connect.NewKeyServiceClient(hc, cpURL, admin)
	leases := weirv1connect.NewLeaseServiceClient(hc, cpURL, connect.WithInterceptors(rpcclient.Token(secrets.dataplane)))

	if err := waitReady(ctx, accounts); err != nil {
		return "", err
	}
	for _, d := range demoAccounts {
		base := demoBaseURL(simURL, d.provider)
		got, err := accounts.GetAccount(ctx, connect.NewRequest(&weirv1.GetAccountRequest{Id: d.label}))
		switch {
		case connect.CodeOf(err) == connect.CodeNotFound:
			_, err = accounts.CreateAccount(ctx, connect.NewRequest(&weirv1.CreateAccountRequest{
				Provider: d.provider, AuthKind: d.kind, Label: d.label,
				Credential: d.credential, BaseUrl: base, MaxConcurrency: 8, UpstreamAccountId: d.chatgptID,
			}))
		case err == nil && got.Msg.Account.BaseUrl != base:
			req := &weirv1.UpdateAccountRequest{Id: d.label, BaseUrl: base}
			req.UpdateMask = fieldMask("base_url")
			_, err = accounts.UpdateAccount(ctx, connect.NewRequest(req))
		}
		if err != nil {
			return "", fmt.Errorf("account %s: %w", d.label, err)
		}
	}
	if prevKey != "" {
		if _, err := leases.VerifyKey(ctx, connect.NewRequest(&weirv1.VerifyKeyRequest{KeyHash: controlplane.HashKey(prevKey)})); err == nil {
			return prevKey, nil
		}
	}
	resp, err := keys.CreateKey(ctx, connect.NewRequest(&weirv1.CreateKeyRequest{Name: "dev-" + randid.Hex(3)}))
	if err != nil {
		return "", fmt.Errorf("create key: %w", err)
	}
	return resp.Msg.Secret, nil
}

// waitReady waits until the control plane answers.
func waitReady(ctx context.Context, c weirv1connect.AccountServiceClient) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		_, err := c.ListAccounts(ctx, connect.NewRequest(&weirv1.ListAccountsRequest{}))
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("control plane not ready: %w", err)
		case <-tick.C:
		}
	}
}

func printBanner(w io.Writer, d devInfo, dataDir string) {
	var b strings.Builder
	fmt.Fprintf(&b, "\nweir dev is running. Ctrl-C stops it.\n\n")
	fmt.Fprintf(&b, "  data plane     %s   (point agents here)\n", d.DataplaneURL)
	fmt.Fprintf(&b, "  control plane  %s\n", d.ControlplaneURL)
	fmt.Fprintf(&b, "  dashboard      %s/dashboard/   (sign in with admin_token from dev.json)\n", d.ControlplaneURL)
	if d.SimulatorURL != "" {
		fmt.Fprintf(&b, "  simulator      %s   (%d demo accounts point here)\n", d.SimulatorURL, len(demoAccounts))
	}
	fmt.Fprintf(&b, "  data dir       %s   (dev.json has these URLs and tokens)\n\n", dataDir)
	key := d.ClientKey
	if key == "" {
		key = "<a key from: weir keys create NAME>"
	}
	fmt.Fprintf(&b, "Claude Code:\n")
	fmt.Fprintf(&b, "  export ANTHROPIC_BASE_URL=%s\n", d.DataplaneURL)
	fmt.Fprintf(&b, "  export ANTHROPIC_API_KEY=%s\n", key)
	fmt.Fprintf(&b, "  export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1\n")
	fmt.Fprintf(&b, "  claude -p \"hello\"\n\n")
	fmt.Fprintf(&b, "Codex (in $CODEX_HOME/config.toml):\n")
	fmt.Fprintf(&b, "  model_provider = \"weir\"\n")
	fmt.Fprintf(&b, "  [model_providers.weir]\n")
	fmt.Fprintf(&b, "  name = \"weir\"\n  base_url = \"%s/v1\"\n  env_key = \"WEIR_KEY\"\n  wire_api = \"responses\"\n", d.DataplaneURL)
	fmt.Fprintf(&b, "then: WEIR_KEY=%s codex exec \"hello\"\n\n", key)
	fmt.Fprintf(&b, "Operator commands find this instance through dev.json:\n")
	fmt.Fprintf(&b, "  weir accounts list\n  weir keys list\n  weir routes\n\n")
	io.WriteString(w, b.String()) //nolint:errcheck // stdout
}
