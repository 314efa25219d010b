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
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = t.TempDir()
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "NO_COLOR=1"}, env...)
	cmd.Stdin = nil // /dev/null
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
	// the reset time, instead of retrying for hours. Both ChatGPT logins
	// spent and the OpenAI key out of credits (the mixed pool), or the key
	// alone (no reset to name); Codex asks first, in the usage_limit mode
	// from the start, so that weir meets every upstream's answer itself.
	for _, tt := range []struct {
		name     string
		accounts []account
	}{
		{"usage limit", []account{spentCodex("a", 2*time.Hour), spentCodex("b", 3*time.Hour), brokeKey("oai")}},
		{"out of credits", []account{brokeKey("oai")}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, options{hold: 20 * time.Minute, accounts: tt.accounts})
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
}

func TestRealClaudeCode(t *testing.T) {
	t.Parallel()
	bin := clientBinary(t, "WEIR_CLAUDE_BIN", "claude")
	claude := func(e *env) (string, error) {
		return runClient(t, bin, []string{"ANTHROPIC_BASE_URL=" + e.dpSrv.URL, "ANTHROPIC_API_KEY=" + e.key,
			"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"}, "-p", "Say hello.")
	}
	e := setup(t, options{accounts: []account{{label: "max", oauth: true}}})
	out, err := claude(e)
	if err != nil || !strings.Contains(out, "weir upstream simulator") {
		t.Fatalf("claude -p: %v\n%s", err, out)
	}
	// A pool out of credits in the usage_limit mode: Claude Code stops at
	// once and shows why.
	e = setup(t, options{hold: 20 * time.Minute, accounts: []account{outOfCredits("broke")}})
	e.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
	start := time.Now()
	out, err = claude(e)
	if err == nil || !strings.Contains(out, "out of credits; an operator must add credits") {
		t.Fatalf("claude -p: %v, want a failure saying the pool is out of credits:\n%s", err, out)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("claude took %v to give up, want it to stop at once", d)
	}
}
