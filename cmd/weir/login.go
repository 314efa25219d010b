package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/randid"
)

// `weir login claude|codex`: the OAuth authorization-code flow with PKCE
// that Claude Code and Codex CLI run, ending in a new account instead of a
// credentials file. The redirect goes to the provider's own page (Claude:
// it shows code#state to paste) or to Codex CLI's localhost:1455 callback,
// which weir does not serve: the operator pastes the URL the browser
// landed on. So the flow works the same on a server without a browser.

const loginUsage = `Usage:
  weir login claude|codex [--label L] [--base-url U] [--max-concurrency N]
      [--authorize-url U] [--token-url U]
  Prints the provider's sign-in URL (and opens a browser when it can), reads
  the code you paste, and adds the account it signs in to.
  claude: paste the code the page shows (code#state).
  codex: paste the URL the browser lands on (http://localhost:1455/auth/callback?code=…), or its code.
  --authorize-url and --token-url default to the provider's (env WEIR_OAUTH_AUTHORIZE_URL and
  WEIR_OAUTH_TOKEN_URL for claude, WEIR_CODEX_AUTHORIZE_URL and WEIR_CODEX_TOKEN_URL for codex).
`

// loginProvider is one provider's OAuth client, as its own CLI is.
type loginProvider struct {
	name                         string
	provider                     weirv1.Provider
	authorizeURL, tokenURL       string
	authorizeEnv, tokenEnv       string
	clientID, redirectURI, scope string
	// extra authorize parameters.
	extra url.Values
	// form: the token endpoint takes a form (Codex), else JSON (Claude).
	form bool
}

var loginProviders = map[string]loginProvider{
	"claude": {
		name: "claude", provider: weirv1.Provider_PROVIDER_ANTHROPIC,
		authorizeURL: "https://claude.ai/oauth/authorize", tokenURL: "https://platform.claude.com/v1/oauth/token",
		authorizeEnv: "WEIR_OAUTH_AUTHORIZE_URL", tokenEnv: "WEIR_OAUTH_TOKEN_URL",
		clientID: "9d1c250a-e61b-44d9-88ed-5944d1962f5e", redirectURI: "https://console.anthropic.com/oauth/code/callback",
		scope: "org:create_api_key user:profile user:inference",
		extra: url.Values{"code": {"true"}},
	},
	"codex": {
		name: "codex", provider: weirv1.Provider_PROVIDER_CODEX,
		authorizeURL: "https://auth.openai.com/oauth/authorize", tokenURL: "https://auth.openai.com/oauth/token",
		authorizeEnv: "WEIR_CODEX_AUTHORIZE_URL", tokenEnv: "WEIR_CODEX_TOKEN_URL",
		clientID: "app_EMoamEEZ73f0CkXaXp7hrann", redirectURI: "http://localhost:1455/auth/callback",
		scope: "openid profile email offline_access",
		extra: url.Values{"id_token_add_organizations": {"true"}, "codex_cli_simplified_flow": {"true"}},
		form:  true,
	},
}

func runLogin(ctx context.Context, args []string, e env) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fmt.Fprint(e.stderr, loginUsage)
		return errUsageShown
	}
	lp, ok := loginProviders[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "weir login: unknown provider %q\n\n%s", args[0], loginUsage)
		return errUsageShown
	}
	fs := flag.NewFlagSet("weir login "+lp.name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	var af adminFlags
	af.register(fs, e)
	var label, baseURL string
	var maxConc int
	fs.StringVar(&label, "label", "", "the account's label (default: the login's email, else the provider and a short hash)")
	fs.StringVar(&baseURL, "base-url", "", "the account's upstream base URL override (see weir accounts add)")
	fs.IntVar(&maxConc, "max-concurrency", 0, "concurrent requests on the account (default 4)")
	authorizeURL := fs.String("authorize-url", cmp.Or(e.getenv(lp.authorizeEnv), lp.authorizeURL), "the authorization endpoint (env "+lp.authorizeEnv+")")
	tokenURL := fs.String("token-url", cmp.Or(e.getenv(lp.tokenEnv), lp.tokenURL), "the token endpoint (env "+lp.tokenEnv+")")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("weir login: unexpected argument %q", fs.Arg(0))
	}
	c, err := af.clients()
	if err != nil {
		return err
	}

	verifier, state := randid.URLSafe(32), randid.URLSafe(32)
	u, err := url.Parse(*authorizeURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return errors.New("weir login: --authorize-url must be an http(s) URL")
	}
	q := u.Query()
	for k, v := range lp.extra {
		q[k] = v
	}
	q.Set("client_id", lp.clientID)
	q.Set("response_type", "code")
	q.Set("redirect_uri", lp.redirectURI)
	q.Set("scope", lp.scope)
	q.Set("code_challenge", pkceS256(verifier))
	q.Set("code_challenge_method", "S256")
	q.Set("state", state)
	u.RawQuery = q.Encode()

	fmt.Fprintf(e.stderr, "Sign in with this URL:\n\n  %s\n\n", u)
	openBrowser(e, u.String())
	if lp.form {
		fmt.Fprint(e.stderr, "Your browser then lands on localhost:1455, which shows nothing: paste that page's whole URL (or its code) here: ")
	} else {
		fmt.Fprint(e.stderr, "Paste the code the page shows (code#state) here: ")
	}
	line, err := bufio.NewReader(e.stdin).ReadString('\n')
	if err != nil && (!errors.Is(err, io.EOF) || strings.TrimSpace(line) == "") {
		return errors.New("weir login: no code on standard input")
	}
	fmt.Fprintln(e.stderr)
	code, err := pastedCode(lp, strings.TrimSpace(line), state)
	if err != nil {
		return fmt.Errorf("weir login: %w", err)
	}
	tok, err := exchangeCode(ctx, lp, *tokenURL, code, state, verifier)
	if err != nil {
		return fmt.Errorf("weir login: %w", err)
	}
	secret, defaultLabel := tok.credential(lp, time.Now())
	resp, err := c.accounts.CreateAccount(ctx, connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider: lp.provider, AuthKind: weirv1.AuthKind_AUTH_KIND_OAUTH, Label: cmp.Or(label, defaultLabel),
		Credential: secret, BaseUrl: baseURL, MaxConcurrency: int32(maxConc),
	}))
	if dup := duplicateOf(err); dup != nil {
		// Not a failure: the pool has this login already.
		fmt.Fprintf(e.stdout, "already in the pool as %s\n", dup.Label)
		return nil
	}
	if err != nil {
		return rpcError("add account", err)
	}
	if af.json {
		return printJSON(e.stdout, resp.Msg.Account)
	}
	fmt.Fprintf(e.stdout, "logged in: added %s\n", resp.Msg.Account.Label)
	printAccounts(e.stdout, []*weirv1.Account{resp.Msg.Account}, time.Now())
	return nil
}

// pastedCode takes the authorization code out of what the operator
// pasted, checking that it answers this login's state.
func pastedCode(lp loginProvider, pasted, state string) (string, error) {
	if pasted == "" {
		return "", errors.New("no code pasted")
	}
	var code, got string
	if lp.form {
		code = pasted
		if strings.Contains(pasted, "code=") {
			u, err := url.Parse(pasted)
			if err != nil {
				return "", errors.New("the pasted URL does not parse")
			}
			q := u.Query()
			if e := q.Get("error"); e != "" {
				return "", fmt.Errorf("the provider refused the sign-in: %s", e)
			}
			code, got = q.Get("code"), q.Get("state")
		}
	} else {
		var ok bool
		code, got, ok = strings.Cut(pasted, "#")
		if !ok {
			return "", errors.New("paste the whole code the page shows, code#state")
		}
	}
	if code == "" {
		return "", errors.New("no code in what was pasted")
	}
	// A bare Codex code carries no state to check.
	if (got != "" || !lp.form) && got != state {
		return "", errors.New("the state does not match this login: the code is from another sign-in; run weir login again")
	}
	return code, nil
}

// loginTokens is a token endpoint's answer to a code.
type loginTokens struct {
	AccessToken  string `json:"access_token"`
	RefreshToken string `json:"refresh_token"`
	ExpiresIn    int64  `json:"expires_in"`
	IDToken      string `json:"id_token"`
	Account      *struct {
		UUID         string `json:"uuid"`
		EmailAddress string `json:"email_address"`
	} `json:"account"`
}

// exchangeCode spends the code at the token endpoint. Errors carry the
// endpoint's OAuth error, never a token.
func exchangeCode(ctx context.Context, lp loginProvider, tokenURL, code, state, verifier string) (loginTokens, error) {
	fields := map[string]string{
		"grant_type": "authorization_code", "code": code, "redirect_uri": lp.redirectURI,
		"client_id": lp.clientID, "code_verifier": verifier,
	}
	var body []byte
	contentType := "application/json"
	if lp.form {
		f := url.Values{}
		for k, v := range fields {
			f.Set(k, v)
		}
		body, contentType = []byte(f.Encode()), "application/x-www-form-urlencoded"
	} else {
		fields["state"] = state
		body, _ = json.Marshal(fields)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tokenURL, bytes.NewReader(body))
	if err != nil {
		return loginTokens{}, errors.New("--token-url must be an http(s) URL")
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return loginTokens{}, fmt.Errorf("token endpoint unreachable: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return loginTokens{}, fmt.Errorf("token endpoint: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var oe struct {
			Error       string `json:"error"`
			Description string `json:"error_description"`
		}
		_ = json.Unmarshal(raw, &oe)
		msg := fmt.Sprintf("the token endpoint refused the code (%d", resp.StatusCode)
		if oe.Error != "" && len(oe.Error) < 64 {
			msg += " " + oe.Error
		}
		if oe.Description != "" && len(oe.Description) < 200 {
			msg += ": " + oe.Description
		}
		return loginTokens{}, errors.New(msg + ")")
	}
	var tok loginTokens
	if json.Unmarshal(raw, &tok) != nil || tok.AccessToken == "" {
		return loginTokens{}, errors.New("the token endpoint's answer has no access_token")
	}
	return tok, nil
}

// credential is the account's credential in the form CreateAccount reads
// (the tokens and when the access token expires; Codex's auth.json shape,
// whose id token names the ChatGPT account), and a default label.
func (t loginTokens) credential(lp loginProvider, now time.Time) (string, string) {
	if lp.form {
		b, _ := json.Marshal(map[string]any{"tokens": map[string]string{
			"id_token": t.IDToken, "access_token": t.AccessToken, "refresh_token": t.RefreshToken,
		}})
		return string(b), cmp.Or(jwtEmail(t.IDToken), "codex-"+shortHash(cmp.Or(t.RefreshToken, t.AccessToken)))
	}
	doc := map[string]any{"access_token": t.AccessToken}
	if t.RefreshToken != "" {
		doc["refresh_token"] = t.RefreshToken
	}
	if t.ExpiresIn > 0 {
		doc["expires_at"] = now.Add(time.Duration(t.ExpiresIn) * time.Second).UTC().Format(time.RFC3339)
	}
	b, _ := json.Marshal(doc)
	label := "claude-" + shortHash(cmp.Or(t.RefreshToken, t.AccessToken))
	if t.Account != nil && t.Account.EmailAddress != "" && len(t.Account.EmailAddress) <= 64 {
		label = t.Account.EmailAddress
	}
	return string(b), label
}

func pkceS256(verifier string) string {
	sum := sha256.Sum256([]byte(verifier))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// openBrowser opens url when a person is at a terminal with a display:
// stdout a TTY, and $DISPLAY or $WAYLAND_DISPLAY with xdg-open (or macOS's
// open). Otherwise the printed URL is the way.
func openBrowser(e env, u string) {
	if !isTTY(e.stdout) {
		return
	}
	opener := "open"
	if runtime.GOOS != "darwin" {
		if e.getenv("DISPLAY") == "" && e.getenv("WAYLAND_DISPLAY") == "" {
			return
		}
		opener = "xdg-open"
	}
	path, err := exec.LookPath(opener)
	if err != nil {
		return
	}
	cmd := exec.Command(path, u)
	if cmd.Start() == nil {
		go cmd.Wait() //nolint:errcheck // the browser's fate is not ours
	}
}

// isTTY reports whether w is a terminal.
func isTTY(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
