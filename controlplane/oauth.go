package controlplane

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/seal"
	"github.com/weirhq/weir/controlplane/upstream"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/backoff"
)

// OAuth credentials and their refresh.
//
// An OAuth account's credential is an access token, and may come with a
// refresh token and the access token's expiry. credential_sealed holds the
// access token (leases read it as before); refresh_sealed holds the refresh
// token, sealed under its own associated data (package seal). Refresh tokens
// rotate on use, so two refreshes of one account racing lose the account:
// a refresh is claimed first with a compare-and-set on the credential
// revision (ClaimTokenRefresh: one replica wins, for refreshClaim), and the
// refreshed tokens land in one compare-and-set on the same revision
// (StoreRefreshedTokens: revision + 1, which starts a new usage poll epoch
// through the 0004 trigger).

const (
	// refreshAhead: an access token expiring within it is refreshed.
	refreshAhead = 10 * time.Minute
	// refreshClaim is how long a replica holds an account's refresh. It
	// outlasts the token client's timeout, so a claim never lapses while
	// its call may still rotate the tokens.
	refreshClaim = 60 * time.Second
	// refreshesPerRun and refreshParallelism bound one run of RefreshDue.
	refreshesPerRun    = 50
	refreshParallelism = 4
	// defaultAccessLifetime stands in for a token answer without
	// expires_in: short enough that the token is refreshed again in time.
	defaultAccessLifetime = time.Hour
	maxCredentialJSON     = 64 << 10
)

// credentialInput is a credential as an operator enters it: for an OAuth
// account, the access token and, when it can be refreshed, the refresh
// token and the access token's expiry.
type credentialInput struct {
	access    string
	refresh   string     // "" when the credential cannot be refreshed
	expiresAt *time.Time // nil when unknown
	// accountID is the ChatGPT account id a Codex credential names; "" when
	// it names none (or is not a Codex credential).
	accountID string
}

// parseCredential reads a credential for an account of provider and kind.
// An API key is the key itself. An OAuth credential is a bare access token,
// or a JSON document: {"access_token","refresh_token","expires_at"}
// (expires_at an RFC 3339 time or Unix seconds), Claude Code's credentials
// file {"claudeAiOauth":{"accessToken","refreshToken","expiresAt" (Unix
// ms)}}, or, for a Codex account, Codex's auth.json
// {"tokens":{"id_token","access_token","refresh_token","account_id"}}.
// A Codex access token is a JWT: its exp claim is the expiry when nothing
// else says, and the ChatGPT account id comes from tokens.account_id, else
// from the id or access token's claims. Errors name the field and never
// quote the input.
func parseCredential(provider weirv1.Provider, kind weirv1.AuthKind, raw string) (credentialInput, error) {
	in, idToken, err := parseCredentialText(provider, kind, raw)
	if err != nil || provider != weirv1.Provider_PROVIDER_CODEX {
		return in, err
	}
	access, _ := parseJWTClaims(in.access)
	if in.expiresAt == nil {
		in.expiresAt = access.expiresAt
	}
	if in.accountID == "" {
		id, _ := parseJWTClaims(idToken)
		in.accountID = cmp.Or(id.accountID, access.accountID)
	}
	return in, nil
}

// parseCredentialText is parseCredential before a Codex credential's JWT
// claims are read; it returns the id token of Codex's auth.json too.
func parseCredentialText(provider weirv1.Provider, kind weirv1.AuthKind, raw string) (credentialInput, string, error) {
	trimmed := strings.TrimSpace(raw)
	if !strings.HasPrefix(trimmed, "{") {
		if err := validCredential(raw); err != nil {
			return credentialInput{}, "", err
		}
		return credentialInput{access: raw}, "", nil
	}
	return parseCredentialJSON(provider, kind, trimmed)
}

func parseCredentialJSON(p weirv1.Provider, kind weirv1.AuthKind, trimmed string) (credentialInput, string, error) {
	if kind != weirv1.AuthKind_AUTH_KIND_OAUTH {
		return credentialInput{}, "", invalidf("credential: a JSON credential (access and refresh token) is for oauth accounts only")
	}
	if len(trimmed) > maxCredentialJSON {
		return credentialInput{}, "", invalidf("credential: a JSON credential is at most %d bytes", maxCredentialJSON)
	}
	type codexTokens struct {
		IDToken      *string `json:"id_token"`
		AccessToken  *string `json:"access_token"`
		RefreshToken *string `json:"refresh_token"`
		AccountID    *string `json:"account_id"`
	}
	type claudeCode struct {
		AccessToken  *string         `json:"accessToken"`
		RefreshToken *string         `json:"refreshToken"`
		ExpiresAt    json.RawMessage `json:"expiresAt"`
	}
	var doc struct {
		AccessToken   *string         `json:"access_token"`
		RefreshToken  *string         `json:"refresh_token"`
		ExpiresAt     json.RawMessage `json:"expires_at"`
		ClaudeAiOauth *claudeCode     `json:"claudeAiOauth"`
		Tokens        *codexTokens    `json:"tokens"`
	}
	if err := json.Unmarshal([]byte(trimmed), &doc); err != nil {
		var syn *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syn):
			return credentialInput{}, "", invalidf("credential: not valid JSON (at byte %d)", syn.Offset)
		case errors.As(err, &typ) && typ.Field != "":
			return credentialInput{}, "", invalidf("credential: %s: must be a %s", typ.Field, jsonKind(typ.Type.String()))
		default:
			return credentialInput{}, "", invalidf("credential: must be a JSON object")
		}
	}
	codex := p == weirv1.Provider_PROVIDER_CODEX
	accessName, refreshName, expiresName := "access_token", "refresh_token", "expires_at"
	access, refresh, expires, millis := doc.AccessToken, doc.RefreshToken, doc.ExpiresAt, false
	var in credentialInput
	var idToken string
	switch {
	case doc.Tokens != nil:
		if !codex {
			return credentialInput{}, "", invalidf("credential: Codex's auth.json is for codex accounts only")
		}
		c := doc.Tokens
		accessName, refreshName = "tokens.access_token", "tokens.refresh_token"
		access, refresh, expires = c.AccessToken, c.RefreshToken, nil
		if c.IDToken != nil {
			idToken = *c.IDToken
		}
		if c.AccountID != nil && *c.AccountID != "" {
			if validUpstreamAccountID(*c.AccountID) != nil {
				return credentialInput{}, "", invalidf("credential: tokens.account_id: 1 to 256 printable ASCII characters")
			}
			in.accountID = *c.AccountID
		}
	case doc.ClaudeAiOauth != nil:
		c := doc.ClaudeAiOauth
		accessName, refreshName, expiresName = "claudeAiOauth.accessToken", "claudeAiOauth.refreshToken", "claudeAiOauth.expiresAt"
		access, refresh, expires, millis = c.AccessToken, c.RefreshToken, c.ExpiresAt, true
	case access == nil && refresh == nil:
		return credentialInput{}, "", invalidf("credential: JSON must hold access_token, refresh_token and expires_at, or Claude Code's claudeAiOauth, or Codex's auth.json")
	}
	if access == nil || *access == "" {
		return credentialInput{}, "", invalidf("credential: %s: required", accessName)
	}
	if !upstream.TokenShaped(*access) {
		return credentialInput{}, "", invalidf("credential: %s: 8 to 8192 printable ASCII characters", accessName)
	}
	in.access = *access
	if refresh != nil && *refresh != "" {
		if !upstream.TokenShaped(*refresh) {
			return credentialInput{}, "", invalidf("credential: %s: 8 to 8192 printable ASCII characters", refreshName)
		}
		in.refresh = *refresh
	}
	if len(expires) > 0 && string(expires) != "null" {
		t, ok := parseExpiry(expires, millis)
		if !ok {
			unit := "an RFC 3339 time or Unix seconds"
			if millis {
				unit = "Unix milliseconds"
			}
			return credentialInput{}, "", invalidf("credential: %s: must be %s", expiresName, unit)
		}
		in.expiresAt = &t
	}
	// A Codex access token says when it expires itself (parseCredential).
	if in.refresh != "" && in.expiresAt == nil && !codex {
		return credentialInput{}, "", invalidf("credential: %s: required with %s (when the access token expires)", expiresName, refreshName)
	}
	return in, idToken, nil
}

func jsonKind(goType string) string {
	switch goType {
	case "string", "*string":
		return "string"
	case "controlplane.claudeCode", "*controlplane.claudeCode", "controlplane.codexTokens", "*controlplane.codexTokens":
		return "JSON object"
	}
	return goType
}

// parseExpiry reads an expiry: a JSON number (Unix milliseconds when
// millis, else seconds, or milliseconds when it is too large for seconds)
// or an RFC 3339 string.
func parseExpiry(raw json.RawMessage, millis bool) (time.Time, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		t, err := time.Parse(time.RFC3339, s)
		return t.UTC(), err == nil
	}
	n, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || n <= 0 {
		return time.Time{}, false
	}
	if millis || n > 1e11 {
		return time.UnixMilli(int64(n)).UTC(), true
	}
	return time.Unix(int64(n), 0).UTC(), true
}

// setOAuthTokens writes the refresh half of in, for the credential just
// written at revision rev, in the caller's transaction.
func setOAuthTokens(ctx context.Context, q *db.Queries, sl *seal.Sealer, id uuid.UUID, rev int64, in credentialInput) (db.Account, error) {
	var sealed []byte
	if in.refresh != "" {
		sealed = sl.SealRefresh(id, rev, in.refresh)
	}
	return q.SetOAuthTokens(ctx, db.SetOAuthTokensParams{
		RefreshSealed: sealed, AccessExpiresAt: in.expiresAt, ID: id, CredentialRevision: rev,
	})
}

// RefreshDue refreshes the OAuth credentials expiring within refreshAhead
// (or expired) that can be refreshed, a few at a time, and says how many it
// refreshed. It is jobs.TokenRefresher. Every replica may run it at once:
// each account's refresh is claimed, so one call reaches the token
// endpoint.
func (j *AccountJobs) RefreshDue(ctx context.Context) (int, error) {
	now := j.now()
	due, err := j.q.DueTokenRefreshes(ctx, db.DueTokenRefreshesParams{
		Before: now.Add(refreshAhead), Now: now, MaxAccounts: refreshesPerRun,
	})
	if err != nil {
		return 0, fmt.Errorf("due token refreshes: %w", err)
	}
	return forEachBounded(due, refreshParallelism, func(d db.DueTokenRefreshesRow) (bool, error) {
		ok, err := j.refreshToken(ctx, d.ID, d.CredentialRevision)
		if err != nil {
			return ok, fmt.Errorf("refresh token of %s: %w", d.ID, err)
		}
		return ok, nil
	})
}

// refreshToken refreshes one account's credential at revision rev, if it
// wins the claim. The error is for the database and our own shutdown; the
// token endpoint's failures are recorded on the account (backoff, or
// broken when it rejects the refresh token).
func (j *AccountJobs) refreshToken(ctx context.Context, id uuid.UUID, rev int64) (bool, error) {
	now := j.now()
	acct, err := j.q.ClaimTokenRefresh(ctx, db.ClaimTokenRefreshParams{
		Until: now.Add(refreshClaim), ID: id, CredentialRevision: rev, Now: now,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		// Another replica holds it, or the credential changed.
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("claim: %w", err)
	}
	var tok upstream.Tokens
	refresh, err := j.seal.OpenRefresh(acct.ID, acct.CredentialRevision, acct.RefreshSealed)
	if err == nil {
		// Within the claim, whatever the client's own timeout: a call still
		// running when the claim lapses could race another replica's.
		cctx, cancel := context.WithTimeout(ctx, refreshClaim/2)
		tok, err = j.callTokenEndpoint(cctx, acct, refresh)
		cancel()
	}
	now = j.now()
	var rejected upstream.RefreshRejected
	switch {
	case err == nil:
	case errors.Is(err, context.Canceled):
		// Our shutdown: the claim goes back; the next run tries again.
		if rerr := j.q.ReleaseTokenRefresh(context.WithoutCancel(ctx), db.ReleaseTokenRefreshParams{ID: id, CredentialRevision: rev}); rerr != nil {
			j.log.ErrorContext(ctx, "release token refresh claim", "account_id", id, "err", rerr)
		}
		return false, err
	case errors.As(err, &rejected):
		n, serr := j.q.RecordRefreshRejected(ctx, db.RecordRefreshRejectedParams{
			Now: now, Reason: rejected.Error(), ID: id, CredentialRevision: rev,
		})
		if serr != nil {
			return false, fmt.Errorf("record rejected refresh: %w", serr)
		}
		if n > 0 {
			j.log.WarnContext(ctx, "account broken", "account_id", id, "reason", rejected.Error())
		}
		return false, nil
	default:
		failures, serr := j.q.RecordRefreshFailure(ctx, db.RecordRefreshFailureParams{
			BlockedUntil: now.Add(refreshBackoff(acct.RefreshFailures + 1)), ID: id, CredentialRevision: rev,
		})
		if serr != nil && !errors.Is(serr, pgx.ErrNoRows) {
			return false, fmt.Errorf("record refresh failure: %w", serr)
		}
		j.log.WarnContext(ctx, "token refresh failed", "account_id", id, "failures", failures, "err", scrubbed{scrubbed{err, refresh}, tok.AccessToken})
		return false, nil
	}

	newRefresh := tok.RefreshToken
	if newRefresh == "" {
		newRefresh = refresh // the endpoint did not rotate it
	}
	lifetime := time.Duration(tok.ExpiresIn) * time.Second
	if lifetime <= 0 {
		lifetime = defaultAccessLifetime
	}
	expires := now.Add(lifetime)
	if acct.Provider == providerCodex {
		// A Codex access token is a JWT that says when it expires; the
		// answer usually has no expires_in.
		if c, _ := parseJWTClaims(tok.AccessToken); c.expiresAt != nil {
			expires = *c.expiresAt
		}
	}
	next := rev + 1
	var row db.Account
	err = j.tx(ctx, func(q *db.Queries) error {
		var err error
		row, err = q.StoreRefreshedTokens(ctx, db.StoreRefreshedTokensParams{
			CredentialSealed:   j.seal.Seal(id, next, tok.AccessToken),
			RefreshSealed:      j.seal.SealRefresh(id, next, newRefresh),
			CredentialHint:     seal.Hint(tok.AccessToken),
			AccessExpiresAt:    &expires,
			Now:                now,
			ID:                 id,
			CredentialRevision: rev,
		})
		if err != nil {
			return err
		}
		// The expired token's rejections say nothing of the new one.
		_, err = q.ClearCredentialCooldown(ctx, id)
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		// An operator replaced the credential while the call ran: theirs wins.
		j.log.WarnContext(ctx, "refreshed token dropped: the credential was replaced meanwhile", "account_id", id, "revision", rev)
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("store refreshed token: %w", err)
	}
	j.log.InfoContext(ctx, "oauth token refreshed", "account_id", id, "revision", row.CredentialRevision, "expires_at", expires)
	if acct.BrokenAt != nil {
		j.log.InfoContext(ctx, "account mended by a token refresh", "account_id", id, "was", stringOr(acct.BrokenReason))
	}
	return true, nil
}

// refreshBackoff is the wait after the nth consecutive transient failure:
// 30 s (the next run retries), doubling to 10 minutes.
func refreshBackoff(failures int32) time.Duration {
	return backoff.Capped(30*time.Second, 10*time.Minute, int(failures)-1)
}

// tokenURL is where acct's credential is refreshed.
func (j *AccountJobs) tokenURL(acct db.Account) string {
	if acct.Provider == providerCodex {
		if u, ok := upstream.CodexTokenURLUnder(acct.BaseUrl); acct.BaseUrl != "" && ok {
			return u
		}
		return j.cfg.CodexTokenURL
	}
	if acct.BaseUrl != "" {
		return acct.BaseUrl + upstream.AnthropicTokenPath
	}
	return j.cfg.OAuthTokenURL
}

// callTokenEndpoint spends refresh for new tokens at acct's provider
// (package upstream), through the account's egress proxy. Its errors never
// hold a token:
// upstream.RefreshRejected when the endpoint refused the refresh token,
// anything else is transient.
func (j *AccountJobs) callTokenEndpoint(ctx context.Context, acct db.Account, refresh string) (upstream.Tokens, error) {
	client, release, err := j.clientFor(ctx, j.egress.oauth, j.cfg.OAuthClient, acct)
	if err != nil {
		return upstream.Tokens{}, err
	}
	defer release()
	if acct.Provider == providerCodex {
		return upstream.RefreshCodex(ctx, client, j.tokenURL(acct), j.cfg.CodexClientID, refresh)
	}
	return upstream.RefreshAnthropic(ctx, client, j.tokenURL(acct), j.cfg.OAuthClientID, refresh)
}

func stringOr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
