package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/chromedp"
	"github.com/google/uuid"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/randid"
	"github.com/weirhq/weir/internal/sim"
)

// browserStep bounds every browser action: a page that never shows what
// the test waits for fails the test instead of hanging it.
const browserStep = 20 * time.Second

// chromiumPath finds a Chromium: $WEIR_CHROMIUM, /usr/bin/chromium, then
// chromium on PATH. Empty when there is none.
func chromiumPath() string {
	if p := os.Getenv("WEIR_CHROMIUM"); p != "" {
		return p
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	p, _ := exec.LookPath("chromium")
	return p
}

// artifactsDir is where screenshots go: $WEIR_ARTIFACTS_DIR (CI keeps it),
// else the test's temporary directory.
func artifactsDir(t *testing.T) string {
	dir := os.Getenv("WEIR_ARTIFACTS_DIR")
	if dir == "" {
		return t.TempDir()
	}
	dir = filepath.Join(dir, "dashboard")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("artifacts dir: %v", err)
	}
	return dir
}

// headless starts a headless Chromium for one test.
func headless(t *testing.T) context.Context {
	t.Helper()
	bin := chromiumPath()
	if bin == "" {
		t.Skip("no Chromium: set WEIR_CHROMIUM or install chromium")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin), chromedp.WindowSize(1366, 768))
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to sandbox as root
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// The first action starts the browser; it must not run under a step
	// timeout (that would stop the browser with it).
	start := make(chan error, 1)
	go func() { start <- chromedp.Do(ctx) }()
	select {
	case err := <-start:
		if err != nil {
			t.Fatalf("start chromium %s: %v", bin, err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("chromium %s did not start within a minute", bin)
	}
	return ctx
}

// viewports are the sizes every page is shot at: a laptop and a phone.
var viewports = [][2]int64{{1366, 768}, {390, 844}}

// TestDashboardInBrowser drives the dashboard in a real headless Chromium
// over a real weir: accounts cooled, served and measured by requests sent
// through a data plane to the simulator.
func TestDashboardInBrowser(t *testing.T) {
	t.Parallel()
	bctx := headless(t)
	shots := artifactsDir(t)

	e := setup(t, options{accounts: []account{
		{label: "api-1", priority: 10, faults: []sim.Fault{{Kind: sim.FaultRateLimit, RetryAfter: 600}}},
		{label: "max-1", oauth: true, priority: 5, windows: &sim.Windows{
			FiveHour: &sim.Window{Limit: 1000, Used: 420, ResetIn: sim.Duration(3 * time.Hour)},
			SevenDay: &sim.Window{Limit: 100_000, Used: 61_000, ResetIn: sim.Duration(80 * time.Hour)},
		}},
		{label: "codex-1", provider: "codex"},
	}})
	// The first request meets the 429 on api-1 (cooled 10 minutes, failed
	// over) and is served by max-1; the others go to max-1 at once.
	first := e.post(false)
	if first.status != 200 {
		t.Fatalf("first request: %d %s", first.status, first.body)
	}
	failover := first.header.Get("Weir-Request-Id")
	for range 2 {
		if r := e.post(true); r.status != 200 {
			t.Fatalf("request: %d %s", r.status, r.body)
		}
	}
	if ev := e.routeEvent(failover); ev.Attempts != 2 {
		t.Fatalf("the first request made %d attempts, want 2 (429 then failover)", ev.Attempts)
	}
	eventually(t, "max-1's usage windows from the response headers", func() bool { return len(e.account("max-1").Usage) > 0 })
	if e.account("api-1").Cooldown == nil {
		t.Fatal("api-1 is not cooling after its 429")
	}
	e.leasesReleased()

	base := e.cpSrv.URL
	secrets := []string{e.admin, e.dpToken, e.key}
	for _, c := range e.creds {
		secrets = append(secrets, c)
	}
	b := &browser{t: t, ctx: bctx, shots: shots, secrets: secrets}
	step, text, shoot := b.step, b.text, b.shoot

	// Login: the dashboard sends us there; a wrong token is refused inline.
	step("open the dashboard", chromedp.Navigate(base+"/dashboard/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	step("wrong token", chromedp.SetValue(chromedp.CSS("#token"), "wrong-token-"+randid.Hex(4)),
		chromedp.Click(chromedp.CSS(`.login button[type="submit"]`)), chromedp.WaitVisible(chromedp.CSS("#token-error")))
	if got := text("login", "#token-error"); !strings.Contains(got, "not the admin token") {
		t.Errorf("login error = %q", got)
	}
	shoot("login-error")
	step("sign in", chromedp.SetValue(chromedp.CSS("#token"), e.admin),
		chromedp.Click(chromedp.CSS(`.login button[type="submit"]`)), chromedp.WaitVisible(chromedp.CSS("table.accounts")))

	// The pool header: what can serve now, what is wrong.
	if got := text("pool header", "section.pool-header"); !strings.Contains(got, "can serve now") || !strings.Contains(got, "What is wrong") ||
		!strings.Contains(got, "api-1") || !strings.Contains(got, "Next back: api-1") {
		t.Errorf("pool header = %q, want what can serve, api-1 cooling and next back", got)
	}
	// Accounts, with the real state the requests left.
	api := `tr[data-account="api-1"]`
	max := `tr[data-account="max-1"]`
	if got := text("accounts", api); !strings.Contains(got, "cooling") || !strings.Contains(got, "rate limited") || !strings.Contains(got, "retry-after 600") {
		t.Errorf("api-1 row = %q, want cooling, rate limited, with its evidence", got)
	}
	got := text("accounts", max)
	for _, want := range []string{"active", "5h", "weekly", "61%", "resets", "0 / 4"} {
		if !strings.Contains(got, want) {
			t.Errorf("max-1 row lacks %q: %q", want, got)
		}
	}
	if got := text("accounts", `tr[data-account="codex-1"]`); !strings.Contains(got, "codex") || !strings.Contains(got, "account ") {
		t.Errorf("codex-1 row = %q, want its ChatGPT account id as identity", got)
	}
	// The countdown ticks in the browser.
	countdown := api + " .cooldown .countdown"
	before := text("countdown", countdown)
	step("countdown ticks", chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.querySelector(%q).textContent !== %q`, countdown, before),
		chromedp.WithPollingTimeout(5*time.Second)))
	shoot("accounts")

	// Pause max-1 through the confirmation dialog.
	step("pause max-1", chromedp.Click(chromedp.CSS(max+` a[href$="/pause"]`)), chromedp.WaitVisible(chromedp.CSS("#confirm")))
	if got := text("dialog", "#confirm .confirm-title"); got != "Pause max-1?" {
		t.Errorf("dialog asks %q", got)
	}
	shoot("accounts-confirm")
	step("confirm", chromedp.Click(chromedp.CSS("#confirm .confirm-go")), chromedp.WaitVisible(chromedp.CSS(".flash")))
	if got := text("after pause", max+" .badge"); got != "paused" {
		t.Errorf("max-1 state after the pause = %q", got)
	}
	if st := e.account("max-1").State; st != weirv1.AccountState_ACCOUNT_STATE_PAUSED {
		t.Fatalf("max-1 is %v in the control plane after the pause", st)
	}
	// The page refreshes itself: a resume made elsewhere shows up without
	// a reload.
	if _, err := e.accounts.ResumeAccount(t.Context(), connect.NewRequest(&weirv1.ResumeAccountRequest{Id: "max-1"})); err != nil {
		t.Fatal(err)
	}
	step("live refresh", chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.querySelector(%q).textContent.trim() === "active"`, max+" .badge"),
		chromedp.WithPollingTimeout(15*time.Second)))

	// Requests, and the explain view of the one that failed over.
	step("requests", chromedp.Navigate(base+"/dashboard/requests"),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`a[href="/dashboard/requests/%s"]`, failover))))
	shoot("requests")
	// The failed attempts of the last hour name the 429 the failover hid.
	if got := text("failed attempts", "table.failed"); !strings.Contains(got, "api-1") || !strings.Contains(got, "429") || !strings.Contains(got, "rate limited") {
		t.Errorf("failed attempts = %q, want api-1's 429", got)
	}
	// The live refresh pauses, so that rows hold still while read.
	step("pause the live refresh", chromedp.Click(chromedp.CSS("#live-pause")),
		chromedp.Poll[chromedp.Void](`document.getElementById("live").dataset.paused === "true" && document.getElementById("live-pause").textContent === "Resume live updates"`,
			chromedp.WithPollingTimeout(5*time.Second)))
	step("explain", chromedp.Click(chromedp.CSS(fmt.Sprintf(`a[href="/dashboard/requests/%s"]`, failover))),
		chromedp.WaitVisible(chromedp.CSS("table.timeline")))
	tl := text("explain", "table.timeline")
	for _, want := range []string{"api-1", "rate limited", "429", "failover", "max-1", "success", "respond"} {
		if !strings.Contains(tl, want) {
			t.Errorf("timeline lacks %q: %q", want, tl)
		}
	}
	shoot("explain")

	// The account the failover left cooling: its page, linked from the
	// explain view, keeps the cooldown with its evidence.
	step("account page", chromedp.Click(chromedp.CSS(`table.timeline a[href^="/dashboard/accounts/"]`)),
		chromedp.WaitVisible(chromedp.CSS("table.history")))
	if got := text("account page", "h1"); got != "Account api-1" {
		t.Errorf("account page heading %q", got)
	}
	if got := text("account history", "table.history"); !strings.Contains(got, "cooldown") || !strings.Contains(got, "rate limited") || !strings.Contains(got, "429") {
		t.Errorf("api-1's history = %q, want its rate-limit cooldown with the 429", got)
	}
	shoot("account")

	// History.
	step("history", chromedp.Navigate(base+"/dashboard/history?range=6h"), chromedp.WaitVisible(chromedp.CSS("figure.pool svg.chart")))
	if got := text("history", "main"); !strings.Contains(got, "3 requests") || !strings.Contains(got, "max-1") {
		t.Errorf("history = %q, want the three requests and max-1's chart", got)
	}
	shoot("history")

	// Settings: a bad value is refused inline, with the RPC's reason.
	step("settings", chromedp.Navigate(base+"/dashboard/settings"), chromedp.WaitVisible(chromedp.CSS("#request_deadline")),
		chromedp.SetValue(chromedp.CSS("#request_deadline"), "10s"),
		chromedp.Click(chromedp.CSS("#setting-request_deadline button")), chromedp.WaitVisible(chromedp.CSS("#request_deadline-error")))
	if got := text("settings", "#request_deadline-error"); !strings.Contains(got, "request_deadline: 10s is out of range") {
		t.Errorf("inline error = %q", got)
	}
	shoot("settings-error")
	step("fix the deadline", chromedp.SetValue(chromedp.CSS("#request_deadline"), "45m"),
		chromedp.Click(chromedp.CSS("#setting-request_deadline button")), chromedp.WaitVisible(chromedp.CSS(".flash")))
	st, err := e.settings.GetSettings(t.Context(), connect.NewRequest(&weirv1.GetSettingsRequest{}))
	if err != nil || st.Msg.Settings.RequestDeadline.AsDuration() != 45*time.Minute {
		t.Errorf("request_deadline after saving 45m: %v, %v", st, err)
	}
	shoot("settings")

	step("jobs", chromedp.Navigate(base+"/dashboard/jobs/"), chromedp.WaitVisible(chromedp.CSS("main h1")))
	shoot("jobs")
	t.Logf("screenshots in %s", shots)
}

// browser is one test's headless Chromium: steps within a time bound,
// the text of an element, and screenshots at every viewport, each page
// checked to hold no secret.
type browser struct {
	t       *testing.T
	ctx     context.Context
	shots   string
	secrets []string
}

func (b *browser) step(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserStep)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		html, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
		b.t.Fatalf("%s: %v\npage:\n%.3000s", what, err, html)
	}
}

func (b *browser) text(what, sel string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserStep)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		b.t.Fatalf("%s: text of %s: %v", what, sel, err)
	}
	return s
}

// until loads url until the text of sel contains want (a state that
// comes and goes, such as a request between two tries of its hold), and
// returns that text; the test fails after browserStep.
func (b *browser) until(what, url, sel, want string) string {
	b.t.Helper()
	deadline := time.Now().Add(browserStep)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		b.step(what, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(sel)))
		got := b.text(what, sel)
		if strings.Contains(got, want) {
			return got
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s: %q never showed %q", what, got, want)
		}
		<-tick.C
	}
}

// shoot saves the page at both sizes and checks it holds no secret.
func (b *browser) shoot(name string) {
	b.t.Helper()
	for _, vp := range viewports {
		ctx, cancel := context.WithTimeout(b.ctx, browserStep)
		if err := chromedp.Do(ctx, chromedp.EmulateViewport(vp[0], vp[1])); err != nil {
			cancel()
			b.t.Fatalf("viewport %v: %v", vp, err)
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		cancel()
		if err != nil {
			b.t.Fatalf("screenshot %s: %v", name, err)
		}
		file := filepath.Join(b.shots, fmt.Sprintf("%s-%dx%d.png", name, vp[0], vp[1]))
		if err := os.WriteFile(file, png, 0o644); err != nil {
			b.t.Fatal(err)
		}
	}
	b.step("back to the laptop size", chromedp.EmulateViewport(viewports[0][0], viewports[0][1]))
	html, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
	if err != nil {
		b.t.Fatal(err)
	}
	for _, s := range b.secrets {
		if strings.Contains(html, s) {
			b.t.Errorf("page %s: a secret (%d characters) is in the DOM", name, len(s))
		}
	}
}

// signedIn is a browser on e's dashboard, signed in with the admin token,
// on the accounts page; it fails the test if a page shows any of e's
// secrets.
func signedIn(t *testing.T, bctx context.Context, e *env) *browser {
	secrets := []string{e.admin, e.dpToken, e.key}
	for _, c := range e.creds {
		secrets = append(secrets, c)
	}
	b := &browser{t: t, ctx: bctx, shots: artifactsDir(t), secrets: secrets}
	b.step("sign in", chromedp.Navigate(e.cpSrv.URL+"/dashboard/"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SetValue(chromedp.CSS("#token"), e.admin), chromedp.Click(chromedp.CSS(`.login button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS("table.accounts")))
	return b
}

// TestDashboardStatesInBrowser: a pool in trouble as a real Chromium
// shows it, at laptop and phone widths (the screenshots are kept): a
// subscription spent for hours reads "spent" with when it is back, a
// revoked key reads "broken" with why and nothing beside the point (no
// usage bars, no countdown), the pool header names both under what is
// wrong, and the broken account's page shows what it went through.
func TestDashboardStatesInBrowser(t *testing.T) {
	t.Parallel()
	bctx := headless(t)
	e := setup(t, options{accounts: []account{
		{label: "spent-1", oauth: true, priority: 10, windows: &sim.Windows{
			FiveHour: &sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(2 * time.Hour)}}},
		{label: "broken-1", priority: 5, revoked: true},
		{label: "ok-1", priority: 1},
	}})
	// A request meets the spent window and the revoked key, and fails over
	// to ok-1; the revoked key's check (the job a new account gets) breaks
	// it.
	if r := e.post(false); r.status != http.StatusOK {
		t.Fatalf("request: %d %s", r.status, r.body)
	}
	bk := e.account("broken-1")
	if _, err := e.cp.AccountJobs().CheckAccount(t.Context(), uuid.MustParse(bk.Id), bk.CredentialRevision); err != nil {
		t.Fatal(err)
	}
	if st := e.account("broken-1").State; st != weirv1.AccountState_ACCOUNT_STATE_BROKEN {
		t.Fatalf("broken-1 is %v after its check", st)
	}
	if c := e.account("spent-1").Cooldown; c == nil || c.Reason != weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED {
		t.Fatalf("spent-1's cooldown %v, want quota exhausted", c)
	}
	b := signedIn(t, bctx, e)
	base := e.cpSrv.URL
	spent, broken := `tr[data-account="spent-1"]`, `tr[data-account="broken-1"]`
	if got := b.text("spent", spent+" .badge"); got != "spent" {
		t.Errorf("spent-1 badge %q, want spent", got)
	}
	if got := b.text("spent", spent); !strings.Contains(got, "back") {
		t.Errorf("spent-1 row %q, want when it is back", got)
	}
	if got := b.text("broken", broken); !strings.Contains(got, "broken") || strings.Contains(got, "resets") || strings.Contains(got, "cooling") {
		t.Errorf("broken-1 row %q, want broken with why, and nothing beside the point", got)
	}
	if got := b.text("pool header", "section.pool-header"); !strings.Contains(got, "spent-1") || !strings.Contains(got, "broken-1") ||
		!strings.Contains(got, "1 / 3") {
		t.Errorf("pool header %q, want 1 of 3 serving, and both named under what is wrong", got)
	}
	b.shoot("states-accounts")
	b.step("broken account's page", chromedp.Click(chromedp.CSS(broken+` a[href^="/dashboard/accounts/"]`)),
		chromedp.WaitVisible(chromedp.CSS("h1")))
	if got := b.text("broken page", "main"); !strings.Contains(got, "Account broken-1") || !strings.Contains(got, "401") ||
		!strings.Contains(got, "CreateAccount") {
		t.Errorf("broken-1's page %q, want its 401s and the call that created it", got)
	}
	b.shoot("states-broken-account")
	// The audit log links an account's calls to its page.
	b.step("audit log", chromedp.Navigate(base+"/dashboard/audit?procedure=CreateAccount"), chromedp.WaitVisible(chromedp.CSS("table.audit")),
		chromedp.Click(chromedp.CSS(`table.audit a[href="/dashboard/accounts/`+bk.Id+`"]`)), chromedp.WaitVisible(chromedp.CSS("h1")))
	if got := b.text("from the audit log", "h1"); !strings.Contains(got, "broken-1") {
		t.Errorf("the audit log's link led to %q, want broken-1's page", got)
	}
}

// TestDashboardHoldInBrowser: a storm over every account that could serve
// and one account gated for the request's family, as a real Chromium
// shows it while a request waits it out: the pool header counts the
// request held now and names the overloaded and gated accounts, the gated
// account's row reads its gate with when it lifts, and the Requests page
// and the request's own page say it is held and why. When the storm ends
// the held request is served and the header says nothing is held.
func TestDashboardHoldInBrowser(t *testing.T) {
	t.Parallel()
	bctx := headless(t)
	storm := []sim.Fault{{Kind: sim.FaultOverloaded, For: sim.Duration(10 * time.Minute)}}
	e := setup(t, options{hold: 5 * time.Minute, accounts: []account{
		{label: "gated-1", oauth: true, priority: 10, windows: &sim.Windows{
			FiveHour: &sim.Window{Limit: 1000, Used: 100, ResetIn: sim.Duration(4 * time.Hour)},
			Families: map[string]sim.FamilyWindow{"sonnet": {Window: sim.Window{Limit: 1000, Used: 1000, ResetIn: sim.Duration(3 * time.Hour)}}}}},
		{label: "storm-1", priority: 5, faults: storm},
		{label: "storm-2", priority: 1, faults: storm},
	}})

	// The request meets the gate and the storm, and is held.
	type result struct {
		status int
		id     string
		err    error
	}
	done := make(chan result, 1)
	go func() {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.dpSrv.URL+"/v1/messages", strings.NewReader(messagesBody(false)))
		if err != nil {
			done <- result{err: err}
			return
		}
		req.Header.Set("X-Api-Key", e.key)
		req.Header.Set("Anthropic-Version", "2023-06-01")
		req.Header.Set("Content-Type", "application/json")
		res, err := e.client.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer res.Body.Close()
		_, err = io.Copy(io.Discard, res.Body)
		done <- result{status: res.StatusCode, id: res.Header.Get("Weir-Request-Id"), err: err}
	}()
	var held *weirv1.RouteEvent
	eventually(t, "a request held", func() bool {
		res, err := e.routes.ListRouteEvents(t.Context(), connect.NewRequest(&weirv1.ListRouteEventsRequest{Limit: 10, HeldOnly: true}))
		if err != nil || len(res.Msg.Events) == 0 || res.Msg.Events[0].HeldSince == nil {
			return false
		}
		held = res.Msg.Events[0]
		return true
	})
	eventually(t, "gated-1's sonnet gate", func() bool { return len(e.account("gated-1").FamilyGates) > 0 })
	eventually(t, "the storm met on both accounts", func() bool {
		return e.account("storm-1").OverloadedAt != nil && e.account("storm-2").OverloadedAt != nil
	})

	b := signedIn(t, bctx, e)
	base := e.cpSrv.URL
	header := b.until("pool header", base+"/dashboard/", "section.pool-header", "1 request held now")
	for _, want := range []string{"1 / 3 can serve now", "2 overloaded", "sonnet: 0 / 3 can serve it (1 gated)", "1 request held now",
		"storm-1", "storm-2", "gated-1", "sonnet gated"} {
		if !strings.Contains(header, want) {
			t.Errorf("pool header %q: want %q", header, want)
		}
	}
	if got := b.text("gated row", `tr[data-account="gated-1"] .gate`); !strings.Contains(got, "sonnet") {
		t.Errorf("gated-1's gate reads %q, want its family", got)
	}
	if got := b.text("storm row", `tr[data-account="storm-1"] .badge`); got != "overloaded" {
		t.Errorf("storm-1's badge %q during the storm, want overloaded", got)
	}
	b.shoot("hold-accounts")

	// Between two tries of its hold the request reads "in progress": each
	// page is loaded until it is held again.
	b.until("requests page", base+"/dashboard/requests", "table.requests tbody", "held")
	b.shoot("hold-requests")

	if got := b.until("the held request's page", base+"/dashboard/requests/"+held.RequestId, "main", "Held now"); !strings.Contains(got, "attempts so far") {
		t.Errorf("the held request's page %q, want how long it is held and why", got)
	}
	b.shoot("hold-explain")

	// The storm ends: the held request is served, and nothing is held.
	e.sim.Reset()
	select {
	case r := <-done:
		if r.err != nil || r.status != http.StatusOK || r.id != held.RequestId {
			t.Fatalf("the held request: %d %q %v, want 200 for %s", r.status, r.id, r.err, held.RequestId)
		}
	case <-time.After(time.Minute):
		t.Fatal("the held request was not served within a minute of the storm's end")
	}
	// The served request's final event reaches the control plane with its
	// worker's next report (paced): the header says so within that.
	b.until("pool header after the storm", base+"/dashboard/", "section.pool-header", "No request held now")
	b.shoot("hold-after")
}
