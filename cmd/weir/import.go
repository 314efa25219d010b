package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/jwtclaims"
)

// Credential kinds `weir accounts import` recognises.
const (
	kindClaudeCode   = "claude-code"   // ~/.claude/.credentials.json
	kindClaudeToken  = "claude-token"  // `claude setup-token`: sk-ant-oat01-…, no refresh token
	kindCodex        = "codex"         // ~/.codex/auth.json with tokens
	kindOpenAIKey    = "openai-key"    // sk-…, or auth.json's OPENAI_API_KEY
	kindAnthropicKey = "anthropic-key" // sk-ant-api03-…
)

// importCredential is one file's credential, recognised.
type importCredential struct {
	kind     string
	provider weirv1.Provider
	auth     weirv1.AuthKind
	secret   string // what CreateAccount gets: the key, token or JSON document
	label    string // the default label
}

// importResult is one file's outcome, as --json prints it.
type importResult struct {
	File string `json:"file"`
	Kind string `json:"kind,omitempty"`
	// imported, duplicate, would_import (--dry-run) or failed.
	Status        string `json:"status"`
	Label         string `json:"label,omitempty"`
	AccountID     string `json:"account_id,omitempty"`
	Identity      string `json:"identity,omitempty"`
	ExistingLabel string `json:"existing_label,omitempty"`
	Error         string `json:"error,omitempty"`
}

func accountsImport(ctx context.Context, fs *flag.FlagSet, af *adminFlags, args []string, e env) error {
	var prefix string
	var dryRun bool
	fs.StringVar(&prefix, "label-prefix", "", "put this before every default label")
	fs.BoolVar(&dryRun, "dry-run", false, "say what would be imported; change nothing")
	files, err := parsePositional(fs, args)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return errors.New("weir accounts import: name at least one FILE (- for standard input)")
	}
	var c *clients
	if !dryRun {
		if c, err = af.clients(); err != nil {
			return err
		}
	}
	failed := 0
	stdinUsed := false
	for _, f := range files {
		res := importResult{File: f}
		cred, err := readImport(f, e.stdin, &stdinUsed)
		switch {
		case err != nil:
			res.Status, res.Error = "failed", err.Error()
		case dryRun:
			res.Kind, res.Label, res.Status = cred.kind, prefix+cred.label, "would_import"
		default:
			res.Kind, res.Label = cred.kind, prefix+cred.label
			// A Claude login's identity comes from its profile endpoint,
			// which may take a while to answer or not.
			fmt.Fprintf(e.stderr, "importing %s (%s) …\n", f, cred.kind)
			importOne(ctx, c, cred, &res)
		}
		if res.Status == "failed" {
			failed++
		}
		if af.json {
			b, _ := json.Marshal(res)
			fmt.Fprintln(e.stdout, string(b))
			continue
		}
		fmt.Fprintln(e.stdout, importLine(res))
	}
	if failed > 0 {
		return fmt.Errorf("weir accounts import: %d of %d failed", failed, len(files))
	}
	return nil
}

// importOne creates the account; a credential already in the pool is a
// duplicate, not a failure.
func importOne(ctx context.Context, c *clients, cred importCredential, res *importResult) {
	resp, err := c.accounts.CreateAccount(ctx, connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider: cred.provider, AuthKind: cred.auth, Label: res.Label, Credential: cred.secret,
	}))
	if err == nil {
		a := resp.Msg.Account
		res.Status, res.AccountID, res.Identity = "imported", a.Id, a.Identity
		return
	}
	if dup := duplicateOf(err); dup != nil {
		res.Status, res.ExistingLabel, res.Identity = "duplicate", dup.Label, dup.Identity
		return
	}
	res.Status, res.Error = "failed", rpcError("add account", err).Error()
	if connect.CodeOf(err) == connect.CodeAlreadyExists {
		res.Error += " (the label is taken: name others with --label-prefix)"
	}
}

// duplicateOf is the account CreateAccount said already has the
// credential's upstream identity; nil for any other error.
func duplicateOf(err error) *weirv1.DuplicateAccount {
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeAlreadyExists {
		return nil
	}
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if dup, ok := v.(*weirv1.DuplicateAccount); ok {
				return dup
			}
		}
	}
	return nil
}

func importLine(r importResult) string {
	switch r.Status {
	case "imported":
		return fmt.Sprintf("%s: imported as %s (%s)", r.File, r.Label, r.Kind)
	case "would_import":
		return fmt.Sprintf("%s: would import as %s (%s)", r.File, r.Label, r.Kind)
	case "duplicate":
		return fmt.Sprintf("%s: already in the pool as %s", r.File, r.ExistingLabel)
	}
	return fmt.Sprintf("%s: failed: %s", r.File, r.Error)
}

// readImport reads and recognises one file; "-" is standard input, once.
func readImport(name string, stdin io.Reader, stdinUsed *bool) (importCredential, error) {
	var raw []byte
	var err error
	if name == "-" {
		if *stdinUsed {
			return importCredential{}, errors.New("standard input is named twice")
		}
		*stdinUsed = true
		raw, err = io.ReadAll(io.LimitReader(bufio.NewReader(stdin), 64<<10))
	} else {
		raw, err = os.ReadFile(name)
	}
	if err != nil {
		// The path is already the line's; the error never holds content.
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return importCredential{}, fmt.Errorf("read: %w", err)
	}
	return recognise(strings.TrimSpace(string(raw)))
}

// recognise says what a credential file holds. Errors never quote it.
func recognise(text string) (importCredential, error) {
	if text == "" {
		return importCredential{}, errors.New("empty")
	}
	if strings.HasPrefix(text, "{") {
		return recogniseJSON(text)
	}
	if strings.ContainsAny(text, " \t\r\n") {
		return importCredential{}, errors.New("not a credential: want one token or key, or a JSON credentials file")
	}
	switch {
	case strings.HasPrefix(text, "sk-ant-oat"):
		return importCredential{kind: kindClaudeToken, provider: weirv1.Provider_PROVIDER_ANTHROPIC, auth: weirv1.AuthKind_AUTH_KIND_OAUTH,
			secret: text, label: "claude-token-" + shortHash(text)}, nil
	case strings.HasPrefix(text, "sk-ant-"):
		return importCredential{kind: kindAnthropicKey, provider: weirv1.Provider_PROVIDER_ANTHROPIC, auth: weirv1.AuthKind_AUTH_KIND_API_KEY,
			secret: text, label: "anthropic-key-" + shortHash(text)}, nil
	case strings.HasPrefix(text, "sk-"):
		return openAIKey(text), nil
	}
	return importCredential{}, errors.New("not a recognised credential: want a Claude Code or Codex credentials file, a claude setup-token token, or an Anthropic or OpenAI API key")
}

func openAIKey(key string) importCredential {
	return importCredential{kind: kindOpenAIKey, provider: weirv1.Provider_PROVIDER_OPENAI, auth: weirv1.AuthKind_AUTH_KIND_API_KEY,
		secret: key, label: "openai-key-" + shortHash(key)}
}

func recogniseJSON(text string) (importCredential, error) {
	var doc struct {
		ClaudeAiOauth *struct {
			AccessToken  string `json:"accessToken"`
			RefreshToken string `json:"refreshToken"`
		} `json:"claudeAiOauth"`
		Tokens *struct {
			IDToken      string `json:"id_token"`
			AccessToken  string `json:"access_token"`
			RefreshToken string `json:"refresh_token"`
			AccountID    string `json:"account_id"`
		} `json:"tokens"`
		OpenAIAPIKey *string `json:"OPENAI_API_KEY"`
	}
	if err := json.Unmarshal([]byte(text), &doc); err != nil {
		return importCredential{}, errors.New("not valid JSON, or not a credentials file weir knows")
	}
	switch {
	case doc.ClaudeAiOauth != nil:
		c := doc.ClaudeAiOauth
		return importCredential{kind: kindClaudeCode, provider: weirv1.Provider_PROVIDER_ANTHROPIC, auth: weirv1.AuthKind_AUTH_KIND_OAUTH,
			secret: text, label: "claude-" + shortHash(cmp.Or(c.RefreshToken, c.AccessToken))}, nil
	case doc.Tokens != nil && doc.Tokens.AccessToken != "":
		t := doc.Tokens
		label := jwtEmail(t.IDToken)
		if label == "" {
			label = "codex-" + shortHash(cmp.Or(t.AccountID, t.RefreshToken, t.AccessToken))
		}
		return importCredential{kind: kindCodex, provider: weirv1.Provider_PROVIDER_CODEX, auth: weirv1.AuthKind_AUTH_KIND_OAUTH,
			secret: text, label: label}, nil
	case doc.OpenAIAPIKey != nil && *doc.OpenAIAPIKey != "":
		return openAIKey(*doc.OpenAIAPIKey), nil
	}
	return importCredential{}, errors.New("a JSON file without claudeAiOauth, Codex tokens or OPENAI_API_KEY")
}

// shortHash is 8 hex digits of a secret's SHA-256: the start of the hash
// identity the control plane gives API keys and tokens.
func shortHash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:4])
}

// jwtEmail is the email claim of an (unverified) id token; "" when none.
func jwtEmail(tok string) string {
	var claims struct {
		Email   string `json:"email"`
		Profile struct {
			Email string `json:"email"`
		} `json:"https://api.openai.com/profile"`
	}
	if !jwtclaims.Decode(tok, &claims) {
		return ""
	}
	email := cmp.Or(claims.Email, claims.Profile.Email)
	if len(email) > 64 || strings.TrimSpace(email) != email {
		return ""
	}
	return email
}
