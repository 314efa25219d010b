package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/sim"
)

// translateAlias makes alias a translating alias to targets.
func (e *env) translateAlias(alias string, targets ...string) {
	e.t.Helper()
	if _, err := e.aliases.SetAlias(e.t.Context(), connect.NewRequest(&weirv1.SetAliasRequest{
		Alias: alias, Targets: targets, Translate: true})); err != nil {
		e.t.Fatal(err)
	}
}

// The real Claude Code runs a task of three tool calls on a Codex account
// and on an OpenAI (Chat Completions) account, through a translating
// alias it is configured to use: it finishes with no error shown, and
// every answer it got came from the target's own path.
func TestRealClaudeCodeTranslated(t *testing.T) {
	t.Parallel()
	bin := clientBinary(t, "WEIR_CLAUDE_BIN", "claude")
	for _, c := range []struct{ provider, target, path string }{
		{"codex", "gpt-5-codex", "/backend-api/codex/responses"},
		{"openai", "gpt-4.1", "/v1/chat/completions"},
	} {
		t.Run(c.provider, func(t *testing.T) {
			t.Parallel()
			e := setup(t, options{accounts: []account{{label: "up", provider: c.provider}}})
			e.translateAlias("coder", c.target)
			out, err := runClient(t, bin, []string{"ANTHROPIC_BASE_URL=" + e.dpSrv.URL, "ANTHROPIC_API_KEY=" + e.key,
				"ANTHROPIC_MODEL=coder", "ANTHROPIC_SMALL_FAST_MODEL=coder", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"},
				"-p", "Run echo three times, then say hello.", "--allowedTools", "Bash(echo:*)")
			if err != nil || !strings.Contains(out, "weir upstream simulator") {
				t.Fatalf("claude -p on %s: %v\n%s", c.provider, err, out)
			}
			shownNothingWrong(t, "claude on "+c.provider, out)
			served := 0
			for _, a := range e.sim.Attempts() {
				if a.Path != c.path || a.Model != c.target {
					t.Errorf("upstream attempt %+v, want %s on %s", a, c.target, c.path)
				}
				if a.Status == http.StatusOK {
					served++
				}
			}
			if served < 4 {
				t.Errorf("%d answers, want three tool calls and the final text", served)
			}
		})
	}
}

// The real Codex CLI runs a task of three tool calls on an Anthropic
// account (a Claude subscription) through a translating alias, over HTTP
// and over the Responses WebSocket: it finishes with no error shown, and
// every answer came from the Messages path as the Claude model.
func TestRealCodexTranslated(t *testing.T) {
	t.Parallel()
	bin := clientBinary(t, "WEIR_CODEX_BIN", "codex")
	for _, ws := range []bool{false, true} {
		name := "http"
		if ws {
			name = "websocket"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, options{accounts: []account{{label: "max", oauth: true}}})
			e.translateAlias("team-coder", model)
			out, err := runClient(t, bin, []string{"CODEX_HOME=" + codexHomeModel(t, e.dpSrv.URL, ws, "team-coder"), "WEIR_KEY=" + e.key},
				"exec", "--skip-git-repo-check", "Run echo three times, then say hello.")
			if err != nil || !strings.Contains(out, "weir upstream simulator") {
				t.Fatalf("codex exec on a Claude account: %v\n%s", err, out)
			}
			if strings.Contains(out, "failed to connect to Responses WebSocket") {
				t.Errorf("codex fell back from the WebSocket:\n%s", out)
			}
			shownNothingWrong(t, "codex on anthropic", out)
			if got := strings.Count(out, "weir-sim"); got < 3 {
				t.Errorf("codex ran the simulator's command %d times, want 3:\n%s", got, out)
			}
			served := 0
			for _, a := range e.sim.Attempts() {
				if a.Path != "/v1/messages" || a.Model != model {
					t.Errorf("upstream attempt %+v, want %s on /v1/messages", a, model)
				}
				if a.Status == http.StatusOK {
					served++
				}
			}
			if served < 4 {
				t.Errorf("%d answers, want three tool calls and the final text", served)
			}
		})
	}
}

// spentClaude is a Claude subscription whose five-hour window is full
// until resetIn (its extra usage off).
func spentClaude(label string, resetIn time.Duration) account {
	return account{label: label, oauth: true, windows: &sim.Windows{
		FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(resetIn)}}}
}

// The real Codex CLI on a translated pool at its usage limit (two Claude
// subscriptions spent for hours, the usage_limit mode) stops at once and
// shows the usage limit with its reset, instead of retrying.
func TestRealCodexTranslatedUsageLimit(t *testing.T) {
	t.Parallel()
	bin := clientBinary(t, "WEIR_CODEX_BIN", "codex")
	e := setup(t, options{hold: 20 * time.Minute, accounts: []account{spentClaude("a", 2*time.Hour), spentClaude("b", 3*time.Hour)}})
	e.setQuotaMode(weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT)
	e.translateAlias("team-coder", model)
	start := time.Now()
	out, err := runClient(t, bin, []string{"CODEX_HOME=" + codexHomeModel(t, e.dpSrv.URL, false, "team-coder"), "WEIR_KEY=" + e.key},
		"exec", "--skip-git-repo-check", "Say hello.")
	if err == nil || !strings.Contains(strings.ToLower(out), "usage limit") {
		t.Fatalf("codex exec: %v, want a failure naming the usage limit:\n%s", err, out)
	}
	// The reset Codex shows is the first account's, two hours out.
	reset := start.Add(2 * time.Hour).Local()
	if !strings.Contains(out, reset.Format("3:04 PM")) && !strings.Contains(out, reset.Format("15:04")) {
		t.Errorf("codex did not show the reset (%s):\n%s", reset.Format("15:04"), out)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("codex took %v to give up, want it to stop at once", d)
	}
}
