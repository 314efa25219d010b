package controlplane

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/weirhq/weir/controlplane/notify"
	"github.com/weirhq/weir/controlplane/people"
	"github.com/weirhq/weir/controlplane/upstream"
	"github.com/weirhq/weir/internal/defaults"
)

// Config configures a control-plane replica. Zero values take the defaults
// noted on each field.
type Config struct {
	// AdminToken authenticates operator RPCs (accounts, keys, routes).
	// Required, at least 16 characters. Env: WEIR_ADMIN_TOKEN.
	AdminToken string
	// OIDCIssuer turns on OpenID Connect sign-in to the dashboard: the
	// provider's issuer URL (its /.well-known/openid-configuration is read
	// on the first sign-in). People then sign in as themselves, with the
	// role WEIR_OIDC_ROLES gives their verified email, and the admin API
	// takes their ID token as a bearer token; the admin token still signs
	// in as admin, for automation and 'weir dev'. Default: off.
	// Env: WEIR_OIDC_ISSUER.
	OIDCIssuer string
	// OIDCName names the provider on the login page's button ("Sign in
	// with …"). Default: the issuer's host. Env: WEIR_OIDC_NAME.
	OIDCName string
	// OIDCClientID is weir's client id at the provider; the ID token's
	// audience must be it. Required with WEIR_OIDC_ISSUER.
	// Env: WEIR_OIDC_CLIENT_ID.
	OIDCClientID string
	// OIDCClientSecret is weir's client secret at the provider; empty for
	// a public client (PKCE is used either way).
	// Env: WEIR_OIDC_CLIENT_SECRET.
	OIDCClientSecret string
	// OIDCRedirectURL is the dashboard's callback as browsers reach it,
	// https://weir.example.com/dashboard/oidc/callback, registered with the
	// provider. Required with WEIR_OIDC_ISSUER. Env: WEIR_OIDC_REDIRECT_URL.
	OIDCRedirectURL string
	// OIDCRoles gives each role (viewer < operator < admin) the emails
	// holding it, a role's list after "role=", roles apart by ";":
	// admin=alice@example.com,ops@example.com;operator=bob@example.com;viewer=*@example.com
	// ("*@domain" is every address of the domain; the highest matching
	// role wins). A verified email, not a provider's group claim: every
	// provider issues one, and the whole access list stays in weir's
	// environment. Read on every request, so removing someone ends their
	// sessions' access. Required with WEIR_OIDC_ISSUER. Env: WEIR_OIDC_ROLES.
	OIDCRoles string
	// oidcRoles is OIDCRoles parsed (Validate).
	oidcRoles people.Mapping
	// OIDCClient makes the discovery, JWKS and token calls. Default: a
	// client with a 10s overall timeout.
	OIDCClient *http.Client
	// TrustedProxies are the proxies (CIDRs, comma-separated in the
	// environment) whose X-Forwarded-Proto and X-Forwarded-For the
	// dashboard believes: behind one saying https, its cookies are Secure
	// and it sends HSTS (as it does over its own TLS), and the failed
	// sign-in limit counts the browser's address, not the proxy's.
	// Default none. Env: WEIR_TRUSTED_PROXIES.
	TrustedProxies []netip.Prefix
	// DataplaneToken authenticates data-plane workers on LeaseService.
	// Required, at least 16 characters, different from AdminToken.
	// Env: WEIR_DATAPLANE_TOKEN.
	DataplaneToken string
	// SecretKey is the 32-byte AES-256-GCM key sealing credentials at rest,
	// hex or base64 in the environment (openssl rand -hex 32); weir dev
	// generates one into its data dir with mode 0600. Required.
	// Env: WEIR_SECRET_KEY.
	SecretKey []byte
	// PreviousSecretKeys are retired keys that still open credentials
	// sealed before a key rotation (comma-separated in the environment,
	// each as WEIR_SECRET_KEY); new seals always use the current key. Keep a key
	// here until 'weir secrets rotate' has re-sealed everything under the
	// current one. Default none. Env: WEIR_SECRET_KEY_PREVIOUS.
	PreviousSecretKeys [][]byte
	// LeaseClientCert makes LeaseService (the data-plane RPCs) refuse a
	// call that did not come over TLS with a client certificate the TLS
	// server verified: mTLS between data planes and the control plane, on
	// top of the data-plane token. Other services take calls without one
	// (operators' commands, the dashboard). The binary sets it, and has
	// the TLS server verify certificates given, when
	// WEIR_CONTROLPLANE_CLIENT_CA names the data planes' CA. Default false.
	LeaseClientCert bool
	// LeaseTTL is how long a lease lives without renewal. Default 30s.
	LeaseTTL time.Duration
	// LeaseReuse is how long after its grant a lease may serve further
	// requests of the same key, surface and model (Lease.reuse_until),
	// each success reported in a batch: the fast path that spares a busy
	// worker an Acquire per request (each lease gets between three
	// quarters of it and all of it, by its id, so leases granted together
	// lapse apart). Probes and retries are never reused. The window bounds
	// how long a worker serves a class from the accounts routing chose
	// for it; every change routing must see at once (a cooldown, a pause,
	// a gate, a usage band crossed) drops the account's leases by
	// notification anyway, and a held request's wait makes workers give
	// that account's idle leases back; what the window alone refreshes is
	// the soft order among eligible accounts (usage within a band, how
	// busy each is). 15 s, not 5 or 2: a busy class renews
	// every lease once a window (a fresh Acquire and claim from three
	// quarters of it, the old lease settled), so at 100 streams of about
	// half a second a second the renewals were most of the Postgres
	// writes: 0.87 write transactions a stream at 2 s, 0.44 at 5 s, 0.24
	// at 15 s; the whole stack's CPU per stream, three alternated runs
	// each, 3.34 against 2.67 ms for weir dev and 3.25 against 2.82 for
	// split (weir bench apart, 100 streams a second).
	// Default 15s; negative here (0 in the environment) turns reuse off.
	// Env: WEIR_LEASE_REUSE.
	LeaseReuse time.Duration
	// SessionTTL is how long an idle session stays bound to its account.
	// Default 1h.
	SessionTTL time.Duration
	// AuthFailureThreshold is how many consecutive credential rejections
	// mark an account broken. Default 3.
	AuthFailureThreshold int
	// CapacityHold is how long a request may wait through a transient
	// capacity storm, until an operator changes the capacity_hold setting.
	// Default 20m; negative means 0 (fail fast). Env: WEIR_CAPACITY_HOLD.
	CapacityHold time.Duration
	// UnreachableHold is how long a request may wait while every account
	// that could serve it is unreachable (its upstream refused, unresolved,
	// failing TLS or timing out), until an operator changes the
	// unreachable_hold setting; capacity_hold caps it. Default 30s;
	// negative means 0 (fail fast). Env: WEIR_UNREACHABLE_HOLD.
	UnreachableHold time.Duration
	// RequestDeadline bounds a request from arrival to first byte, holds
	// included, until the request_deadline setting says otherwise. Default
	// 25m, so a response starts before a 30-minute client timeout.
	// Env: WEIR_REQUEST_DEADLINE.
	RequestDeadline time.Duration
	// BodyBuffer bounds the request-body bytes one data-plane worker
	// buffers at once (read, and kept for replay while a request may be
	// retried or is held), until an operator changes the
	// body_buffer_bytes setting; past it a request gets a 503 with
	// Retry-After before its body is read. Default 1GiB: thirty bodies of
	// the 32 MiB maximum, or a thousand held requests of 1 MiB.
	// Env: WEIR_BODY_BUFFER (1GiB, 512MiB or bytes).
	BodyBuffer int64
	// BodyBufferPerKey is the same bound for one client key's requests on
	// one worker (body_buffer_per_key_bytes); past it the key's request
	// gets a 429. Default 128MiB, an eighth of the total: one key, or a
	// handful, cannot take a worker's whole buffer (the last quarter of it
	// is kept for keys that hold nothing there, dataplane/bodybudget.go),
	// and a developer's agents (a few MB a request, tens at once) stay
	// well under it.
	// Env: WEIR_BODY_BUFFER_PER_KEY.
	BodyBufferPerKey int64
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock for every time written to Postgres. Default time.Now.
	Now func() time.Time
	// UsageClient reads the upstream usage endpoint of OAuth accounts.
	// Default: a client with a 10s overall timeout.
	UsageClient *http.Client
	// OAuthTokenURL is the token endpoint refreshing OAuth credentials.
	// An account with a base URL override refreshes at
	// {base_url}/v1/oauth/token instead. Default
	// https://platform.claude.com/v1/oauth/token. Env: WEIR_OAUTH_TOKEN_URL.
	OAuthTokenURL string
	// OAuthClientID is the client_id sent with a refresh. Default: Claude
	// Code's public client id. Env: WEIR_OAUTH_CLIENT_ID.
	OAuthClientID string
	// CodexTokenURL is the token endpoint refreshing Codex (ChatGPT login)
	// credentials. A Codex account with a base URL override refreshes at
	// the override's scheme and host + /oauth/token instead. Default
	// https://auth.openai.com/oauth/token. Env: WEIR_CODEX_TOKEN_URL.
	CodexTokenURL string
	// CodexClientID is the client_id sent with a Codex refresh. Default:
	// Codex CLI's public client id. Env: WEIR_CODEX_CLIENT_ID.
	CodexClientID string
	// OAuthClient calls the token endpoints. Default: a client with a 15s
	// overall timeout (well inside the 60s refresh claim).
	OAuthClient *http.Client
	// ProfileClient reads a Claude login's profile (its account uuid, the
	// account's identity) when the account is created. Default: a client
	// with a 5s overall timeout.
	ProfileClient *http.Client
	// NotifyClient posts notifications to their targets
	// (docs/notifications.md). Default: a client with a 10s overall
	// timeout that follows no redirect (notify.NewClient).
	NotifyClient *http.Client
	// notifyRetry replaces notify.RetryDelay, the wait after a failed
	// delivery (tests retry in milliseconds).
	notifyRetry func(attempt int) time.Duration
	// Registry receives the control plane's metrics. Default: a new one.
	Registry *prometheus.Registry
	// MetricsToken, when set, is the bearer token /metrics needs (its
	// account series are labelled by account label). The binary reads
	// WEIR_METRICS_TOKEN.
	MetricsToken string
	// MetricsApart leaves /metrics out of Handler: the binary serves
	// MetricsHandler on an address of its own
	// (WEIR_CONTROLPLANE_METRICS_ADDR).
	MetricsApart bool
	// DisableJobs skips River (tests that drive jobs by hand).
	DisableJobs bool
	// MetricsAccountLabelsMax is the largest pool (in accounts) whose
	// accounts each get a utilization series labelled by account label
	// (weir_controlplane_account_usage_utilization_ratio); a larger pool
	// gets the pool-wide min/max/avg only. Default 50; 0 in the
	// environment (negative here) turns the series off.
	// Env: WEIR_METRICS_ACCOUNT_LABELS_MAX.
	MetricsAccountLabelsMax int
	// TracerProvider receives a server span per RPC, joined to the
	// caller's trace (see internal/telemetry). Default: none, no tracing.
	// The binary sets it from the OTEL_* variables.
	TracerProvider trace.TracerProvider
}

// Validate names the first bad field.
func (c *Config) Validate() error {
	switch {
	case len(c.AdminToken) < 16:
		return errors.New("controlplane: AdminToken (WEIR_ADMIN_TOKEN) must be at least 16 characters")
	case len(c.DataplaneToken) < 16:
		return errors.New("controlplane: DataplaneToken (WEIR_DATAPLANE_TOKEN) must be at least 16 characters")
	case c.AdminToken == c.DataplaneToken:
		return errors.New("controlplane: DataplaneToken must differ from AdminToken")
	case len(c.SecretKey) != 32:
		return errors.New("controlplane: SecretKey (WEIR_SECRET_KEY) must be 32 bytes")
	case slices.ContainsFunc(c.PreviousSecretKeys, func(k []byte) bool { return len(k) != 32 }):
		return errors.New("controlplane: PreviousSecretKeys (WEIR_SECRET_KEY_PREVIOUS) must be 32 bytes each")
	case c.LeaseTTL < 0 || (c.LeaseTTL > 0 && c.LeaseTTL < time.Second):
		return fmt.Errorf("controlplane: LeaseTTL %v must be at least 1s", c.LeaseTTL)
	case c.SessionTTL < 0:
		return errors.New("controlplane: SessionTTL must not be negative")
	case c.AuthFailureThreshold < 0:
		return errors.New("controlplane: AuthFailureThreshold must not be negative")
	case c.OAuthTokenURL != "" && validBaseURL(c.OAuthTokenURL) != nil:
		return errors.New("controlplane: OAuthTokenURL (WEIR_OAUTH_TOKEN_URL) must be an http(s) URL")
	case c.CodexTokenURL != "" && validBaseURL(c.CodexTokenURL) != nil:
		return errors.New("controlplane: CodexTokenURL (WEIR_CODEX_TOKEN_URL) must be an http(s) URL")
	case c.RequestDeadline < 0:
		return errors.New("controlplane: RequestDeadline (WEIR_REQUEST_DEADLINE) must not be negative")
	}
	return c.validateOIDC()
}

// validateOIDC checks the OpenID settings when an issuer is set, and
// parses the role mapping.
func (c *Config) validateOIDC() error {
	if c.OIDCIssuer == "" {
		return nil
	}
	switch {
	case validBaseURL(c.OIDCIssuer) != nil:
		return errors.New("controlplane: OIDCIssuer (WEIR_OIDC_ISSUER) must be an http(s) URL")
	case c.OIDCClientID == "":
		return errors.New("controlplane: OIDCClientID (WEIR_OIDC_CLIENT_ID) is required with WEIR_OIDC_ISSUER")
	case c.OIDCRedirectURL == "" || validBaseURL(c.OIDCRedirectURL) != nil:
		return errors.New("controlplane: OIDCRedirectURL (WEIR_OIDC_REDIRECT_URL) must be the dashboard's http(s) callback URL")
	}
	m, err := people.ParseMapping(c.OIDCRoles)
	if err != nil {
		return fmt.Errorf("controlplane: OIDCRoles (WEIR_OIDC_ROLES): %w", err)
	}
	c.oidcRoles = m
	return nil
}

func (c *Config) setDefaults() {
	if c.LeaseTTL == 0 {
		c.LeaseTTL = defaults.LeaseTTL
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = time.Hour
	}
	switch {
	case c.LeaseReuse == 0:
		c.LeaseReuse = 15 * time.Second
	case c.LeaseReuse < 0:
		c.LeaseReuse = 0 // off
	}
	if c.AuthFailureThreshold == 0 {
		c.AuthFailureThreshold = 3
	}
	switch {
	case c.CapacityHold == 0:
		c.CapacityHold = defaults.CapacityHold
	case c.CapacityHold < 0:
		c.CapacityHold = 0
	}
	switch {
	case c.UnreachableHold == 0:
		c.UnreachableHold = defaults.UnreachableHold
	case c.UnreachableHold < 0:
		c.UnreachableHold = 0
	}
	if c.RequestDeadline == 0 {
		c.RequestDeadline = defaults.RequestDeadline
	}
	if c.BodyBuffer <= 0 {
		c.BodyBuffer = defaults.BodyBuffer
	}
	if c.BodyBufferPerKey <= 0 {
		c.BodyBufferPerKey = defaults.BodyBufferPerKey
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	if c.MetricsAccountLabelsMax == 0 {
		c.MetricsAccountLabelsMax = 50
	}
	if c.OAuthTokenURL == "" {
		c.OAuthTokenURL = upstream.AnthropicTokenURL
	}
	if c.OAuthClientID == "" {
		c.OAuthClientID = upstream.AnthropicClientID
	}
	if c.CodexTokenURL == "" {
		c.CodexTokenURL = upstream.CodexTokenURL
	}
	if c.CodexClientID == "" {
		c.CodexClientID = upstream.CodexClientID
	}
	if c.OAuthClient == nil {
		c.OAuthClient = &http.Client{Timeout: 15 * time.Second}
	}
	if c.UsageClient == nil {
		c.UsageClient = &http.Client{Timeout: 10 * time.Second}
	}
	if c.NotifyClient == nil {
		c.NotifyClient = notify.NewClient()
	}
	if c.notifyRetry == nil {
		c.notifyRetry = notify.RetryDelay
	}
	if c.OIDCClient == nil {
		c.OIDCClient = &http.Client{Timeout: 10 * time.Second}
	}
	if c.OIDCIssuer != "" && c.OIDCName == "" {
		if u, err := url.Parse(c.OIDCIssuer); err == nil {
			c.OIDCName = u.Host
		}
	}
	if c.ProfileClient == nil {
		c.ProfileClient = &http.Client{Timeout: profileTimeout}
	}
}
