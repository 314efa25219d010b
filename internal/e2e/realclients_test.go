package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/sim"
)

// The real clients, end to end: Codex CLI and Claude Code, as installed
// from npm, against a weir and its simulator. .ci/run installs pinned
// versions and names them in WEIR_CODEX_BIN and WEIR_CLAUDE_BIN; elsewhere
// the tests look on PATH and skip when a client is not installed.

// clientBinary finds a real client: env names it, else PATH.
func clientBinary(t *testing.T, env, name string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s=%s: %v", env, p, err)
		}
		return p
	}
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s is not installed (npm i -g %s, or set %s)", name, map[string]string{
			"codex": "@openai/codex", "claude": "@anthropic-ai/claude-code"}[name], env)
	}
	return p
}

// runClient runs a client with a bounded time and returns what it printed.
func runClient(t *testing.T, bin string, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = t.TempDir()
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "NO_COLOR=1"}, env...)
	cmd.Stdin = nil // /dev/null
	// A killed client's children (a tool's shell) may hold its output
	// open: stop waiting for them soon after.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// codexHome writes Codex's config: weir as a Responses provider.
func codexHome(t *testing.T, baseURL string, websockets bool) string {
	t.Helper()
	dir := t.TempDir()
	cfg := `model_provider = "weir"
model = "` + codexModel + `"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[model_providers.weir]
name = "weir"
base_url = "` + baseURL + `/v1"
env_key = "WEIR_KEY"
wire_api = "responses"
request_max_retries = 1
stream_max_retries = 1
`
	if websockets {
		cfg += "supports_websockets = true\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestRealCodexCLI(t *testing.T) {
	t.Parallel()
	bin := clientBinary(t, "WEIR_CODEX_BIN", "codex")
	for _, ws := range []bool{false, true} {
		name := "http"
		if ws {
			name = "websocket"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, options{accounts: []account{{label: "codex", provider: "codex"}}})
			out, err := runClient(t, bin, []string{"CODEX_HOME=" + codexHome(t, e.dpSrv.URL, ws), "WEIR_KEY=" + e.key},
				"exec", "--skip-git-repo-check", "Say hello.")
			if err != nil || !strings.Contains(out, "weir upstream simulator") {
				t.Fatalf("codex exec: %v\n%s", err, out)
			}
			if strings.Contains(out, "failed to connect to Responses WebSocket") {
				t.Errorf("codex fell back from the WebSocket:\n%s", out)
			}
			served := 0
			for _, x := range e.upstream.exchanges() {
				if x.path == "/backend-api/codex/responses" && x.status == 200 {
					served++
				}
			}
			if served == 0 {
				t.Errorf("the Codex account served nothing")
			}
		})
	}
	// A pool out of quota in the usage_limit mode: Codex stops at once with
	// the reset time, instead of retrying for hours.
	t.Run("usage limit", func(t *testing.T) {
		t.Parallel()
		e := setup(t, options{hold: 20 * time.Minute, accounts: []account{
			{label: "codex", provider: "codex", windows: &sim.Windows{FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(2 * time.Hour)}}},
		}})
		// The account is already cooling when Codex asks: weir answers
		// without an upstream attempt, from its own view of the pool.
		if r := e.responses(false); r.status != 429 {
			t.Fatalf("first request: %d %s", r.status, r.body)
		}
		e.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
		start := time.Now()
		out, err := runClient(t, bin, []string{"CODEX_HOME=" + codexHome(t, e.dpSrv.URL, false), "WEIR_KEY=" + e.key},
			"exec", "--skip-git-repo-check", "Say hello.")
		if err == nil || !strings.Contains(strings.ToLower(out), "usage limit") {
			t.Fatalf("codex exec: %v, want a failure naming the usage limit:\n%s", err, out)
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("codex took %v to give up, want it to stop at once", d)
		}
	})
}

func TestRealClaudeCode(t *testing.T) {
	t.Parallel()
	bin := clientBinary(t, "WEIR_CLAUDE_BIN", "claude")
	e := setup(t, options{accounts: []account{{label: "max", oauth: true}}})
	out, err := runClient(t, bin, []string{"ANTHROPIC_BASE_URL=" + e.dpSrv.URL, "ANTHROPIC_API_KEY=" + e.key,
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"}, "-p", "Say hello.")
	if err != nil || !strings.Contains(out, "weir upstream simulator") {
		t.Fatalf("claude -p: %v\n%s", err, out)
	}
}
