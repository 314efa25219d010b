package e2e

import (
	"context"
	"net/http"
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
	return runClientWithin(t, 30*time.Second, bin, env, args...)
}

// runClientWithin is runClient with a time of the caller's.
func runClientWithin(t *testing.T, within time.Duration, bin string, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
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
	return codexHomeModel(t, baseURL, websockets, codexModel)
}

// codexHomeModel is codexHome with a model; "" leaves Codex's default.
func codexHomeModel(t *testing.T, baseURL string, websockets bool, model string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := `model_provider = "weir"
`
	if model != "" {
		cfg += `model = "` + model + `"
`
	}
	cfg += `check_for_update_on_startup = false

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
	// Codex's default model (no model in the config) gets its tools in
	// the input and calls the shell through code mode's exec; gpt-5-codex
	// gets top-level function tools. Each turn is three tool calls, whose
	// echo Codex shows, then the text.
	for _, model := range []string{"", codexModel} {
		for _, ws := range []bool{false, true} {
			name := "http"
			if ws {
				name = "websocket"
			}
			if model == "" {
				name += ", default model"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				e := setup(t, options{accounts: []account{{label: "codex", provider: "codex"}}})
				out, err := runClient(t, bin, []string{"CODEX_HOME=" + codexHomeModel(t, e.dpSrv.URL, ws, model), "WEIR_KEY=" + e.key},
					"exec", "--skip-git-repo-check", "Say hello.")
				if err != nil || !strings.Contains(out, "weir upstream simulator") {
					t.Fatalf("codex exec: %v\n%s", err, out)
				}
				if strings.Contains(out, "failed to connect to Responses WebSocket") {
					t.Errorf("codex fell back from the WebSocket:\n%s", out)
				}
				if got := strings.Count(out, "echo weir-sim"); got < 3 {
					t.Errorf("codex ran echo weir-sim %d times, want 3:\n%s", got, out)
				}
				served := 0
				for _, x := range e.upstream.exchanges() {
					if x.path == "/backend-api/codex/responses" && x.status == 200 {
						served++
					}
				}
				if served != 4 {
					t.Errorf("the Codex account served %d answers, want three tool calls and the text", served)
				}
			})
		}
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

// TestRealCodexRetryableQuota: in the default retryable mode, weir answers
// a pool out of quota on Responses with a 429 usage_limit_reached and a
// Retry-After, saying retry (X-Should-Retry: true) when the first reset
// comes within the hold budget or 5 minutes, and not when it comes later.
// Codex 0.171 stops at once either way ("You've hit your usage limit. Try
// again later.", no time: weir's retryable body has no resets_at) instead
// of retrying on Retry-After. A first request meets the upstream's own
// 429, so that Codex meets weir's answer.
func TestRealCodexRetryableQuota(t *testing.T) {
	t.Parallel()
	bin := clientBinary(t, "WEIR_CODEX_BIN", "codex")
	for _, tt := range []struct {
		name        string
		hold        time.Duration
		resetIn     time.Duration
		shouldRetry string
	}{
		{"reset within 5 minutes, fail fast", 0, 3 * time.Minute, "true"},
		{"reset past the hold budget", 20 * time.Minute, 2 * time.Hour, "false"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, options{hold: tt.hold, accounts: []account{spentCodex("a", tt.resetIn)}})
			if r := e.responses(false); r.status != http.StatusTooManyRequests {
				t.Fatalf("first request: status %d, want the upstream's 429: %s", r.status, r.body)
			}
			r := e.responses(false)
			if r.status != http.StatusTooManyRequests || !strings.Contains(string(r.body), `"type":"usage_limit_reached"`) ||
				r.header.Get("X-Should-Retry") != tt.shouldRetry || r.header.Get("Retry-After") == "" {
				t.Fatalf("weir's answer: status %d, X-Should-Retry %q, Retry-After %q: %s; want 429 usage_limit_reached, %s and a Retry-After",
					r.status, r.header.Get("X-Should-Retry"), r.header.Get("Retry-After"), r.body, tt.shouldRetry)
			}
			before := len(e.sim.Attempts())
			start := time.Now()
			out, err := runClient(t, bin, []string{"CODEX_HOME=" + codexHome(t, e.dpSrv.URL, false), "WEIR_KEY=" + e.key},
				"exec", "--skip-git-repo-check", "Say hello.")
			if err == nil || !strings.Contains(out, "hit your usage limit. Try again later.") {
				t.Fatalf("codex exec: %v, want it to stop on the usage limit:\n%s", err, out)
			}
			if d := time.Since(start); d > 15*time.Second {
				t.Errorf("codex took %v to give up, want it to stop at once", d)
			}
			if n := len(e.sim.Attempts()) - before; n != 0 {
				t.Errorf("the upstream saw %d attempts during codex's run, want weir's own answer", n)
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

// realStorm is how long every account answers overloaded in
// TestRealClientsThroughStorm.
const realStorm = 60 * time.Second

// TestRealClientsThroughStorm: the real Claude Code and Codex CLI each run
// a task of three tool calls while every account answers 529 for a minute.
// Both finish with no error shown, and weir serves again within 3 s of the
// storm's end (a probe every 2 s, and the wake-up of the held request).
func TestRealClientsThroughStorm(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, env, bin string
		accounts       []account
		path           string
		run            func(t *testing.T, e *env, bin string) (string, error)
	}{
		{"claude", "WEIR_CLAUDE_BIN", "claude", []account{{label: "max-1", oauth: true}, {label: "max-2", oauth: true}}, "/v1/messages",
			func(t *testing.T, e *env, bin string) (string, error) {
				return runClientWithin(t, realStorm+time.Minute, bin, []string{"ANTHROPIC_BASE_URL=" + e.dpSrv.URL, "ANTHROPIC_API_KEY=" + e.key,
					"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"}, "-p", "Run echo three times, then say hello.", "--allowedTools", "Bash(echo:*)")
			}},
		{"codex", "WEIR_CODEX_BIN", "codex", []account{{label: "codex-1", provider: "codex"}, {label: "codex-2", provider: "codex"}}, "/backend-api/codex/responses",
			func(t *testing.T, e *env, bin string) (string, error) {
				return runClientWithin(t, realStorm+time.Minute, bin, []string{"CODEX_HOME=" + codexHome(t, e.dpSrv.URL, false), "WEIR_KEY=" + e.key},
					"exec", "--skip-git-repo-check", "Run echo three times, then say hello.")
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bin := clientBinary(t, tc.env, tc.bin)
			e := setup(t, options{hold: 20 * time.Minute, accounts: tc.accounts})
			// A provider-wide storm: every account recovers at the same moment.
			back := time.Now().Add(realStorm)
			for _, a := range tc.accounts {
				if err := e.sim.AddFaults(a.label, sim.Fault{Kind: sim.FaultOverloaded, Until: back}); err != nil {
					t.Fatal(err)
				}
			}
			out, err := tc.run(t, e, bin)
			finished := time.Now()
			if err != nil || !strings.Contains(out, "weir upstream simulator") {
				t.Fatalf("%s through the storm: %v\n%s", tc.name, err, out)
			}
			// A status only as a number of its own: a temporary directory's
			// digits are not a 529.
			shownNothingWrong(t, tc.name, out)
			met, served := false, 0
			for _, a := range e.sim.Attempts() {
				if a.Path != tc.path {
					continue
				}
				met = met || a.Status >= 500
				if a.Status == http.StatusOK {
					served++
					if served == 1 {
						t.Logf("%s: first answer %v after the storm ended", tc.name, a.Time.Sub(back).Round(time.Millisecond))
						if d := a.Time.Sub(back); d > 3*time.Second {
							t.Errorf("%s: first answer %v after the storm ended, want within 3s", tc.name, d)
						}
					}
				}
			}
			if !met {
				t.Fatalf("%s: no request met the storm", tc.name)
			}
			if served < 4 {
				t.Errorf("%s: %d answers, want three tool calls and the final text", tc.name, served)
			}
			t.Logf("%s: task done %v after the storm ended, %d answers", tc.name, finished.Sub(back).Round(time.Millisecond), served)
		})
	}
}
