package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"runtime"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
	"github.com/weirhq/weir/internal/rpcclient"
)

// devInfo is what `weir dev` writes to dev.json in its data directory, so
// scripts and operator commands on the same machine can find it.
type devInfo struct {
	DataplaneURL    string `json:"dataplane_url"`
	ControlplaneURL string `json:"controlplane_url"`
	SimulatorURL    string `json:"simulator_url,omitempty"`
	AdminToken      string `json:"admin_token"`
	DataplaneToken  string `json:"dataplane_token"`
	ClientKey       string `json:"client_key,omitempty"`
}

// defaultDataDir is $WEIR_DATA_DIR, else the user's data directory.
func defaultDataDir(e env) string {
	if d := e.getenv("WEIR_DATA_DIR"); d != "" {
		return d
	}
	if d := e.getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "weir")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "weir")
	}
	if runtime.GOOS == "darwin" {
		return filepath.Join(home, "Library", "Application Support", "weir")
	}
	return filepath.Join(home, ".local", "share", "weir")
}

func readDevInfo(dataDir string) (devInfo, error) {
	var d devInfo
	b, err := os.ReadFile(filepath.Join(dataDir, "dev.json"))
	if err != nil {
		return d, err
	}
	return d, json.Unmarshal(b, &d)
}

// devPointer is what a running `weir dev` leaves at devPointerPath: where
// it runs, no secret (its data dir's dev.json holds the tokens).
type devPointer struct {
	ControlplaneURL string `json:"controlplane_url"`
	DataDir         string `json:"data_dir"`
}

// devPointerPath is the per-user place of the pointer:
// $XDG_RUNTIME_DIR/weir/dev.json, else $XDG_STATE_HOME/weir/dev.json
// (~/.local/state by default).
func devPointerPath(e env) string {
	if d := e.getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "weir", "dev.json")
	}
	if d := e.getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "weir", "dev.json")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "weir", "dev.json")
	}
	return filepath.Join(home, ".local", "state", "weir", "dev.json")
}

func writeDevPointer(e env, p devPointer) error {
	path := devPointerPath(e)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o600)
}

// findDev reads the running `weir dev`'s dev.json: in dataDir, else in the
// data dir the pointer names.
func findDev(e env, dataDir string) (devInfo, error) {
	d, err := readDevInfo(dataDir)
	if err == nil {
		return d, nil
	}
	b, perr := os.ReadFile(devPointerPath(e))
	var p devPointer
	if perr != nil || json.Unmarshal(b, &p) != nil || p.DataDir == "" {
		return d, err
	}
	return readDevInfo(p.DataDir)
}

// adminFlags are shared by every operator command.
type adminFlags struct {
	env          env
	controlplane string
	token        string
	actor        string
	dataDir      string
	json         bool
}

func (a *adminFlags) register(fs *flag.FlagSet, e env) {
	fs.StringVar(&a.controlplane, "controlplane", e.getenv("WEIR_CONTROLPLANE_URL"), "control-plane URL (env WEIR_CONTROLPLANE_URL; default: the running 'weir dev')")
	fs.StringVar(&a.dataDir, "data-dir", defaultDataDir(e), "where 'weir dev' keeps dev.json (env WEIR_DATA_DIR)")
	fs.BoolVar(&a.json, "json", false, "print JSON")
	a.token = e.getenv("WEIR_ADMIN_TOKEN")
	a.env = e
	a.actor = operatorName(e)
}

// operatorName is who the audit log records as the actor of this
// command's changes: $WEIR_ACTOR, else user@host. The control plane
// cannot verify it; only the admin token is checked.
func operatorName(e env) string {
	if v := e.getenv("WEIR_ACTOR"); v != "" {
		return v
	}
	name := e.getenv("USER")
	if u, err := user.Current(); name == "" && err == nil {
		name = u.Username
	}
	if host, err := os.Hostname(); err == nil {
		return name + "@" + host
	}
	return name
}

// clients resolve the control plane and token, falling back to a local
// `weir dev`'s dev.json.
type clients struct {
	accounts weirv1connect.AccountServiceClient
	keys     weirv1connect.KeyServiceClient
	routes   weirv1connect.RouteServiceClient
	settings weirv1connect.SettingsServiceClient
	ops      weirv1connect.OpsServiceClient
	aliases  weirv1connect.AliasServiceClient
	audit    weirv1connect.AuditServiceClient
	usage    weirv1connect.UsageServiceClient
	notify   weirv1connect.NotifyServiceClient
}

func (a *adminFlags) clients() (*clients, error) {
	url, token := a.controlplane, a.token
	if url == "" || token == "" {
		if d, err := findDev(a.env, a.dataDir); err == nil {
			if url == "" {
				url = d.ControlplaneURL
			}
			if token == "" {
				token = d.AdminToken
			}
		}
	}
	if url == "" {
		return nil, errors.New("no control plane: set --controlplane or WEIR_CONTROLPLANE_URL with WEIR_ADMIN_TOKEN, " +
			"or --data-dir or WEIR_DATA_DIR to a running 'weir dev''s data directory (or start 'weir dev')")
	}
	if token == "" {
		return nil, errors.New("no admin token: set WEIR_ADMIN_TOKEN")
	}
	hc, err := controlPlaneClient(a.env, url, false, nil)
	if err != nil {
		return nil, err
	}
	opt := connect.WithInterceptors(rpcclient.Token(token), rpcclient.Actor(a.actor))
	return &clients{
		accounts: weirv1connect.NewAccountServiceClient(hc, url, opt),
		keys:     weirv1connect.NewKeyServiceClient(hc, url, opt),
		routes:   weirv1connect.NewRouteServiceClient(hc, url, opt),
		settings: weirv1connect.NewSettingsServiceClient(hc, url, opt),
		ops:      weirv1connect.NewOpsServiceClient(hc, url, opt),
		aliases:  weirv1connect.NewAliasServiceClient(hc, url, opt),
		audit:    weirv1connect.NewAuditServiceClient(hc, url, opt),
		usage:    weirv1connect.NewUsageServiceClient(hc, url, opt),
		notify:   weirv1connect.NewNotifyServiceClient(hc, url, opt),
	}, nil
}

// rpcError turns a Connect error into a line for a person.
func rpcError(op string, err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		switch ce.Code() {
		case connect.CodeUnauthenticated:
			return fmt.Errorf("%s: the control plane rejected the admin token (check WEIR_ADMIN_TOKEN)", op)
		case connect.CodeUnavailable:
			return fmt.Errorf("%s: control plane unreachable: %s", op, ce.Message())
		}
		return fmt.Errorf("%s: %s", op, ce.Message())
	}
	return fmt.Errorf("%s: %w", op, err)
}

func fieldMask(paths ...string) *fieldmaskpb.FieldMask { return &fieldmaskpb.FieldMask{Paths: paths} }

// refClients parses one ID|NAME argument (flags around it) and connects:
// the preamble of every operator command that acts on one thing.
func (a *adminFlags) refClients(fs *flag.FlagSet, args []string) (string, *clients, error) {
	ref, err := parseWithRef(fs, args)
	if err != nil {
		return "", nil, err
	}
	c, err := a.clients()
	return ref, c, err
}
