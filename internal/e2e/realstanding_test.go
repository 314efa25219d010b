package e2e

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/sim"
)

// The real clients read the pool's standing from weir, not the serving
// account's (docs/wire.md, "What the clients read about rate limits").

// TestRealClaudeCodeSeesThePool: two subscriptions at 88% and 98% of their
// five-hour windows, the fuller one serving. Claude Code logged in with a
// token (CLAUDE_CODE_OAUTH_TOKEN, here the weir key) reads the unified
// headers and reports the pool's 93% (a warning: the window is only a
// fifth gone), never the serving account's 98%; with ANTHROPIC_API_KEY it
// reads none.
func TestRealClaudeCodeSeesThePool(t *testing.T) {
	t.Parallel()
	bin := clientBinary(t, "WEIR_CLAUDE_BIN", "claude")
	low, high := "sub-"+randid.Hex(4), "sub-"+randid.Hex(4)
	e := setup(t, options{accounts: []account{
		{label: low, oauth: true, windows: &sim.Windows{
			FiveHour: &sim.Window{Limit: 100_000_000, Used: 88_000_000, ResetIn: sim.Duration(4 * time.Hour)}}},
		{label: high, oauth: true, priority: 10, windows: &sim.Windows{
			FiveHour: &sim.Window{Limit: 100_000_000, Used: 98_000_000, ResetIn: sim.Duration(4*time.Hour + 30*time.Minute)}}},
	}})
	e.refreshUsage(low, high)
	// rateEvents runs claude -p in stream-json and returns the rate-limit
	// states it reported.
	rateEvents := func(auth string) []map[string]any {
		t.Helper()
		out, err := runClient(t, bin, []string{"ANTHROPIC_BASE_URL=" + e.dpSrv.URL, auth + "=" + e.key,
			"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"}, "-p", "Say hello.", "--output-format", "stream-json", "--verbose")
		if err != nil || !strings.Contains(out, "weir upstream simulator") {
			t.Fatalf("claude -p with %s: %v\n%s", auth, err, out)
		}
		var infos []map[string]any
		for _, line := range strings.Split(out, "\n") {
			var ev struct {
				Type string         `json:"type"`
				Info map[string]any `json:"rate_limit_info"`
			}
			if json.Unmarshal([]byte(line), &ev) == nil && ev.Type == "rate_limit_event" {
				infos = append(infos, ev.Info)
			}
		}
		return infos
	}
	infos := rateEvents("CLAUDE_CODE_OAUTH_TOKEN")
	if len(infos) == 0 {
		t.Fatal("Claude Code reported no rate-limit state")
	}
	last := infos[len(infos)-1]
	u, _ := last["utilization"].(float64)
	if last["status"] != "allowed_warning" || last["rateLimitType"] != "five_hour" || math.Abs(u-0.93) > 0.005 {
		t.Errorf("Claude Code's rate-limit state %v, want a five_hour warning at the pool's 0.93 (the serving account is at 0.98)", last)
	}
	want := float64(e.simReset(low, false).Unix())
	if at, _ := last["resetsAt"].(float64); math.Abs(at-want) > 2 {
		t.Errorf("resetsAt %v, want the pool's soonest reset %v", last["resetsAt"], want)
	}
	if infos := rateEvents("ANTHROPIC_API_KEY"); len(infos) != 0 {
		t.Errorf("with an API key Claude Code reported %v: it reads the headers only for a login", infos)
	}
}

// TestRealCodexSeesThePool: two ChatGPT logins at 10% and 70% of their
// five-hour windows (30% and 50% weekly), the fuller one serving. Codex,
// over HTTP (the x-codex-* headers) and over the Responses WebSocket (the
// codex.rate_limits event), records the pool's 40% and 40% in its session,
// never the serving account's.
func TestRealCodexSeesThePool(t *testing.T) {
	t.Parallel()
	bin := clientBinary(t, "WEIR_CODEX_BIN", "codex")
	for _, ws := range []bool{false, true} {
		name := "http"
		if ws {
			name = "websocket"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			low, high := "sub-"+randid.Hex(4), "sub-"+randid.Hex(4)
			e := setup(t, options{accounts: []account{
				{label: low, provider: "codex", windows: &sim.Windows{
					FiveHour: &sim.Window{Limit: 10_000_000, Used: 1_000_000, ResetIn: sim.Duration(2 * time.Hour)},
					SevenDay: &sim.Window{Limit: 10_000_000, Used: 3_000_000, ResetIn: sim.Duration(90 * time.Hour)}}},
				{label: high, provider: "codex", priority: 10, windows: &sim.Windows{
					FiveHour: &sim.Window{Limit: 10_000_000, Used: 7_000_000, ResetIn: sim.Duration(4 * time.Hour)},
					SevenDay: &sim.Window{Limit: 10_000_000, Used: 5_000_000, ResetIn: sim.Duration(60 * time.Hour)}}},
			}})
			e.refreshUsage(low, high)
			home := codexHome(t, e.dpSrv.URL, ws)
			out, err := runClient(t, bin, []string{"CODEX_HOME=" + home, "WEIR_KEY=" + e.key}, "exec", "--skip-git-repo-check", "Say hello.")
			if err != nil || !strings.Contains(out, "weir upstream simulator") {
				t.Fatalf("codex exec: %v\n%s", err, out)
			}
			type window struct {
				UsedPercent   float64 `json:"used_percent"`
				WindowMinutes int     `json:"window_minutes"`
				ResetsAt      int64   `json:"resets_at"`
			}
			var seen []*window
			var primary, secondary *window
			err = filepath.Walk(filepath.Join(home, "sessions"), func(p string, info os.FileInfo, err error) error {
				if err != nil || info.IsDir() {
					return err
				}
				b, err := os.ReadFile(p)
				for _, line := range strings.Split(string(b), "\n") {
					var rec struct {
						Payload struct {
							Type       string `json:"type"`
							RateLimits *struct {
								Primary, Secondary *window
							} `json:"rate_limits"`
						} `json:"payload"`
					}
					if json.Unmarshal([]byte(line), &rec) != nil || rec.Payload.RateLimits == nil {
						continue
					}
					seen = append(seen, rec.Payload.RateLimits.Primary, rec.Payload.RateLimits.Secondary)
					if rec.Payload.RateLimits.Primary != nil {
						primary, secondary = rec.Payload.RateLimits.Primary, rec.Payload.RateLimits.Secondary
					}
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if primary == nil || secondary == nil {
				t.Fatalf("Codex recorded no rate limits in its session:\n%s", out)
			}
			soon := e.simReset(low, false).Unix()
			if primary.UsedPercent != 40 || primary.WindowMinutes != 300 || math.Abs(float64(primary.ResetsAt-soon)) > 2 {
				t.Errorf("primary %+v, want the pool's 40%% of 300 minutes resetting at %d", *primary, soon)
			}
			if secondary.UsedPercent != 40 || secondary.WindowMinutes != 10080 {
				t.Errorf("secondary %+v, want the pool's 40%% of 10080 minutes", *secondary)
			}
			for _, w := range seen {
				if w != nil && math.Abs(w.UsedPercent-40) > 0.5 {
					t.Errorf("Codex recorded %+v, not the pool's standing", *w)
				}
			}
		})
	}
}
