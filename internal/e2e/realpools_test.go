package e2e

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/sim"
)

// The real Claude Code and Codex CLI through the pool mixtures that used
// to end their turns: one account spent for the whole run beside one in a
// storm (Claude Code failed in 1.5 s on the spent account's 429, Codex
// stopped on "You've hit your usage limit"), and eight accounts all
// overloaded of which one recovers. Each client runs a task of three tool
// calls and the final text; the faults are scripted on the simulator at
// real time, as in TestRealClientsThroughStorm.

// realClient is one real client as these tests drive it.
type realClient struct {
	name, env, bin string
	// provider is its accounts' provider: "" an Anthropic subscription
	// (OAuth), "codex" a ChatGPT login.
	provider string
	// overloaded is the fault of an account at capacity on its wire.
	overloaded string
	// path is the upstream path of its turns.
	path string
	// run runs its task through e, given at most within.
	run func(t *testing.T, e *env, bin string, within time.Duration) (string, error)
}

var realClients = []realClient{
	{"claude", "WEIR_CLAUDE_BIN", "claude", "", sim.FaultOverloaded, "/v1/messages",
		func(t *testing.T, e *env, bin string, within time.Duration) (string, error) {
			return runClientWithin(t, within, bin, []string{"ANTHROPIC_BASE_URL=" + e.dpSrv.URL, "ANTHROPIC_API_KEY=" + e.key,
				"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"}, "-p", "Run echo three times, then say hello.", "--allowedTools", "Bash(echo:*)")
		}},
	{"codex", "WEIR_CODEX_BIN", "codex", "codex", sim.FaultAtCapacityEvent, "/backend-api/codex/responses",
		func(t *testing.T, e *env, bin string, within time.Duration) (string, error) {
			return runClientWithin(t, within, bin, []string{"CODEX_HOME=" + codexHome(t, e.dpSrv.URL, false), "WEIR_KEY=" + e.key},
				"exec", "--skip-git-repo-check", "Run echo three times, then say hello.")
		}},
}

// account is an account of the client's provider.
func (c realClient) account(label string, priority int32, windows *sim.Windows) account {
	a := account{label: label, provider: c.provider, priority: priority, windows: windows}
	if c.provider == "" {
		a.oauth = true
	}
	return a
}

// badStatus is a 429 or 529 on its own: not part of a longer number,
// such as Codex's tokens used (41,429) or a temporary directory's, nor
// of an identifier, such as a session id's hex (…-7941-b529-f70b…).
var badStatus = regexp.MustCompile(`(^|[^0-9A-Za-z,._-])[45]29([^0-9A-Za-z,._-]|$)`)

// shownNothingWrong fails the test if the client's output shows an error,
// a retry, a limit or an overload.
func shownNothingWrong(t *testing.T, name, out string) {
	t.Helper()
	for _, bad := range []string{"rror", "verloaded", "retry", "sage limit", "ate limit", "apacity"} {
		if strings.Contains(out, bad) {
			t.Errorf("%s showed %q:\n%s", name, bad, out)
		}
	}
	if m := badStatus.FindString(out); m != "" {
		t.Errorf("%s showed %q:\n%s", name, m, out)
	}
}

// realTurn is what a client's task met upstream, from the simulator's
// attempts on its path.
type realTurn struct {
	firstServed time.Time      // the first answer served
	served      map[string]int // answers served, per account
	failed      map[string]int // attempts that did not serve, per account
}

func readTurn(e *env, path string) realTurn {
	rt := realTurn{served: map[string]int{}, failed: map[string]int{}}
	for _, a := range e.sim.Attempts() {
		if a.Path != path {
			continue
		}
		// A Codex at-capacity answer is a 200 stream that fails: only an
		// "ok" outcome served.
		if a.Status == http.StatusOK && a.Outcome == "ok" {
			if rt.firstServed.IsZero() {
				rt.firstServed = a.Time
			}
			rt.served[a.Account]++
		} else {
			rt.failed[a.Account]++
		}
	}
	return rt
}

func (rt realTurn) answers() int {
	n := 0
	for _, v := range rt.served {
		n += v
	}
	return n
}

// logRoutes logs every route event with its attempts, folded (account,
// class, status, action ×n), for a failure's diagnosis.
func logRoutes(t *testing.T, e *env) {
	t.Helper()
	res, err := e.routes.ListRouteEvents(t.Context(), connect.NewRequest(&weirv1.ListRouteEventsRequest{Limit: 1000}))
	if err != nil {
		t.Logf("list route events: %v", err)
		return
	}
	for _, ev := range slices.Backward(res.Msg.Events) {
		var rows []string
		last, n := "", 0
		flush := func() {
			if n > 0 {
				rows = append(rows, fmt.Sprintf("%s ×%d", last, n))
			}
		}
		for _, a := range ev.AttemptRecords {
			row := fmt.Sprintf("%s %s %d %s", e.labels[a.AccountId], strings.TrimPrefix(a.Class.String(), "OUTCOME_CLASS_"),
				a.Status, strings.TrimPrefix(a.Action.String(), "ACTION_"))
			if a.HoldReason != "" {
				row += " hold:" + a.HoldReason
			}
			if row != last {
				flush()
				last, n = row, 0
			}
			n++
		}
		flush()
		t.Logf("route %s at %s: status %d account %s held %v in %d holds, verdict %q, pending %v; attempts %v",
			ev.RequestId, ev.StartedAt.AsTime().Format("15:04:05.000"), ev.Status, e.labels[ev.AccountId], ev.Held.AsDuration(),
			ev.HoldCount, ev.Verdict, ev.Pending, rows)
	}
}

// realMixedStorm is how long the second account answers overloaded in
// TestRealClientsMixedPool.
const realMixedStorm = 20 * time.Second

// TestRealClientsMixedPool: one account spent for the whole run (its
// five-hour window full for three more hours) and tried first, the other
// overloaded for 20 s. Each real client finishes its task with nothing
// wrong shown, in either quota mode: the spent account's 429 does not end
// the turn (in the usage_limit mode, a final usage limit), weir holds it
// and serves it within 3 s of the storm's end from the stormed account;
// the task is done within 10 s of the storm's end.
func TestRealClientsMixedPool(t *testing.T) {
	t.Parallel()
	spent := &sim.Windows{FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(3 * time.Hour)}}
	for _, c := range realClients {
		// The subtests' names are in the clients' working directories,
		// which Codex shows: "retryable" would read as a retry shown.
		for _, m := range []struct {
			mode weirv1.QuotaResponseMode
			name string
		}{
			{weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT, "usage_limit"},
			{weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_RETRYABLE, "default_mode"},
		} {
			name, mode := c.name+"/"+m.name, m.mode
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				bin := clientBinary(t, c.env, c.bin)
				e := setup(t, options{hold: 20 * time.Minute, accounts: []account{
					c.account("spent", 1, spent), c.account("storm", 0, nil)}})
				e.setQuotaMode(mode)
				back := time.Now().Add(realMixedStorm)
				if err := e.sim.AddFaults("storm", sim.Fault{Kind: c.overloaded, Until: back}); err != nil {
					t.Fatal(err)
				}
				out, err := c.run(t, e, bin, realMixedStorm+time.Minute)
				finished := time.Now()
				rt := readTurn(e, c.path)
				if err != nil || !strings.Contains(out, "weir upstream simulator") {
					logRoutes(t, e)
					t.Fatalf("%s: %v after %v, attempts %v\n%s", name, err, finished.Sub(back), e.attempts(), out)
				}
				shownNothingWrong(t, name, out)
				if rt.failed["spent"] == 0 || rt.failed["storm"] == 0 {
					t.Fatalf("%s: failed attempts %v, want the spent account's 429 and the storm met", name, rt.failed)
				}
				if rt.served["spent"] != 0 || rt.answers() < 4 {
					t.Errorf("%s: answers served %v, want the stormed account's three tool calls and text", name, rt.served)
				}
				weir, done := rt.firstServed.Sub(back), finished.Sub(back)
				t.Logf("%s: first answer %v after the storm ended, task done %v after; served %v, failed %v",
					name, weir.Round(time.Millisecond), done.Round(time.Millisecond), rt.served, rt.failed)
				if weir > 3*time.Second {
					t.Errorf("%s: first answer %v after the storm ended, want within 3s", name, weir)
				}
				if done > 10*time.Second {
					t.Errorf("%s: task done %v after the storm ended, want within 10s", name, done)
				}
				if t.Failed() {
					logRoutes(t, e)
				}
			})
		}
	}
}

// realRecovery is when the one account that recovers does in
// TestRealClientsPartialRecovery.
const realRecovery = 15 * time.Second

// TestRealClientsPartialRecovery: eight accounts all overloaded; one
// recovers after 15 s while the rest stay overloaded for minutes. The
// breaker probes each account every 2 s, so each real client's held turn
// is served by the recovered account within 3 s of its recovery, and the
// task is done within 6 s of it, with nothing wrong shown.
func TestRealClientsPartialRecovery(t *testing.T) {
	t.Parallel()
	for _, c := range realClients {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			bin := clientBinary(t, c.env, c.bin)
			var accounts []account
			for i := range 8 {
				accounts = append(accounts, c.account(c.name+"-"+string(rune('a'+i)), 0, nil))
			}
			recovers := accounts[5].label
			e := setup(t, options{hold: 20 * time.Minute, accounts: accounts})
			start := time.Now()
			back := start.Add(realRecovery)
			for _, a := range accounts {
				until := start.Add(5 * time.Minute)
				if a.label == recovers {
					until = back
				}
				if err := e.sim.AddFaults(a.label, sim.Fault{Kind: c.overloaded, Until: until}); err != nil {
					t.Fatal(err)
				}
			}
			out, err := c.run(t, e, bin, realRecovery+time.Minute)
			finished := time.Now()
			rt := readTurn(e, c.path)
			if err != nil || !strings.Contains(out, "weir upstream simulator") {
				logRoutes(t, e)
				t.Fatalf("%s: %v after %v, attempts %v\n%s", c.name, err, finished.Sub(back), e.attempts(), out)
			}
			shownNothingWrong(t, c.name, out)
			if len(rt.failed) < 2 {
				t.Fatalf("%s: failed attempts %v, want the storm met on several accounts", c.name, rt.failed)
			}
			if rt.served[recovers] < 4 || len(rt.served) != 1 {
				t.Errorf("%s: answers served %v, want %s's three tool calls and text, and no other account's", c.name, rt.served, recovers)
			}
			weir, done := rt.firstServed.Sub(back), finished.Sub(back)
			t.Logf("%s: first answer %v after %s recovered, task done %v after; served %v, failed %v",
				c.name, weir.Round(time.Millisecond), recovers, done.Round(time.Millisecond), rt.served, rt.failed)
			if weir > 3*time.Second {
				t.Errorf("%s: first answer %v after %s recovered, want within 3s", c.name, weir, recovers)
			}
			if done > 6*time.Second {
				t.Errorf("%s: task done %v after %s recovered, want within 6s", c.name, done, recovers)
			}
			if t.Failed() {
				logRoutes(t, e)
			}
		})
	}
}

// TestBadStatus: a status shown on its own is caught; a longer number or
// an identifier that happens to hold one is not.
func TestBadStatus(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{"529 Overloaded": true, "status 429": true, "(529)": true, "error: 529:": true, "429": true,
		"session id: 01a248a2-f8ce-7941-b529-f70b68b24218": false, "tokens used 41,429": false, "/tmp/x1529y": false, "req_529abc": false} {
		if got := badStatus.MatchString(s); got != want {
			t.Errorf("%q: matched %v, want %v", s, got, want)
		}
	}
}
