package controlplane

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	"github.com/weirhq/weir/controlplane/seal"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/randid"
)

// TestSealedCredentialAtRest checks the stored row is sealed for its own
// account and revision.
func TestSealedCredentialAtRest(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a, cred := e.createAccount(acct{})
	b, _ := e.createAccount(acct{})
	row := e.accountRow(a.Id)
	if bytes.Contains(row.CredentialSealed, []byte(cred)) {
		t.Fatal("credential_sealed holds the plaintext")
	}
	if got, err := e.srv.seal.Open(row.ID, row.CredentialRevision, row.CredentialSealed); err != nil || got != cred {
		t.Fatalf("the replica's own key cannot open the row: %v", err)
	}
	if _, err := e.srv.seal.Open(uuid.MustParse(b.Id), row.CredentialRevision, row.CredentialSealed); err == nil {
		t.Error("a's sealed credential opens as b's")
	}
	if _, err := e.srv.seal.Open(row.ID, row.CredentialRevision+1, row.CredentialSealed); err == nil {
		t.Error("the sealed credential opens under the next revision")
	}
}

// TestCopiedCiphertextIsUnusable: a credential copied onto another row
// (a database-level attack) fails to open, and Acquire then skips that
// account instead of handing out anything.
func TestCopiedCiphertextIsUnusable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	victim, _ := e.createAccount(acct{label: "victim"})
	thief, _ := e.createAccount(acct{label: "thief"})
	e.pause("victim")
	if _, err := e.pool.Exec(t.Context(),
		`UPDATE accounts SET credential_sealed = (SELECT credential_sealed FROM accounts WHERE id = $1) WHERE id = $2`,
		victim.Id, thief.Id); err != nil {
		t.Fatal(err)
	}
	if resp := e.acquire(&weirv1.AcquireRequest{KeyHash: keyHash}); resp.GetLease() != nil || resp.GetNoAccount() == nil {
		t.Fatalf("Acquire leased %s with a ciphertext copied from another account", resp.GetLease().GetAccountLabel())
	}
	if n := e.count(`SELECT count(*) FROM leases`); n != 0 {
		t.Errorf("%d leases left behind by unreadable credentials", n)
	}
}

// TestWrongSecretKey: a replica with another SecretKey cannot open the
// credentials the first sealed; Acquire skips those accounts (no lease, no
// wrong credential, no panic) and still serves accounts it can read,
// marking broken the ones it could not open. Each replica's check then
// mends what it opens and marks what it does not.
func TestWrongSecretKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	_, keyHash := e.createKey("")
	a, credA := e.createAccount(acct{label: "sealed-by-a", priority: 10})

	cfg := e.cfg
	cfg.SecretKey = randid.Bytes(32)
	cfg.Registry, cfg.Logger = nil, nil
	other := newEnv(t, e.pool, cfg, e.clock)
	other.secrets = e.secrets

	resp := other.acquire(&weirv1.AcquireRequest{KeyHash: keyHash, SessionKey: "s"})
	if l := resp.GetLease(); l != nil {
		t.Fatalf("a replica with the wrong key leased %s (credential matches: %v)", l.AccountLabel, l.Credential == credA)
	}
	if n := e.count(`SELECT count(*) FROM leases`); n != 0 {
		t.Errorf("%d leases left behind", n)
	}
	if !strings.Contains(other.logs.String(), "credential or egress proxy unreadable") {
		t.Error("the unreadable credential was not logged")
	}

	// An account the other replica sealed itself is served, even though
	// the unreadable one ranks first.
	b, credB := other.createAccount(acct{label: "sealed-by-b"})
	l := other.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash})
	if l.AccountId != b.Id || l.Credential != credB {
		t.Fatalf("lease on %s, want sealed-by-b with its own credential", l.AccountLabel)
	}
	if got := e.brokenReasons(); len(got) != 1 || got["sealed-by-a"] != unreadableReason {
		t.Fatalf("broken after the lease on sealed-by-b: %v", got)
	}
	// And the first replica still reads its own: its check mends it (and
	// marks the one it cannot open).
	if err := e.srv.acct.settleCredentials(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.wantUnreadable("after the first replica's check", "sealed-by-b")
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}); l.AccountId != a.Id || l.Credential != credA {
		t.Fatalf("the original replica lost its credential")
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	good := func() Config {
		return Config{AdminToken: strings.Repeat("a", 16), DataplaneToken: strings.Repeat("d", 16), SecretKey: randid.Bytes(32)}
	}
	if c := good(); c.Validate() != nil {
		t.Fatalf("good config rejected: %v", c.Validate())
	}
	for _, tc := range []struct {
		name string
		mod  func(c *Config)
		want string
	}{
		{"short admin token", func(c *Config) { c.AdminToken = "short" }, "AdminToken"},
		{"short data-plane token", func(c *Config) { c.DataplaneToken = strings.Repeat("d", 15) }, "DataplaneToken"},
		{"same tokens", func(c *Config) { c.DataplaneToken = c.AdminToken }, "differ"},
		{"no key", func(c *Config) { c.SecretKey = nil }, "SecretKey"},
		{"short key", func(c *Config) { c.SecretKey = randid.Bytes(31) }, "SecretKey"},
		{"sub-second lease ttl", func(c *Config) { c.LeaseTTL = 500e6 }, "LeaseTTL"},
		{"negative lease ttl", func(c *Config) { c.LeaseTTL = -1 }, "LeaseTTL"},
		{"negative session ttl", func(c *Config) { c.SessionTTL = -1 }, "SessionTTL"},
		{"negative threshold", func(c *Config) { c.AuthFailureThreshold = -1 }, "AuthFailureThreshold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good()
			tc.mod(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error naming %s", err, tc.want)
			}
			if _, err := New(c, nil); err == nil {
				t.Fatal("New accepted the config")
			}
			// The error never echoes a token.
			if strings.Contains(err.Error(), c.AdminToken) && len(c.AdminToken) >= 16 {
				t.Error("error echoes the admin token")
			}
		})
	}
	c := good()
	c.setDefaults()
	if c.LeaseTTL != 30e9 || c.SessionTTL != 3600e9 || c.AuthFailureThreshold != 3 || c.Now == nil || c.Logger == nil || c.Registry == nil {
		t.Errorf("defaults: %+v", c)
	}
}

// TestNonASCIICredential: credentials are ASCII tokens; anything else must
// be refused as invalid input. Today the hint cuts the last four bytes out
// of a multi-byte character, Postgres rejects the invalid UTF-8 and the
// operator gets an opaque Internal error.
func TestNonASCIICredential(t *testing.T) {
	t.Parallel()
	e := setup(t)
	cred := "sk-ant-api03-abcdefgh\u00e9\u20ac"
	e.secrets.add(cred)
	_, err := e.admin.accounts.CreateAccount(t.Context(), connect.NewRequest(&weirv1.CreateAccountRequest{
		Provider: weirv1.Provider_PROVIDER_ANTHROPIC, AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY,
		Label: "unicode", Credential: cred,
	}))
	ce := wantCode(t, err, connect.CodeInvalidArgument)
	if !strings.HasPrefix(ce.Message(), "credential:") {
		t.Errorf("message %q does not name the credential", ce.Message())
	}
	if h := seal.Hint(cred); !utf8.ValidString(h) {
		t.Errorf("seal.Hint returns invalid UTF-8 for a non-ASCII secret")
	}
}
