package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/weirhq/weir/internal/poolstatus"
)

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func fakeJWT(claims map[string]any) string {
	b, _ := json.Marshal(claims)
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(`{"alg":"RS256"}`)) + "." + enc.EncodeToString(b) + ".c2lnbmF0dXJlLW5vdC1jaGVja2Vk"
}

// TestAccountsImport imports every kind of credential file against a real
// `weir dev --simulate`: duplicates (of a demo account, and of a file
// imported twice) are reported, not failures; an unreadable file fails the
// batch; no credential is ever printed.
func TestAccountsImport(t *testing.T) {
	t.Parallel()
	admin := sharedDev(t).adminIn

	const (
		claudeAccess  = "sk-ant-oat01-import-access-00000000000000000001"
		claudeRefresh = "sk-ant-ort01-import-refresh-0000000000000000001"
		setupToken    = "sk-ant-oat01-setup-token-000000000000000000000002"
		codexRefresh  = "rt_import-codex-refresh-00000000000000000003"
		openAIKey     = "sk-proj-import-openai-000000000000000000004"
		stdinKey      = "sk-proj-import-stdin-0000000000000000000005"
	)
	codexAccess := fakeJWT(map[string]any{"exp": time.Now().Add(8 * time.Hour).Unix()})
	claude := writeFile(t, ".credentials.json", claudeCodeCreds(claudeAccess, claudeRefresh))
	token := writeFile(t, "token", setupToken+"\n")
	codexAuth, _ := json.Marshal(map[string]any{"OPENAI_API_KEY": nil, "tokens": map[string]any{
		"id_token":     fakeJWT(map[string]any{"email": "dev@example.com"}),
		"access_token": codexAccess, "refresh_token": codexRefresh, "account_id": "chatgpt-import-1",
	}})
	codex := writeFile(t, "auth.json", string(codexAuth))
	openaiAuth := writeFile(t, "auth.json", `{"OPENAI_API_KEY":"`+openAIKey+`","tokens":null}`)
	demoKey := writeFile(t, "key", demoAccounts[0].credential)
	garbage := writeFile(t, "notes.txt", "hello there, not a key")
	secrets := []string{claudeAccess, claudeRefresh, setupToken, codexAccess, codexRefresh, openAIKey, stdinKey, demoAccounts[0].credential}
	noSecrets := func(out string) {
		t.Helper()
		for _, s := range secrets {
			if strings.Contains(out, s) {
				t.Fatalf("output shows a credential:\n%s", out)
			}
		}
	}

	out, err := admin("", "accounts", "import", "--dry-run", claude, token, codex, openaiAuth, demoKey)
	noSecrets(out)
	if err != nil || strings.Count(out, "would import as") != 5 || !strings.Contains(out, "would import as dev@example.com (codex)") {
		t.Fatalf("dry run: %v:\n%s", err, out)
	}
	if out, _ := admin("", "accounts", "list"); strings.Contains(out, "dev@example.com") {
		t.Fatal("a dry run added an account")
	}

	out, err = admin(stdinKey+"\n", "accounts", "import", "--label-prefix", "team-", claude, token, codex, openaiAuth, demoKey, garbage, "-")
	noSecrets(out)
	if err == nil || !strings.Contains(err.Error(), "1 of 7 failed") {
		t.Fatalf("import with one bad file: want 1 of 7 failed: %v:\n%s", err, out)
	}
	for _, want := range []string{
		claude + ": imported as team-claude-",
		token + ": imported as team-claude-token-",
		codex + ": imported as team-dev@example.com (codex)",
		openaiAuth + ": imported as team-openai-key-",
		demoKey + ": already in the pool as demo-api-key",
		garbage + ": failed: not a credential",
		"-: imported as team-openai-key-",
		"importing " + claude + " (claude-code)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("import output lacks %q:\n%s", want, out)
		}
	}

	// Again, as JSON: everything is a duplicate, and that is success.
	out, err = admin("", "accounts", "import", "--json", claude, token, codex, openaiAuth)
	noSecrets(out)
	if err != nil {
		t.Fatalf("re-import: %v:\n%s", err, out)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	var results []importResult
	for sc.Scan() {
		if !strings.HasPrefix(sc.Text(), "{") {
			continue
		}
		var r importResult
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("--json line %q: %v", sc.Text(), err)
		}
		results = append(results, r)
	}
	if len(results) != 4 {
		t.Fatalf("%d results:\n%s", len(results), out)
	}
	for _, r := range results {
		if r.Status != "duplicate" || !strings.HasPrefix(r.ExistingLabel, "team-") || r.Identity == "" {
			t.Errorf("re-import of %s: %+v", r.File, r)
		}
	}

	// The identity shows in accounts get: the ChatGPT account id, a hash.
	out, err = admin("", "accounts", "get", "team-dev@example.com")
	if err != nil || !strings.Contains(out, "identity: chatgpt-import-1") {
		t.Fatalf("accounts get: %v:\n%s", err, out)
	}
	out, err = admin("", "accounts", "get", "demo-api-key", "--json")
	var got struct{ Identity string }
	if err != nil || json.Unmarshal([]byte(out), &got) != nil || !regexp.MustCompile(`^sha256:[0-9a-f]{16}$`).MatchString(got.Identity) {
		t.Fatalf("accounts get --json: %v: %q", err, got.Identity)
	}
}

func claudeCodeCreds(access, refresh string) string {
	b, _ := json.Marshal(map[string]any{"claudeAiOauth": map[string]any{
		"accessToken": access, "refreshToken": refresh, "expiresAt": time.Now().Add(8 * time.Hour).UnixMilli(),
		"scopes": []string{"user:inference", "user:profile"}, "subscriptionType": "max",
	}})
	return string(b)
}

// lineWriter hands each line written to it to lines.
type lineWriter struct {
	buf   syncBuffer
	lines chan string
	part  string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.buf.Write(p) //nolint:errcheck // a buffer
	w.part += string(p)
	for {
		i := strings.IndexByte(w.part, '\n')
		if i < 0 {
			return len(p), nil
		}
		select {
		case w.lines <- w.part[:i]:
		default:
		}
		w.part = w.part[i+1:]
	}
}

// login runs `weir login` against dev with its simulator's endpoints;
// answer gets the authorize URL the command printed and returns what to
// paste.
func login(t *testing.T, dev *devStack, provider string, extra url.Values, answer func(authorize *url.URL) string, args ...string) (string, error) {
	t.Helper()
	simURL := dev.SimulatorURL
	tokenPath := "/v1/oauth/token"
	if provider == "codex" {
		tokenPath = "/oauth/token"
	}
	authorize := simURL + "/oauth/authorize"
	if len(extra) > 0 {
		authorize += "?" + extra.Encode()
	}
	pr, pw := io.Pipe()
	out := &syncBuffer{}
	errOut := &lineWriter{lines: make(chan string, 100)}
	e := env{
		getenv: func(k string) string { return map[string]string{"WEIR_DATA_DIR": dev.dataDir}[k] },
		stdin:  pr, stdout: out, stderr: errOut,
	}
	done := make(chan error, 1)
	go func() {
		done <- run(t.Context(), append([]string{"login", provider, "--authorize-url", authorize, "--token-url", simURL + tokenPath}, args...), e)
		pw.Close()
	}()
	for {
		select {
		case err := <-done:
			return out.String() + errOut.buf.String(), err
		case line := <-errOut.lines:
			line = strings.TrimSpace(line)
			if !strings.HasPrefix(line, simURL+"/oauth/authorize?") {
				continue
			}
			u, err := url.Parse(line)
			if err != nil {
				t.Fatal(err)
			}
			go io.WriteString(pw, answer(u)+"\n") //nolint:errcheck // the command may have quit
		case <-t.Context().Done():
			t.Fatal("login did not finish")
		}
	}
}

// approve asks the simulator's authorize endpoint for a code, as a browser
// would, and returns what it answered.
func approve(t *testing.T, u *url.URL) (code, state, redirect string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, u.String(), nil)
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a struct {
		Code        string `json:"code"`
		State       string `json:"state"`
		RedirectURI string `json:"redirect_uri"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("authorize: %d %v", resp.StatusCode, err)
	}
	return a.Code, a.State, a.RedirectURI
}

// TestLogin runs the OAuth login of both providers against the simulator
// of a real `weir dev --simulate`, with the code pasted on stdin: each adds
// an account named by its identity; a login already in the pool is
// reported; a wrong state is refused by weir, a wrong verifier by the
// token endpoint.
func TestLogin(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	admin := dev.adminIn

	var params url.Values
	out, err := login(t, dev, "claude", nil, func(u *url.URL) string {
		params = u.Query()
		code, state, _ := approve(t, u)
		return code + "#" + state
	}, "--base-url", dev.SimulatorURL)
	if err != nil {
		t.Fatalf("login claude: %v\n%s", err, out)
	}
	for k, want := range map[string]string{
		"client_id": "9d1c250a-e61b-44d9-88ed-5944d1962f5e", "response_type": "code", "code": "true",
		"redirect_uri": "https://console.anthropic.com/oauth/code/callback", "scope": "org:create_api_key user:profile user:inference",
		"code_challenge_method": "S256",
	} {
		if params.Get(k) != want {
			t.Errorf("authorize %s = %q, want %q", k, params.Get(k), want)
		}
	}
	m := regexp.MustCompile(`logged in: added (login-\S+@sim\.invalid)`).FindStringSubmatch(out)
	// The credential column is a hint: the prefix, an ellipsis, 4 characters.
	if m == nil || regexp.MustCompile(`sk-ant-o[ar]t01-[A-Za-z0-9]{5}`).MatchString(out) {
		t.Fatalf("login claude output:\n%s", out)
	}
	got, err := admin("", "accounts", "get", m[1], "--json")
	var acct struct{ Identity, AuthKind, Provider string }
	if err != nil || json.Unmarshal([]byte(got), &acct) != nil ||
		!regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-`).MatchString(acct.Identity) || acct.AuthKind != "AUTH_KIND_OAUTH" {
		t.Fatalf("the logged-in account: %v %+v\n%s", err, acct, got)
	}

	// Codex: the pasted answer is the URL the browser landed on.
	out, err = login(t, dev, "codex", nil, func(u *url.URL) string {
		params = u.Query()
		_, _, redirect := approve(t, u)
		return redirect
	}, "--base-url", dev.SimulatorURL+"/backend-api", "--label", "codex-login")
	if err != nil || !strings.Contains(out, "logged in: added codex-login") {
		t.Fatalf("login codex: %v\n%s", err, out)
	}
	if params.Get("id_token_add_organizations") != "true" || params.Get("codex_cli_simplified_flow") != "true" ||
		params.Get("redirect_uri") != "http://localhost:1455/auth/callback" || params.Get("scope") != "openid profile email offline_access" {
		t.Errorf("codex authorize parameters: %v", params)
	}
	if got, err := admin("", "accounts", "get", "codex-login"); err != nil || !strings.Contains(got, "identity: ") || !strings.Contains(got, "codex") {
		t.Fatalf("accounts get codex-login: %v\n%s", err, got)
	}

	// Logging in to a demo account again: it is in the pool already.
	out, err = login(t, dev, "claude", url.Values{"account": {"demo-max-1"}}, func(u *url.URL) string {
		code, state, _ := approve(t, u)
		return code + "#" + state
	}, "--base-url", dev.SimulatorURL)
	if err != nil || !strings.Contains(out, "already in the pool as demo-max-1") {
		t.Fatalf("login to demo-max-1: %v\n%s", err, out)
	}

	// A code with another login's state is refused before any exchange.
	out, err = login(t, dev, "claude", nil, func(u *url.URL) string {
		code, _, _ := approve(t, u)
		return code + "#not-this-login"
	})
	if err == nil || !strings.Contains(err.Error(), "state does not match") {
		t.Fatalf("wrong state: %v\n%s", err, out)
	}
	// A code issued for another challenge: the simulator refuses weir's
	// verifier.
	out, err = login(t, dev, "claude", nil, func(u *url.URL) string {
		q := u.Query()
		q.Set("code_challenge", pkceS256("someone-else's-verifier"))
		u.RawQuery = q.Encode()
		code, state, _ := approve(t, u)
		return code + "#" + state
	})
	if err == nil || !strings.Contains(err.Error(), "Invalid code verifier") {
		t.Fatalf("wrong verifier: %v\n%s", err, out)
	}
}

// TestStatus shows the pool of a real `weir dev --simulate` with a paused
// account and one cooled by a rate limit, as text and as JSON.
func TestStatus(t *testing.T) {
	t.Parallel()
	// Its own stack: it pauses demo accounts, cools one with a fault,
	// fails fast for every request and counts the whole pool.
	dev := startDev(t, t.TempDir())
	admin := dev.adminIn

	for _, args := range [][]string{
		{"settings", "set", "capacity_hold=0s"},
		{"accounts", "pause", "demo-max-1"},
		{"accounts", "pause", "demo-max-2"},
	} {
		if out, err := admin("", args...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	// The API key, alone now, serves a request: a spill.
	{
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, dev.DataplaneURL+"/v1/messages", strings.NewReader(hello))
		req.Header.Set("x-api-key", dev.ClientKey)
		req.Header.Set("anthropic-version", "2023-06-01")
		req.Header.Set("content-type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("a request on the API key: %v %v", err, resp)
		}
		resp.Body.Close()
	}
	// Its route event reaches the control plane with the worker's next
	// report.
	for tick := time.NewTicker(20 * time.Millisecond); ; {
		if out, _ := admin("", "status", "--json"); strings.Contains(out, `"account": "demo-api-key"`) {
			tick.Stop()
			break
		}
		select {
		case <-tick.C:
		case <-t.Context().Done():
			t.Fatal("the spill was never recorded")
		}
	}
	// Then it meets a long rate limit; a failed request is no spill.
	resp, err := http.Post(dev.SimulatorURL+"/_sim/accounts/demo-api-key/faults", "application/json",
		strings.NewReader(`[{"kind":"rate_limit","retry_after":600}]`))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("add fault: %v %v", err, resp)
	}
	resp.Body.Close()
	// The request may wait for capacity; the cooldown is written at its
	// first attempt, and that is what the test waits for.
	reqCtx, cancelReq := context.WithCancel(t.Context())
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		req, _ := http.NewRequestWithContext(reqCtx, http.MethodPost, dev.DataplaneURL+"/v1/messages", strings.NewReader(hello))
		req.Header.Set("x-api-key", dev.ClientKey)
		req.Header.Set("anthropic-version", "2023-06-01")
		req.Header.Set("content-type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	tick := time.NewTicker(20 * time.Millisecond)
	for cooled := false; !cooled; {
		select {
		case <-tick.C:
		case <-t.Context().Done():
			t.Fatal("demo-api-key was not cooled")
		}
		out, _ := admin("", "accounts", "get", "demo-api-key", "--json")
		cooled = strings.Contains(out, "ACCOUNT_STATE_COOLING")
	}
	tick.Stop()
	cancelReq()
	<-sent
	if out, err := admin("", "accounts", "resume", "demo-max-2"); err != nil {
		t.Fatalf("resume: %v\n%s", err, out)
	}

	// Usage readings for the headroom columns (the poller may not have
	// read yet).
	for _, label := range []string{"demo-max-2", "demo-codex-1"} {
		if out, err := admin("", "accounts", "usage", label); err != nil {
			t.Fatalf("accounts usage %s: %v\n%s", label, err, out)
		}
	}

	out, err := admin("", "status")
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	t.Logf("weir status:\n%s", out)
	if strings.Contains(out, "\x1b[") {
		t.Errorf("colors without a terminal:\n%s", out)
	}
	lines := strings.Split(out, "\n")
	row := func(provider string) []string {
		for _, l := range lines {
			if f := strings.Fields(l); len(f) > 0 && f[0] == provider {
				return f
			}
		}
		t.Fatalf("no %s row:\n%s", provider, out)
		return nil
	}
	// PROVIDER TOTAL SERVING OVERLOADED COOLING PAUSED BROKEN IN-FLIGHT …
	if f := row("anthropic"); strings.Join(f[1:7], " ") != "3 1 0 1 1 0" || f[7] != "0/8" {
		t.Errorf("anthropic row %v, want 3 total, 1 serving, 1 cooling, 1 paused, 0/8 in flight:\n%s", f, out)
	}
	if f := row("codex"); strings.Join(f[1:3], " ") != "2 2" || !strings.Contains(f[8], "%/") {
		t.Errorf("codex row %v:\n%s", f, out)
	}
	for _, want := range []string{
		"quota response mode ",
		"What is wrong:",
		"cooling     demo-api-key: rate_limited",
		"(until in ",
		"paused      demo-max-1: paused by an operator",
		// Both subscriptions paused, the API key served one: a spill.
		"Spills to metered accounts in the last 24h: 1 requests",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}

	out, err = admin("", "status", "--json")
	if err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	var st poolstatus.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	if st.Accounts != len(demoAccounts) || st.QuotaResponseMode == "" || len(st.Providers) != 3 {
		t.Errorf("status --json: %+v", st)
	}
	kinds := map[string]string{}
	for _, p := range st.Problems {
		kinds[p.Account] = p.Kind
		if p.Kind == "cooling" && (p.Until == nil || !p.Until.After(time.Now().Add(5*time.Minute))) {
			t.Errorf("cooling until %v, want the rate limit's 10 minutes", p.Until)
		}
	}
	if kinds["demo-api-key"] != "cooling" || kinds["demo-max-1"] != "paused" {
		t.Errorf("problems %+v", st.Problems)
	}
	if len(st.Spills) != 1 || st.Spills[0].Account != "demo-api-key" || st.Spills[0].Surface != "messages" || st.Spills[0].Requests != 1 {
		t.Errorf("spills %+v, want the one request on demo-api-key", st.Spills)
	}
	for _, p := range st.Providers {
		if p.Provider == "anthropic" && (p.Cooling != 1 || p.Paused != 1 || p.FiveHour == nil || p.FiveHour.SoonestReset.IsZero()) {
			t.Errorf("anthropic: %+v", p)
		}
	}
}

func TestStatusColors(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	st := poolstatus.Status{At: now, Problems: []poolstatus.Problem{{Kind: "broken", Account: "a", Detail: "refresh token rejected"}}}
	var b strings.Builder
	if err := printStatus(&b, st, true); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), ansiRed+"broken") {
		t.Errorf("no red for a broken account:\n%q", b.String())
	}
	// A file is not a terminal.
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if isTTY(f) || isTTY(&b) {
		t.Error("isTTY: a file or buffer is not a terminal")
	}
}
