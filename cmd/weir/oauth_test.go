package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAccountsAddClaudeCodeCredentials adds an OAuth account from Claude
// Code's credentials file, as the README shows, against a real `weir dev`.
func TestAccountsAddClaudeCodeCredentials(t *testing.T) {
	t.Parallel()
	dataDir := t.TempDir()
	info, stop, done := startDev(t, dataDir)
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("weir dev did not stop cleanly: %v", err)
		}
	}()
	admin := func(args ...string) (string, error) {
		e, out, errOut := testEnv(map[string]string{"WEIR_DATA_DIR": dataDir}, "")
		err := run(t.Context(), args, e)
		return out.String() + errOut.String(), err
	}

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
	out, err := admin("accounts", "add", "--label", "claude-code", "--auth", "oauth", "--secret-file", file, "--base-url", info.SimulatorURL)
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
