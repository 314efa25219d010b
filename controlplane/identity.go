package controlplane

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"

	"github.com/weirhq/weir/controlplane/db"
	"github.com/weirhq/weir/controlplane/seal"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/egress"
)

// Upstream identities.
//
// An account's identity names the upstream account its credential belongs
// to, without being a secret: the ChatGPT account id of a Codex login, the
// account uuid Anthropic's profile endpoint gives for a Claude login (else
// a hash of its token), a hash of an API key. The same upstream account
// added twice would be counted twice by every capacity decision, so
// CreateAccount refuses a second account with an identity already in the
// pool (a unique index on provider and identity).
//
// Accounts created before identities have none (''). The migration names
// Codex accounts by their upstream_account_id; the others' credentials are
// sealed, so the control plane names them itself, from their stored
// credential, the first time a new account of their provider must be
// compared with them (nameUnnamed). A Claude login's identity is the
// profile uuid only when the profile endpoint answers at create time; a
// login first added while it did not (a hash) and added again while it does
// (a uuid) is still found by the hash of the same token.

const (
	profilePath = "/api/oauth/profile"
	// profileTimeout bounds the profile read at create time: an
	// unreachable endpoint costs the operator this much, then the token's
	// hash names the account.
	profileTimeout = 5 * time.Second
	// maxProfileBody bounds the profile's answer.
	maxProfileBody = 64 << 10
	// identityIndex is the unique index of 0011.
	identityIndex = "accounts_provider_identity"
)

// hashIdentity names a secret by the first 16 hex digits of its SHA-256:
// enough to tell accounts apart, too little to confirm a guess of a
// low-entropy secret cheaply.
func hashIdentity(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// tokenIdentity is an OAuth credential's hash identity: its refresh token's,
// which outlives access tokens, else its access token's.
func tokenIdentity(in credentialInput) string { return hashIdentity(cmp.Or(in.refresh, in.access)) }

// identities names accounts' upstream identities: from a Claude login's
// profile, from a stored credential, or a hash.
type identities struct {
	q       *db.Queries
	seal    *seal.Sealer
	log     *slog.Logger
	profile *http.Client
	// proxied are the profile reads through an egress proxy.
	proxied *egress.Clients
}

// identityFor is the identity of a new account with credential in, whose
// traffic goes through proxy's answer (a whole proxy URL; "" direct),
// asked only when the profile is read.
func (ids identities) identityFor(ctx context.Context, p weirv1.Provider, k weirv1.AuthKind, baseURL, upstreamID string, in credentialInput, proxy func() (string, error)) string {
	switch {
	case p == weirv1.Provider_PROVIDER_CODEX:
		return upstreamID
	case k == weirv1.AuthKind_AUTH_KIND_API_KEY:
		return hashIdentity(in.access)
	}
	if id := ids.profileUUID(ctx, accountBaseURL(providerAnthropic, baseURL), in.access, proxy); id != "" {
		return id
	}
	return tokenIdentity(in)
}

// storedIdentity is the identity of an existing account, from its stored
// credential, without asking the provider.
func (ids identities) storedIdentity(r db.Account) (string, error) {
	if r.Provider == providerCodex {
		return r.UpstreamAccountID, nil
	}
	access, err := ids.seal.Open(r.ID, r.CredentialRevision, r.CredentialSealed)
	if err != nil {
		return "", err
	}
	in := credentialInput{access: access}
	if r.RefreshSealed != nil {
		if in.refresh, err = ids.seal.OpenRefresh(r.ID, r.CredentialRevision, r.RefreshSealed); err != nil {
			return "", err
		}
	}
	if r.AuthKind == enumName(weirv1.AuthKind_AUTH_KIND_API_KEY) {
		return hashIdentity(in.access), nil
	}
	return tokenIdentity(in), nil
}

// profileUUID reads the account uuid of a Claude login from the profile
// endpoint, through proxy's answer ("" direct); "" when it does not
// answer with one, or the proxy cannot be used (never direct instead).
func (ids identities) profileUUID(ctx context.Context, base, access string, proxy func() (string, error)) string {
	ctx, cancel := context.WithTimeout(ctx, profileTimeout)
	defer cancel()
	client, release := ids.profile, func() {}
	via, err := proxy()
	if err == nil && via != "" {
		client, release, err = ids.proxied.Get(via)
	}
	if err != nil {
		ids.log.InfoContext(ctx, "oauth profile not read; naming the account by its token's hash", "err", err)
		return ""
	}
	defer release()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+profilePath, nil)
	if err != nil {
		return ""
	}
	req.Header.Set("Authorization", "Bearer "+access)
	req.Header.Set("anthropic-beta", "oauth-2025-04-20")
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		var pe *egress.Error
		if errors.As(err, &pe) {
			ids.log.InfoContext(ctx, "oauth profile unreachable; naming the account by its token's hash", "err", pe.Error())
		} else {
			ids.log.InfoContext(ctx, "oauth profile unreachable; naming the account by its token's hash")
		}
		return ""
	}
	defer resp.Body.Close()
	var body struct {
		Account struct {
			UUID string `json:"uuid"`
		} `json:"account"`
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxProfileBody))
	if err != nil || resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &body) != nil || validUpstreamAccountID(body.Account.UUID) != nil {
		ids.log.InfoContext(ctx, "oauth profile gave no account uuid; naming the account by its token's hash", "status", resp.StatusCode)
		return ""
	}
	return body.Account.UUID
}

// errDuplicate: the identity is already in the pool, under label.
type errDuplicate struct {
	existing db.Account
}

func (e errDuplicate) Error() string {
	return fmt.Sprintf("this upstream account is already in the pool as %q", e.existing.Label)
}

// connectErr is AlreadyExists naming the account that has the identity,
// with the DuplicateAccount detail for programs.
func (e errDuplicate) connectErr() *connect.Error {
	ce := connect.NewError(connect.CodeAlreadyExists, e)
	if d, err := connect.NewErrorDetail(&weirv1.DuplicateAccount{
		Id: e.existing.ID.String(), Label: e.existing.Label, Identity: e.existing.Identity,
	}); err == nil {
		ce.AddDetail(d)
	}
	return ce
}

// findDuplicate returns errDuplicate when one of identities (the first is
// the account's own; others are names the same credential may have had
// before, e.g. a token's hash) is in the pool for provider under another
// account than self.
func findDuplicate(ctx context.Context, q *db.Queries, provider string, self db.Account, identities ...string) error {
	for _, id := range identities {
		if id == "" {
			continue
		}
		other, err := q.GetAccountByIdentity(ctx, db.GetAccountByIdentityParams{Provider: provider, Identity: id})
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return err
		case other.ID != self.ID:
			return errDuplicate{existing: other}
		}
	}
	return nil
}

// nameUnnamed gives provider's accounts without an identity the one their
// stored credential has, so a new account can be compared with them. An
// account whose identity another already has stays unnamed (both are in
// the pool already; the log names them).
func (ids identities) nameUnnamed(ctx context.Context, provider string) error {
	rows, err := ids.q.AccountsWithoutIdentity(ctx, provider)
	if err != nil {
		return fmt.Errorf("accounts without identity: %w", err)
	}
	for _, r := range rows {
		id, err := ids.storedIdentity(r)
		if err != nil || id == "" {
			continue // unreadable credentials are the integrity check's
		}
		if dup := findDuplicate(ctx, ids.q, provider, r, id); dup != nil {
			var d errDuplicate
			if errors.As(dup, &d) {
				ids.log.WarnContext(ctx, "two accounts share an upstream identity", "account_id", r.ID, "label", r.Label, "other_label", d.existing.Label)
				continue
			}
			return dup
		}
		if _, err := ids.q.SetAccountIdentity(ctx, db.SetAccountIdentityParams{ID: r.ID, Identity: id}); err != nil && !isIdentityConflict(err) {
			return fmt.Errorf("set identity: %w", err)
		}
	}
	return nil
}

func isIdentityConflict(err error) bool {
	var c errConflict
	return errors.As(storeErr(err), &c) && c.constraint == identityIndex
}
