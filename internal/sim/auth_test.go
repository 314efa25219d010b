package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"testing"
)

func TestAuth(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	noBeta := oauthHeaders(tokO)
	noBeta.Del("anthropic-beta")
	oauthAsKey := apiKeyHeaders(tokO)
	keyAsBearer := oauthHeaders(keyA)
	malformed := apiKeyHeaders("sk ant with spaces")
	tests := []struct {
		name    string
		h       http.Header
		message string
		account string
		outcome string
	}{
		{"no credential", http.Header{"Anthropic-Version": {"2023-06-01"}}, "x-api-key header is required", "", "auth_error"},
		{"oauth without beta", noBeta, "OAuth authentication is currently not supported.", "", "auth_error"},
		{"unknown key", apiKeyHeaders("sk-ant-api03-unknownunknownunknown"), "invalid x-api-key", "", "auth_error"},
		{"unknown bearer", oauthHeaders("sk-ant-oat01-unknownunknownunknown"), "Invalid bearer token", "", "auth_error"},
		{"malformed key", malformed, "invalid x-api-key", "", "auth_error"},
		{"oauth token as x-api-key", oauthAsKey, "invalid x-api-key", "", "auth_error"},
		{"api key as bearer", keyAsBearer, "Invalid bearer token", "", "auth_error"},
		{"revoked key", apiKeyHeaders(keyGone), "invalid x-api-key", "key-gone", "revoked"},
		{"revoked oauth", oauthHeaders(tokGone), "OAuth token has been revoked.", "sub-gone", "revoked"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := messagesBody(sonnet, false)
			resp, data := b.call(t, "POST", "/v1/messages", tt.h, body)
			wantError(t, resp, data, http.StatusUnauthorized, "authentication_error", tt.message)
			a := b.nextAttempt(t)
			want := Attempt{Time: testNow, Account: tt.account, Model: sonnet, Path: "/v1/messages", BodySHA256: bodyHash(body), Outcome: tt.outcome, Status: 401}
			if a != want {
				t.Errorf("attempt %+v, want %+v", a, want)
			}
		})
	}
}

func TestAcceptUnknown(t *testing.T) {
	t.Parallel()
	sc := testScript()
	sc.AcceptUnknown = true
	b := setup(t, Config{Script: sc})

	const cred = "sk-ant-api03-newnewnewnewnewnewnewnew"
	sum := sha256.Sum256([]byte(cred))
	name := "key-" + hex.EncodeToString(sum[:])[:8]
	if resp, data := b.call(t, "POST", "/v1/messages", apiKeyHeaders(cred), messagesBody(sonnet, false)); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	if a := b.nextAttempt(t); a.Account != name {
		t.Errorf("account %q, want %q", a.Account, name)
	}

	// The discovered account can be given faults like a scripted one.
	if err := b.sim.AddFaults(name, Fault{Kind: FaultOverloaded}); err != nil {
		t.Fatal(err)
	}
	if resp, _ := b.call(t, "POST", "/v1/messages", apiKeyHeaders(cred), messagesBody(sonnet, false)); resp.StatusCode != 529 {
		t.Errorf("status %d, want 529", resp.StatusCode)
	}

	// An unknown bearer is an OAuth account and still needs the beta.
	const tok = "sk-ant-oat01-newnewnewnewnewnewnewnew"
	if resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders(tok), messagesBody(sonnet, false)); resp.StatusCode != 200 ||
		resp.Header.Get("anthropic-ratelimit-unified-status") != "allowed" {
		t.Errorf("status %d, unified %q", resp.StatusCode, resp.Header.Get("anthropic-ratelimit-unified-status"))
	}
	noBeta := oauthHeaders(tok)
	noBeta.Del("anthropic-beta")
	if resp, _ := b.call(t, "POST", "/v1/messages", noBeta, messagesBody(sonnet, false)); resp.StatusCode != 401 {
		t.Errorf("without beta: status %d, want 401", resp.StatusCode)
	}
	// Revoked scripted accounts stay revoked.
	if resp, _ := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyGone), messagesBody(sonnet, false)); resp.StatusCode != 401 {
		t.Errorf("revoked: status %d, want 401", resp.StatusCode)
	}
}

func TestBetaHeaderForms(t *testing.T) {
	t.Parallel()
	for _, beta := range [][]string{
		{"oauth-2025-04-20"},
		{"claude-code-20250219,oauth-2025-04-20,interleaved-thinking-2025-05-14"},
		{"claude-code-20250219", "oauth-2025-04-20"},
	} {
		h := http.Header{"Anthropic-Beta": beta}
		if !hasBeta(h, oauthBeta) {
			t.Errorf("hasBeta(%q) = false", beta)
		}
	}
	if hasBeta(http.Header{"Anthropic-Beta": {"oauth-2025-04-200"}}, oauthBeta) {
		t.Error("hasBeta matched a longer value")
	}
}
