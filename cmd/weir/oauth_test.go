package main

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAccountsAddClaudeCodeCredentials adds an OAuth account from Claude
// Code's credentials file, as docs/operate.md shows, against a real `weir dev`.
func TestAccountsAddClaudeCodeCredentials(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	admin := dev.admin

	const (
		access  = "sk-ant-oat01-claude-code-access-0000000000000000wxyz"
		refresh = "sk-ant-ort01-claude-code-refresh-000000000000000000"
	)
	creds, err := json.MarshalIndent(map[string]any{"claudeAiOauth": map[string]any{
		"accessToken": access, "refreshToken": refresh,
		"expiresAt": time.Now().Add(8 * time.Hour).UnixMilli(),
		"scopes":    []string{"user:inference", "user:profile"}, "subscriptionType": "max",
	}}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), ".credentials.json")
	if err := os.WriteFile(file, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := admin("accounts", "add", "--label", "claude-code", "--auth", "oauth", "--secret-file", file, "--base-url", dev.SimulatorURL)
	if err != nil {
		t.Fatalf("accounts add --secret-file: %v: %s", err, out)
	}
	if strings.Contains(out, access) || strings.Contains(out, refresh) {
		t.Fatal("accounts add echoed a token")
	}
	if !strings.Contains(out, "oauth") || !strings.Contains(out, "sk-ant-oat01-…wxyz") {
		t.Errorf("accounts add: want an OAuth account with the access token's hint:\n%s", out)
	}

	// Without --auth the JSON says OAuth; a broken file names the field.
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"claudeAiOauth":{"refreshToken":"`+refresh+`","expiresAt":1}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = admin("accounts", "add", "--label", "broken-file", "--secret-file", bad)
	if err == nil || !strings.Contains(err.Error(), "claudeAiOauth.accessToken: required") {
		t.Fatalf("accounts add with a file missing the access token: %v: %s", err, out)
	}
	if strings.Contains(err.Error(), refresh) {
		t.Fatal("the error quotes the refresh token")
	}

	out, err = admin("accounts", "get", "claude-code", "--json")
	if err != nil {
		t.Fatalf("accounts get: %v: %s", err, out)
	}
	var got struct {
		AuthKind, State    string
		CredentialRevision string
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("accounts get --json: %v: %s", err, out)
	}
	if got.AuthKind != "AUTH_KIND_OAUTH" || got.State != "ACCOUNT_STATE_ACTIVE" || strings.Contains(out, refresh) {
		t.Errorf("accounts get: %+v\n%s", got, out)
	}
}

// TestAccountsAddProviders adds a Codex account from Codex CLI's auth.json
// and an OpenAI API key, against a real `weir dev`; list and get show the
// provider, and a Codex account without a ChatGPT account id is refused.
func TestAccountsAddProviders(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	admin := dev.adminIn
	jwt := func(claims map[string]any) string {
		b, _ := json.Marshal(claims)
		enc := base64.RawURLEncoding
		return enc.EncodeToString([]byte(`{"alg":"RS256"}`)) + "." + enc.EncodeToString(b) + ".c2lnbmF0dXJlLW5vdC1jaGVja2Vk"
	}
	access := jwt(map[string]any{"exp": time.Now().Add(8 * time.Hour).Unix()})
	const refresh = "rt_codex-refresh-token-0000000000000000"
	authJSON := func(accountID string) string {
		tokens := map[string]any{"id_token": jwt(map[string]any{"email": "x@example.com"}), "access_token": access, "refresh_token": refresh}
		if accountID != "" {
			tokens["account_id"] = accountID
		}
		b, _ := json.MarshalIndent(map[string]any{"OPENAI_API_KEY": nil, "tokens": tokens, "last_refresh": time.Now().Format(time.RFC3339)}, "", "  ")
		file := filepath.Join(t.TempDir(), "auth.json")
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return file
	}

	out, err := admin("", "accounts", "add", "--label", "codex", "--provider", "codex", "--secret-file", authJSON("chatgpt-acct-7"),
		"--base-url", dev.SimulatorURL+"/backend-api")
	if err != nil {
		t.Fatalf("accounts add --provider codex: %v: %s", err, out)
	}
	if strings.Contains(out, access) || strings.Contains(out, refresh) {
		t.Fatal("accounts add echoed a token")
	}
	out, err = admin("", "accounts", "add", "--label", "codex-anon", "--provider", "codex", "--secret-file", authJSON(""))
	if err == nil || !strings.Contains(err.Error(), "--upstream-account-id") {
		t.Fatalf("a codex account without an account id: %v: %s", err, out)
	}
	out, err = admin("", "accounts", "add", "--label", "codex-named", "--provider", "codex", "--secret-file", authJSON(""),
		"--upstream-account-id", "given-on-the-command-line")
	if err != nil {
		t.Fatalf("accounts add --upstream-account-id: %v: %s", err, out)
	}
	out, err = admin("sk-proj-openai-key-0000000000000000\n", "accounts", "add", "--label", "openai", "--provider", "openai", "--secret-stdin")
	if err != nil {
		t.Fatalf("accounts add --provider openai: %v: %s", err, out)
	}
	if _, err := admin("", "accounts", "add", "--label", "x", "--provider", "gemini", "--secret-file", authJSON("a")); err == nil || !strings.Contains(err.Error(), "anthropic, openai or codex") {
		t.Fatalf("an unknown provider: %v", err)
	}

	for label, want := range map[string][3]string{
		"codex":       {"PROVIDER_CODEX", "AUTH_KIND_OAUTH", "chatgpt-acct-7"},
		"codex-named": {"PROVIDER_CODEX", "AUTH_KIND_OAUTH", "given-on-the-command-line"},
		"openai":      {"PROVIDER_OPENAI", "AUTH_KIND_API_KEY", ""},
	} {
		out, err := admin("", "accounts", "get", label, "--json")
		if err != nil {
			t.Fatalf("accounts get %s: %v: %s", label, err, out)
		}
		var got struct{ Provider, AuthKind, UpstreamAccountId string }
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("accounts get --json: %v: %s", err, out)
		}
		if got.Provider != want[0] || got.AuthKind != want[1] || got.UpstreamAccountId != want[2] {
			t.Errorf("accounts get %s: %+v, want %v", label, got, want)
		}
	}
	out, err = admin("", "accounts", "set", "codex", "--upstream-account-id", "moved")
	if err != nil {
		t.Fatalf("accounts set --upstream-account-id: %v: %s", err, out)
	}
	out, err = admin("", "accounts", "list")
	if err != nil {
		t.Fatalf("accounts list: %v: %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if strings.Fields(lines[0])[1] != "PROVIDER" {
		t.Fatalf("accounts list:\n%s", out)
	}
	want := map[string]string{"codex": "codex", "codex-named": "codex", "openai": "openai", "demo-api-key": "anthropic"}
	seen := 0
	for _, line := range lines[1:] {
		f := strings.Fields(line)
		if w, ok := want[f[0]]; ok {
			seen++
			if f[1] != w {
				t.Errorf("accounts list: %s shows provider %q, want %q", f[0], f[1], w)
			}
		}
	}
	if seen != len(want) {
		t.Errorf("accounts list shows %d of %d accounts:\n%s", seen, len(want), out)
	}
}
