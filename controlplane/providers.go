package controlplane

import (
	"math"
	"slices"
	"time"

	"github.com/weirhq/weir/controlplane/policy"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/jwtclaims"
)

// Providers as the accounts table spells them (enumName of weirv1.Provider),
// and what each one's accounts may be.

const (
	providerAnthropic = "anthropic"
	providerOpenAI    = "openai"
	providerCodex     = "codex"
)

// Default upstream base URLs, for accounts without an override.
const (
	anthropicBaseURL = "https://api.anthropic.com"
	// openAIBaseURL follows the SDK convention: the base holds the API
	// version; weir appends /responses or /chat/completions.
	openAIBaseURL = "https://api.openai.com/v1"
	// codexBaseURL: weir appends /codex/responses, and reads usage at
	// /wham/usage.
	codexBaseURL = "https://chatgpt.com/backend-api"
)

// defaultBaseURL is the base URL of a provider's accounts that name none;
// "" for an unknown provider.
func defaultBaseURL(provider string) string {
	switch provider {
	case providerAnthropic:
		return anthropicBaseURL
	case providerOpenAI:
		return openAIBaseURL
	case providerCodex:
		return codexBaseURL
	}
	return ""
}

// accountBaseURL is where an account's requests go: its override, else its
// provider's default.
func accountBaseURL(provider, override string) string {
	if override != "" {
		return override
	}
	return defaultBaseURL(provider)
}

// validProviderAuth admits the provider and auth kind pairs weir can
// serve (policy.AuthKinds). The error names the field that is wrong and
// every allowed pair.
func validProviderAuth(p weirv1.Provider, k weirv1.AuthKind) error {
	const allowed = "anthropic with api_key or oauth, openai with api_key, or codex with oauth"
	kinds := policy.AuthKinds(p)
	if kinds == nil {
		return invalidf("provider: must be anthropic, openai or codex (accounts are %s)", allowed)
	}
	if !slices.Contains(kinds, k) {
		return invalidf("auth_kind: not valid for a %s account (accounts are %s)", enumName(p), allowed)
	}
	return nil
}

// errNoCodexAccountID: a Codex account cannot send a request without it.
var errNoCodexAccountID = invalidf("upstream_account_id: codex accounts need the ChatGPT account id: pass --upstream-account-id or the auth.json that holds it")

// validUpstreamAccountID admits what can travel in the chatgpt-account-id
// header: 1 to 256 printable ASCII characters, no spaces.
func validUpstreamAccountID(id string) error {
	bad := id == "" || len(id) > 256
	for i := 0; i < len(id) && !bad; i++ {
		bad = id[i] < 0x21 || id[i] > 0x7e
	}
	if bad {
		return invalidf("upstream_account_id: 1 to 256 printable ASCII characters, no spaces")
	}
	return nil
}

// jwtClaims is what weir reads of an OpenAI access or id token. The token
// is not verified: weir only learns when it expires and which ChatGPT
// account it names; the provider verifies it.
type jwtClaims struct {
	expiresAt *time.Time
	accountID string
}

// parseJWTClaims decodes a JWT's payload; ok is false when tok is not a
// JWT with a JSON payload.
func parseJWTClaims(tok string) (jwtClaims, bool) {
	var doc struct {
		Exp  *float64 `json:"exp"`
		Auth *struct {
			ChatGPTAccountID string `json:"chatgpt_account_id"`
		} `json:"https://api.openai.com/auth"`
	}
	if !jwtclaims.Decode(tok, &doc) {
		return jwtClaims{}, false
	}
	var c jwtClaims
	if doc.Exp != nil && *doc.Exp > 0 && *doc.Exp < math.MaxInt32*4 {
		t := time.Unix(int64(*doc.Exp), 0).UTC()
		c.expiresAt = &t
	}
	if doc.Auth != nil && validUpstreamAccountID(doc.Auth.ChatGPTAccountID) == nil {
		c.accountID = doc.Auth.ChatGPTAccountID
	}
	return c, true
}
