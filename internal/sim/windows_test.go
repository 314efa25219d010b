package sim

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const tokW = "sk-ant-oat01-wwwwwwwwwwwwwwwwwwwwwwww"

// windowed is a script of one OAuth account "win" (credential tokW) with
// the given windows, on top of the usual test accounts.
func windowed(ws *Windows) Script {
	sc := testScript()
	sc.Accounts = append(sc.Accounts, AccountScript{Name: "win", Credential: tokW, Windows: ws})
	return sc
}

// tokensOf is what a successful request with body adds to the windows.
func tokensOf(b *bundle, body string) int64 {
	return int64(approxTokens(len(body)) + b.sim.reply.outputTokens)
}

func epochOf(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

func (b *bundle) windows(t *testing.T, name string) WindowsState {
	t.Helper()
	st, err := b.sim.Windows(name)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// wantUnified checks unified headers by suffix; "" means absent.
func wantUnified(t *testing.T, h http.Header, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := h.Get("anthropic-ratelimit-unified-" + k); got != v {
			t.Errorf("unified-%s = %q, want %q", k, got, v)
		}
	}
}

func TestWindowsFillAndReset(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{ManualClock: true, Script: windowed(&Windows{
		FiveHour: &Window{Limit: 10_000, ResetIn: Duration(time.Hour)},
		SevenDay: &Window{Limit: 100_000, Used: 500, ResetsAt: testNow.Add(72 * time.Hour)},
		Families: map[string]FamilyWindow{FamilyOpus: {Window: Window{Limit: 5000}}},
	})})
	sBody, oBody := messagesBody(sonnet, false), messagesBody(opus, true)
	ns, no := tokensOf(b, sBody), tokensOf(b, oBody)

	// Sonnet fills five_hour and seven_day; opus also its family window.
	for _, body := range []string{sBody, oBody} {
		if resp, data := b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), body); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, data)
		}
	}
	// Neither a token count nor a failed attempt uses the windows.
	if resp, _ := b.call(t, "POST", "/v1/messages/count_tokens", oauthHeaders(tokW), sBody); resp.StatusCode != 200 {
		t.Fatalf("count_tokens: %d", resp.StatusCode)
	}
	if err := b.sim.AddFaults("win", Fault{Kind: FaultOverloaded}); err != nil {
		t.Fatal(err)
	}
	if resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), sBody); resp.StatusCode != 529 {
		t.Fatalf("fault: %d", resp.StatusCode)
	}

	opusReset := time.Date(2026, 3, 7, 10, 0, 0, 0, time.UTC) // the regular weekly reset
	st := b.windows(t, "win")
	if st.FiveHour == nil || st.FiveHour.Used != ns+no || st.FiveHour.Limit != 10_000 || !st.FiveHour.ResetsAt.Equal(testNow.Add(time.Hour)) ||
		st.FiveHour.Claim != ClaimFiveHour || st.FiveHour.Header != "5h" {
		t.Errorf("five_hour %+v, want used %d", st.FiveHour, ns+no)
	}
	if st.SevenDay == nil || st.SevenDay.Used != 500+ns+no || !st.SevenDay.ResetsAt.Equal(testNow.Add(72*time.Hour)) {
		t.Errorf("seven_day %+v, want used %d", st.SevenDay, 500+ns+no)
	}
	if o, ok := st.Families[FamilyOpus]; !ok || o.Used != no || o.Claim != ClaimSevenDayOpus || o.Header != "7d_oi" || !o.ResetsAt.Equal(opusReset) {
		t.Errorf("opus %+v, want used %d", o, no)
	}
	if got, want := st.FiveHour.Utilization, float64(ns+no)/10_000; got != want {
		t.Errorf("utilization %v, want %v", got, want)
	}

	// The five-hour window resets on schedule; the next reset is 5h on.
	if err := b.sim.Advance(time.Hour); err != nil {
		t.Fatal(err)
	}
	st = b.windows(t, "win")
	if st.FiveHour.Used != 0 || !st.FiveHour.ResetsAt.Equal(testNow.Add(6*time.Hour)) {
		t.Errorf("five_hour after its reset %+v", st.FiveHour)
	}
	if st.SevenDay.Used != 500+ns+no {
		t.Errorf("seven_day changed at the five-hour reset: %+v", st.SevenDay)
	}

	// Past the weekly reset (and several five-hour ones), over HTTP.
	if err := b.sim.Advance(71 * time.Hour); err != nil {
		t.Fatal(err)
	}
	resp, data := b.call(t, "GET", "/_sim/accounts/win/windows", nil, "")
	if resp.StatusCode != 200 {
		t.Fatalf("GET windows: %d %s", resp.StatusCode, data)
	}
	st = decode[WindowsState](t, data)
	if st.SevenDay.Used != 0 || !st.SevenDay.ResetsAt.Equal(testNow.Add(72*time.Hour+sevenDayPeriod)) {
		t.Errorf("seven_day after its reset %+v", st.SevenDay)
	}
	if o := st.Families[FamilyOpus]; o.Used != 0 || !o.ResetsAt.Equal(opusReset.Add(sevenDayPeriod)) {
		t.Errorf("opus after its reset %+v", o)
	}
	if st.FiveHour.Used != 0 || !st.FiveHour.ResetsAt.Equal(testNow.Add(76*time.Hour)) {
		t.Errorf("five_hour %+v, want its reset at now+76h", st.FiveHour)
	}
	if st.Overage != nil {
		t.Errorf("overage %+v, want null", st.Overage)
	}

	if resp, _ := b.call(t, "GET", "/_sim/accounts/nobody/windows", nil, ""); resp.StatusCode != 404 {
		t.Errorf("unknown account: %d", resp.StatusCode)
	}
	// Accounts without windows have none.
	if st := b.windows(t, "sub-o"); st.FiveHour != nil || st.SevenDay != nil || len(st.Families) != 0 {
		t.Errorf("sub-o windows %+v", st)
	}
}

// TestWindowResetPassedAtLoad: a reset already past when the script is
// loaded means the window has reset since.
func TestWindowResetPassedAtLoad(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{ManualClock: true, Script: windowed(&Windows{
		SevenDay: &Window{Limit: 1000, Used: 1000, ResetsAt: testNow.Add(-time.Hour)},
	})})
	st := b.windows(t, "win")
	if st.SevenDay.Used != 0 || !st.SevenDay.ResetsAt.Equal(testNow.Add(-time.Hour+sevenDayPeriod)) || st.FiveHour != nil {
		t.Errorf("windows %+v %+v", st.SevenDay, st.FiveHour)
	}
	if resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), messagesBody(sonnet, false)); resp.StatusCode != 200 {
		t.Errorf("status %d", resp.StatusCode)
	}
}

func TestWindowRejection(t *testing.T) {
	t.Parallel()
	const r = 51811 * time.Second
	tests := []struct {
		name       string
		ws         Windows
		model      string
		retryAfter string
		want       map[string]string
	}{
		{"five hour", Windows{
			FiveHour: &Window{Limit: 100, Used: 100, ResetIn: Duration(90 * time.Minute)},
			SevenDay: &Window{Limit: 1000, Used: 850, ResetIn: Duration(50 * time.Hour)},
		}, sonnet, "5400", map[string]string{
			"status": "rejected", "representative-claim": "five_hour", "reset": epochOf(testNow.Add(90 * time.Minute)),
			"5h-status": "rejected", "5h-utilization": "1.0", "5h-reset": epochOf(testNow.Add(90 * time.Minute)),
			"7d-status": "allowed_warning", "7d-utilization": "0.85", "7d-reset": epochOf(testNow.Add(50 * time.Hour)),
			"7d_oi-status": "", "overage-status": "", "fallback-percentage": "0.5",
		}},
		{"seven day", Windows{
			FiveHour: &Window{Limit: 1000, Used: 210, ResetIn: Duration(time.Hour)},
			SevenDay: &Window{Limit: 1000, Used: 1200, ResetIn: Duration(r)},
		}, sonnet, "51811", map[string]string{
			"status": "rejected", "representative-claim": "seven_day", "reset": epochOf(testNow.Add(r)),
			"5h-status": "allowed", "5h-utilization": "0.21", "5h-reset": epochOf(testNow.Add(time.Hour)),
			"7d-status": "rejected", "7d-utilization": "1.0", "7d-reset": epochOf(testNow.Add(r)),
		}},
		// Both spent: the request cannot pass before the later reset.
		{"both", Windows{
			FiveHour: &Window{Limit: 1000, Used: 1000, ResetIn: Duration(time.Hour)},
			SevenDay: &Window{Limit: 1000, Used: 1000, ResetIn: Duration(2 * time.Hour)},
		}, opus, "7200", map[string]string{
			"status": "rejected", "representative-claim": "seven_day", "reset": epochOf(testNow.Add(2 * time.Hour)),
			"5h-status": "rejected", "7d-status": "rejected",
		}},
		// The production capture: weekly at a warning, the overage-included
		// scoped window spent.
		{"scoped, production shape", Windows{
			FiveHour: &Window{Limit: 1000, Used: 210, ResetIn: Duration(time.Hour)},
			SevenDay: &Window{Limit: 1000, Used: 940, ResetIn: Duration(r)},
			Families: map[string]FamilyWindow{FamilyOpus: {Window: Window{Limit: 500, Used: 500, ResetIn: Duration(r)}, Claim: ClaimSevenDayOverageIncluded}},
			Overage:  &Overage{DisabledReason: "org_level_disabled"},
		}, opus, "51811", map[string]string{
			"status": "rejected", "representative-claim": "seven_day_overage_included", "reset": epochOf(testNow.Add(r)),
			"5h-status": "allowed", "5h-utilization": "0.21",
			"7d-status": "allowed_warning", "7d-utilization": "0.94",
			"7d_oi-status": "rejected", "7d_oi-utilization": "1.0", "7d_oi-reset": epochOf(testNow.Add(r)),
			"overage-status": "rejected", "overage-disabled-reason": "org_level_disabled",
		}},
		{"scoped, default claim", Windows{
			SevenDay: &Window{Limit: 1000, Used: 10},
			Families: map[string]FamilyWindow{FamilySonnet: {Window: Window{Limit: 500, Used: 600, ResetIn: Duration(3 * time.Hour)}, Header: "7d_sonnet"}},
		}, sonnet, "10800", map[string]string{
			"status": "rejected", "representative-claim": "seven_day_sonnet", "reset": epochOf(testNow.Add(3 * time.Hour)),
			"7d-status": "allowed", "7d-utilization": "0.01", "5h-status": "",
			"7d_sonnet-status": "rejected", "7d_sonnet-utilization": "1.0",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ws := tt.ws
			b := setup(t, Config{ManualClock: true, Script: windowed(&ws)})
			for _, stream := range []bool{false, true} {
				body := messagesBody(tt.model, stream)
				resp, data := b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), body)
				wantError(t, resp, data, 429, "rate_limit_error", rateLimitMessage)
				wantUnified(t, resp.Header, tt.want)
				if got := resp.Header.Get("retry-after"); got != tt.retryAfter {
					t.Errorf("retry-after %q, want %q", got, tt.retryAfter)
				}
				if got := resp.Header.Get("x-should-retry"); got != "true" {
					t.Errorf("x-should-retry %q", got)
				}
				want := Attempt{Time: testNow, Account: "win", Model: tt.model, Path: "/v1/messages", Stream: stream, BodySHA256: bodyHash(body), Outcome: outcomeUsageLimit, Status: 429}
				if a := b.nextAttempt(t); a != want {
					t.Errorf("attempt %+v, want %+v", a, want)
				}
			}
		})
	}
}

// TestScopedRejectionIsFamilyOnly: a spent family window rejects only its
// family while the account-wide windows have headroom.
func TestScopedRejectionIsFamilyOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{ManualClock: true, Script: windowed(&Windows{
		FiveHour: &Window{Limit: 10_000, Used: 2100},
		SevenDay: &Window{Limit: 10_000, Used: 9400},
		Families: map[string]FamilyWindow{FamilyOpus: {Window: Window{Limit: 500, Used: 500, ResetIn: Duration(10 * time.Hour)}}},
	})})
	// A fault queued for the account is not used up by a rejection.
	if err := b.sim.AddFaults("win", Fault{Kind: FaultOverloaded, Model: sonnet}); err != nil {
		t.Fatal(err)
	}
	resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), messagesBody(opus, false))
	if resp.StatusCode != 429 || resp.Header.Get("anthropic-ratelimit-unified-representative-claim") != ClaimSevenDayOpus {
		t.Fatalf("opus: %d, claim %q", resp.StatusCode, resp.Header.Get("anthropic-ratelimit-unified-representative-claim"))
	}
	if resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), messagesBody(sonnet, false)); resp.StatusCode != 529 {
		t.Fatalf("sonnet: %d, want the queued 529", resp.StatusCode)
	}
	body := messagesBody(sonnet, true)
	resp, _ = b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), body)
	if resp.StatusCode != 200 {
		t.Fatalf("sonnet: %d", resp.StatusCode)
	}
	n := tokensOf(b, body)
	wantUnified(t, resp.Header, map[string]string{
		"status": "allowed_warning", "representative-claim": "seven_day",
		"5h-status": "allowed", "5h-utilization": formatUtilization(float64((2100+n)*100/10_000) / 100),
		"7d-status": "allowed_warning", "7d-utilization": "0.94",
		// The opus window is not this request's and is not reported.
		"7d_oi-status": "",
	})
	// Haiku has no family window either.
	if resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), messagesBody("claude-haiku-4-5-20251001", false)); resp.StatusCode != 200 {
		t.Fatalf("haiku: %d", resp.StatusCode)
	}
	// When the family window resets, opus passes again.
	if err := b.sim.Advance(10 * time.Hour); err != nil {
		t.Fatal(err)
	}
	if resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), messagesBody(opus, false)); resp.StatusCode != 200 {
		t.Fatalf("opus after the reset: %d", resp.StatusCode)
	}
}

// TestWindowHeadersLive: successes report the live windows, including
// the request itself, and saturate at 0.99 where the usage endpoint says
// 100.
func TestWindowHeadersLive(t *testing.T) {
	t.Parallel()
	body := messagesBody(sonnet, false)
	n := int64(approxTokens(len(body)) + newReply(8).outputTokens)
	b := setup(t, Config{ManualClock: true, Script: windowed(&Windows{
		FiveHour: &Window{Limit: 1000, Used: 452 - n, ResetIn: Duration(2 * time.Hour)},
		SevenDay: &Window{Limit: 1000, Used: 999, ResetIn: Duration(30 * time.Hour)},
		Overage:  &Overage{Status: "allowed"},
	})})

	// This request takes the weekly window past its limit; it was allowed,
	// so it says allowed_warning at 0.99.
	resp, data := b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	wantUnified(t, resp.Header, map[string]string{
		"status": "allowed_warning", "representative-claim": "seven_day", "reset": epochOf(testNow.Add(30 * time.Hour)),
		"5h-status": "allowed", "5h-utilization": "0.45", "5h-reset": epochOf(testNow.Add(2 * time.Hour)),
		"7d-status": "allowed_warning", "7d-utilization": "0.99", "7d-reset": epochOf(testNow.Add(30 * time.Hour)),
		"overage-status": "allowed", "overage-disabled-reason": "",
	})

	u := b.usage(t, tokW, "")
	if u.SevenDay == nil || u.SevenDay.Utilization != 100 || u.FiveHour == nil || u.FiveHour.Utilization != 45.2 {
		t.Errorf("usage five_hour %+v seven_day %+v, want 45.2 and 100", u.FiveHour, u.SevenDay)
	}
	if !u.ExtraUsage.IsEnabled {
		t.Errorf("extra_usage %+v, want enabled with overage allowed", u.ExtraUsage)
	}
	if st := b.windows(t, "win"); st.SevenDay.Utilization != 1 || st.SevenDay.Used != 999+n {
		t.Errorf("seven_day %+v", st.SevenDay)
	}

	// The next one is rejected at 1.0.
	resp, _ = b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), body)
	if resp.StatusCode != 429 {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	wantUnified(t, resp.Header, map[string]string{"status": "rejected", "7d-status": "rejected", "7d-utilization": "1.0", "5h-utilization": "0.45"})
}

// TestUnifiedFaultOnWindowedAccount: a scripted unified rejection on an
// account with windows reports the live windows, and without reset_in the
// claimed window's own reset.
func TestUnifiedFaultOnWindowedAccount(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{ManualClock: true, Script: windowed(&Windows{
		FiveHour: &Window{Limit: 1000, Used: 300, ResetIn: Duration(time.Hour)},
		SevenDay: &Window{Limit: 1000, Used: 500, ResetIn: Duration(30 * time.Hour)},
	})})
	if err := b.sim.AddFaults("win", Fault{Kind: FaultRateLimit, Unified: &UnifiedRejection{Claim: ClaimSevenDay}}); err != nil {
		t.Fatal(err)
	}
	resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tokW), messagesBody(sonnet, false))
	if resp.StatusCode != 429 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	wantUnified(t, resp.Header, map[string]string{
		"status": "rejected", "representative-claim": "seven_day", "reset": epochOf(testNow.Add(30 * time.Hour)),
		"5h-status": "allowed", "5h-utilization": "0.3", "5h-reset": epochOf(testNow.Add(time.Hour)),
		"7d-status": "rejected", "7d-utilization": "1.0",
	})
}

func TestWindowsScriptValidate(t *testing.T) {
	t.Parallel()
	oauth := func(mod func(*AccountScript)) Script {
		a := AccountScript{Name: "o", Credential: "sk-ant-oat01-oooo"}
		mod(&a)
		return Script{Accounts: []AccountScript{a}}
	}
	tests := []struct {
		name string
		sc   Script
		want []string
	}{
		{"valid", oauth(func(a *AccountScript) {
			a.Windows = &Windows{
				FiveHour: &Window{Limit: 1, ResetIn: Duration(time.Hour)},
				SevenDay: &Window{Limit: 1, ResetsAt: testNow},
				Families: map[string]FamilyWindow{FamilyOpus: {Window: Window{Limit: 1}, Claim: ClaimSevenDayOverageIncluded}},
				Overage:  &Overage{Status: "rejected", DisabledReason: "out_of_credits"},
			}
			a.RefreshToken, a.AccessExpiresIn, a.UsageReadsPer10m = "sk-ant-ort01-r", Duration(time.Hour), -1
			a.Grants = []Grant{{ID: "g1", ExpiresIn: Duration(time.Hour)}, {ID: "g2"}}
		}), nil},
		{"api key extras", Script{Accounts: []AccountScript{{Name: "k", Credential: "sk-ant-api03-k", Windows: &Windows{}, RefreshToken: "r", AccessExpiresIn: 1, UsageReadsPer10m: 3, Grants: []Grant{{ID: "g"}}}}}, []string{
			"accounts[0].windows: only valid for oauth", "accounts[0].refresh_token: only valid", "access_expires_in: only valid",
			"usage_reads_per_10m: only valid", "accounts[0].grants: only valid",
		}},
		{"bad windows", oauth(func(a *AccountScript) {
			a.Windows = &Windows{
				FiveHour: &Window{Limit: 0, Used: -1},
				SevenDay: &Window{Limit: 1, ResetsAt: testNow, ResetIn: Duration(time.Hour)},
				Families: map[string]FamilyWindow{
					"haiku":      {Window: Window{Limit: 1}},
					FamilyOpus:   {Window: Window{Limit: 1, ResetIn: Duration(-time.Hour)}, Claim: ClaimFiveHour, Header: "7d"},
					FamilySonnet: {Window: Window{Limit: 1}, Header: "Bad-Header"},
				},
				Overage: &Overage{Status: "maybe"},
			}
		}), []string{
			"windows.five_hour.limit: 0 must be positive", "windows.five_hour.used: -1", "windows.seven_day: set resets_at or reset_in",
			`windows.families.haiku: unknown family "haiku"`, "windows.families.opus.reset_in", `windows.families.opus.claim: "five_hour"`,
			`windows.families.opus.header: "7d"`, `windows.families.sonnet.header: "Bad-Header"`, `windows.overage.status: "maybe"`,
		}},
		{"bad tokens and grants", oauth(func(a *AccountScript) {
			a.RefreshToken, a.AccessExpiresIn, a.UsageReadsPer10m = "bad token", Duration(-time.Second), -2
			a.Grants = []Grant{{}, {ID: "g", ExpiresAt: testNow, ExpiresIn: 1}, {ID: "g", ExpiresIn: -1}}
		}), []string{
			"refresh_token: not a well-formed", "access_expires_in: -1s is negative", "usage_reads_per_10m: -2",
			"grants[0].id: required", "grants[1]: set expires_at or expires_in", `grants[2].id: "g" already used by grants[1]`, "grants[2].expires_in",
		}},
		{"refresh token clashes", Script{Accounts: []AccountScript{
			{Name: "a", Credential: "sk-ant-oat01-a", RefreshToken: "sk-ant-ort01-x"},
			{Name: "b", Credential: "sk-ant-oat01-b", RefreshToken: "sk-ant-ort01-x"},
			{Name: "c", Credential: "sk-ant-oat01-c", RefreshToken: "sk-ant-oat01-a"},
			{Name: "d", Credential: "sk-ant-oat01-d", RefreshToken: "sk-ant-oat01-d"},
		}}, []string{
			"accounts[1].refresh_token: already used by accounts[0]", "accounts[2].refresh_token: is the credential of accounts[0]",
			"accounts[3].refresh_token: must differ from the credential",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.sc.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate accepted an invalid script")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestDocExampleScript: the example script in doc.go loads, and behaves
// as its comments say.
func TestDocExampleScript(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	_, example, ok := strings.Cut(string(src), "// # Example script\n//\n")
	if !ok {
		t.Fatal("doc.go has no example script")
	}
	var js strings.Builder
	for line := range strings.SplitSeq(example, "\n") {
		rest, ok := strings.CutPrefix(line, "//\t")
		if !ok {
			break
		}
		js.WriteString(rest + "\n")
	}
	path := filepath.Join(t.TempDir(), "example.json")
	if err := os.WriteFile(path, []byte(js.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	sc, err := LoadScript(path)
	if err != nil {
		t.Fatalf("%v\n%s", err, js.String())
	}
	b := setup(t, Config{ManualClock: true, Script: sc})
	const tok = "sk-ant-oat01-max00000000000000000"
	// Opus is spent (the production shape), sonnet goes through once the
	// scripted 529s are used up.
	resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tok), messagesBody(opus, false))
	wantUnified(t, resp.Header, map[string]string{"representative-claim": "seven_day_overage_included", "7d_oi-status": "rejected", "overage-disabled-reason": "org_level_disabled"})
	var statuses []int
	for range 3 {
		resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tok), messagesBody(sonnet, false))
		statuses = append(statuses, resp.StatusCode)
	}
	if !slices.Equal(statuses, []int{529, 529, 200}) || resp.StatusCode != 429 {
		t.Errorf("opus %d, sonnet %v", resp.StatusCode, statuses)
	}
	if got := b.claim(t, tok, "g1", "r1"); got != GrantReset {
		t.Errorf("claim: %s", got)
	}
}
