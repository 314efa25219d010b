package controlplane

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"connectrpc.com/connect"
	"github.com/google/uuid"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

func TestSealBindsAccountAndRevision(t *testing.T) {
	t.Parallel()
	s, err := newSealer(randBytes(32))
	if err != nil {
		t.Fatal(err)
	}
	id, other := uuid.New(), uuid.New()
	secret := apiKey()
	sealed := s.seal(id, 3, secret)
	if bytes.Contains(sealed, []byte(secret)) {
		t.Fatal("sealed bytes hold the plaintext")
	}
	if sealed[0] != sealVersion {
		t.Errorf("version byte %d", sealed[0])
	}
	if got, err := s.open(id, 3, sealed); err != nil || got != secret {
		t.Fatalf("open with the right account and revision failed: %v", err)
	}
	// Sealing twice gives different ciphertexts (fresh nonce).
	if bytes.Equal(sealed, s.seal(id, 3, secret)) {
		t.Error("two seals of one secret are identical")
	}
	other32, _ := newSealer(randBytes(32))
	tampered := bytes.Clone(sealed)
	tampered[len(tampered)-1] ^= 1
	badVersion := bytes.Clone(sealed)
	badVersion[0] = sealVersion + 1
	for _, tc := range []struct {
		name   string
		s      *sealer
		id     uuid.UUID
		rev    int64
		sealed []byte
	}{
		{"other account", s, other, 3, sealed},
		{"older revision", s, id, 2, sealed},
		{"newer revision", s, id, 4, sealed},
		{"other key", other32, id, 3, sealed},
		{"tampered", s, id, 3, tampered},
		{"unknown version", s, id, 3, badVersion},
		{"truncated", s, id, 3, sealed[:5]},
		{"empty", s, id, 3, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.s.open(tc.id, tc.rev, tc.sealed)
			if err == nil || got != "" {
				t.Fatalf("open succeeded (%d bytes)", len(got))
			}
			if err != errUnseal {
				t.Errorf("error %v, want errUnseal", err)
			}
		})
	}
	if _, err := newSealer(randBytes(16)); err == nil {
		t.Error("newSealer accepted a 16-byte key")
	}
}

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
	if got, err := e.srv.seal.open(row.ID, row.CredentialRevision, row.CredentialSealed); err != nil || got != cred {
		t.Fatalf("the replica's own key cannot open the row: %v", err)
	}
	if _, err := e.srv.seal.open(uuid.MustParse(b.Id), row.CredentialRevision, row.CredentialSealed); err == nil {
		t.Error("a's sealed credential opens as b's")
	}
	if _, err := e.srv.seal.open(row.ID, row.CredentialRevision+1, row.CredentialSealed); err == nil {
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
	cfg.SecretKey = randBytes(32)
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
	if !strings.Contains(other.logs.String(), "credential unreadable") {
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
	if err := e.srv.settleCredentials(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.wantUnreadable("after the first replica's check", "sealed-by-b")
	if l := e.mustLease(&weirv1.AcquireRequest{KeyHash: keyHash}); l.AccountId != a.Id || l.Credential != credA {
		t.Fatalf("the original replica lost its credential")
	}
}

func TestParseSecretKey(t *testing.T) {
	t.Parallel()
	key := randBytes(32)
	for _, tc := range []struct {
		name string
		in   string
	}{
		{"hex", hex.EncodeToString(key)},
		{"upper hex", strings.ToUpper(hex.EncodeToString(key))},
		{"hex with newline", hex.EncodeToString(key) + "\n"},
		{"std base64", base64.StdEncoding.EncodeToString(key)},
		{"url base64", base64.URLEncoding.EncodeToString(key)},
		{"raw std base64", base64.RawStdEncoding.EncodeToString(key)},
		{"raw url base64", base64.RawURLEncoding.EncodeToString(key)},
		{"padded base64", "  " + base64.StdEncoding.EncodeToString(key) + "  "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseSecretKey(tc.in)
			if err != nil || !bytes.Equal(got, key) {
				t.Fatalf("ParseSecretKey: %v (equal %v)", err, bytes.Equal(got, key))
			}
		})
	}
	for _, tc := range []struct {
		name string
		in   string
	}{
		{"empty", ""},
		{"31 bytes hex", hex.EncodeToString(key[:31])},
		{"33 bytes hex", hex.EncodeToString(append(bytes.Clone(key), 1))},
		{"16 bytes base64", base64.StdEncoding.EncodeToString(key[:16])},
		{"33 bytes base64", base64.StdEncoding.EncodeToString(append(bytes.Clone(key), 1))},
		{"64 bytes base64", base64.StdEncoding.EncodeToString(append(bytes.Clone(key), key...))},
		{"raw 32 characters", strings.Repeat("k", 32)},
		{"not hex", strings.Repeat("zz", 32)},
	} {
		t.Run("reject "+tc.name, func(t *testing.T) {
			got, err := ParseSecretKey(tc.in)
			if err == nil {
				t.Fatalf("accepted %d bytes", len(got))
			}
			if got != nil {
				t.Error("returned key bytes with an error")
			}
		})
	}
}

func TestCredentialHint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		secret, want string
	}{
		{"sk-ant-api03-abcdefghijklmnopWXYZ", "sk-ant-api03-…WXYZ"},
		{"sk-ant-oat01-abcdefghijklmnop9876", "sk-ant-oat01-…9876"},
		{"sk-ant-other-abcdefghijkl1234", "sk-ant-…1234"},
		{"sk-proj-abcdefghijklmnop5555", "sk-proj-…5555"},
		{"sk-abcdefghijklmnop4321", "sk-…4321"},
		{"eyJhbGciOiJIUzI1NiJ9.payload.sig0", "…sig0"},
		{"12345678", "…****"},         // short: nothing revealed
		{"123456789012345", "…****"},  // 15
		{"1234567890123456", "…3456"}, // 16
		{"sk-ant-api03-xy", "…****"},  // short even with a prefix
		{"sk-ant-api03-wxyz", "sk-ant-api03-…wxyz"},
	} {
		if got := credentialHint(tc.secret); got != tc.want {
			t.Errorf("credentialHint(%d chars) = %q, want %q", len(tc.secret), got, tc.want)
		}
	}
	// Property: for any secret, the hint reveals at most the last four
	// characters beyond a well-known public prefix.
	prefixes := []string{"", "sk-", "sk-ant-", "sk-ant-api03-", "sk-ant-oat01-", "sk-proj-"}
	for _, p := range prefixes {
		for n := 0; n <= 64; n++ {
			secret := p + randHex(n)[:n]
			if len(secret) < 8 {
				continue
			}
			hint := credentialHint(secret)
			pre, tail, ok := strings.Cut(hint, "…")
			if !ok {
				t.Fatalf("hint %q has no ellipsis", hint)
			}
			if !strings.HasPrefix(secret, pre) {
				t.Fatalf("hint prefix %q is not the secret's", pre)
			}
			if tail != "****" && (len(tail) > 4 || !strings.HasSuffix(secret, tail)) {
				t.Fatalf("hint tail %q reveals more than the last 4 characters", tail)
			}
			if !slices.Contains(prefixes, pre) {
				t.Fatalf("hint prefix %q is not a public prefix", pre)
			}
			if !utf8.ValidString(hint) {
				t.Fatalf("hint %q is not valid UTF-8", hint)
			}
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	good := func() Config {
		return Config{AdminToken: strings.Repeat("a", 16), DataplaneToken: strings.Repeat("d", 16), SecretKey: randBytes(32)}
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
		{"short key", func(c *Config) { c.SecretKey = randBytes(31) }, "SecretKey"},
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
	if h := credentialHint(cred); !utf8.ValidString(h) {
		t.Errorf("credentialHint returns invalid UTF-8 for a non-ASCII secret")
	}
}

// sealV1 seals as weir did before key ids: version 1, nonce, ciphertext,
// the associated data unprefixed.
func sealV1(t *testing.T, key []byte, ad []byte, plaintext string) []byte {
	t.Helper()
	k, err := newSealKey(key)
	if err != nil {
		t.Fatal(err)
	}
	nonce := randBytes(k.aead.NonceSize())
	return k.aead.Seal(append([]byte{sealVersion1}, nonce...), nonce, []byte(plaintext), ad)
}

// TestSealVersion1Opens: a credential sealed before key ids opens under
// whichever known key sealed it, current or previous, and is never taken
// for a current seal (rotation re-seals it).
func TestSealVersion1Opens(t *testing.T) {
	t.Parallel()
	a, b := randBytes(32), randBytes(32)
	id := uuid.New()
	secret := apiKey()
	old := sealV1(t, a, sealAD(id, 2), secret)
	oldRefresh := sealV1(t, a, refreshAD(id, 2), secret)
	for _, tc := range []struct {
		name string
		keys [][]byte
	}{
		{"as the current key", [][]byte{a}},
		{"as a previous key", [][]byte{b, a}},
		{"as the second previous key", [][]byte{b, randBytes(32), a}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := newSealer(tc.keys[0], tc.keys[1:]...)
			if err != nil {
				t.Fatal(err)
			}
			got, current, err := s.openWith(sealAD(id, 2), old)
			if err != nil || got != secret || current {
				t.Fatalf("open: %v, plaintext matches %v, current %v; want the secret, not current", err, got == secret, current)
			}
			if got, err := s.openRefresh(id, 2, oldRefresh); err != nil || got != secret {
				t.Fatalf("refresh token: %v", err)
			}
			if _, err := s.open(id, 2, oldRefresh); err != errUnseal {
				t.Errorf("a version 1 refresh token opened as an access token: %v", err)
			}
		})
	}
	s, _ := newSealer(b)
	if _, err := s.open(id, 2, old); err != errUnseal {
		t.Errorf("a version 1 seal opened without its key: %v", err)
	}
}

// TestSealKeyID: a seal names its key in its header (never the key), the
// sealer opens it with that key whether current or previous, says whether
// it is current, and an unknown or altered key id fails with errUnseal.
func TestSealKeyID(t *testing.T) {
	t.Parallel()
	a, b, c := randBytes(32), randBytes(32), randBytes(32)
	id := uuid.New()
	secret := apiKey()
	underA, _ := newSealer(a)
	sealed := underA.seal(id, 1, secret)
	if sealed[0] != sealVersion || len(sealed) < 1+keyIDLen {
		t.Fatalf("header %x", sealed[:min(len(sealed), 1+keyIDLen)])
	}
	wantID := keyID(a)
	if !bytes.Equal(sealed[1:1+keyIDLen], wantID[:]) || KeyID(a) != hex.EncodeToString(wantID[:]) {
		t.Fatalf("key id %x, want %x", sealed[1:1+keyIDLen], wantID)
	}
	if bytes.Contains(sealed, a[:8]) || strings.Contains(KeyID(a), hex.EncodeToString(a[:4])) {
		t.Fatal("the seal or its key id shows the key")
	}
	if KeyID(a) == KeyID(b) {
		t.Fatal("two keys share an id")
	}

	for _, tc := range []struct {
		name        string
		keys        [][]byte
		wantCurrent bool
	}{
		{"current", [][]byte{a, b}, true},
		{"previous", [][]byte{b, a}, false},
		{"last of several previous", [][]byte{c, b, a}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := newSealer(tc.keys[0], tc.keys[1:]...)
			if err != nil {
				t.Fatal(err)
			}
			got, current, err := s.openWith(sealAD(id, 1), sealed)
			if err != nil || got != secret || current != tc.wantCurrent {
				t.Fatalf("open: %v, plaintext matches %v, current %v (want %v)", err, got == secret, current, tc.wantCurrent)
			}
			// A new seal is always under the current key.
			resealed := s.seal(id, 1, got)
			if cur := keyID(tc.keys[0]); !bytes.Equal(resealed[1:1+keyIDLen], cur[:]) {
				t.Error("a new seal names another key than the current one")
			}
		})
	}

	// The key id picks the key: a seal under a, its id rewritten to b's,
	// does not open even though a is known (no trying every key), and
	// the header is authenticated.
	both, _ := newSealer(b, a)
	forged := bytes.Clone(sealed)
	bID := keyID(b)
	copy(forged[1:], bID[:])
	unknownID := bytes.Clone(sealed)
	unknownID[1] ^= 0xff
	for name, tc := range map[string]struct {
		s      *sealer
		sealed []byte
	}{
		"key id rewritten to another known key": {both, forged},
		"unknown key id":                        {both, unknownID},
		"wrong keys only":                       {mustSealer(t, c, b), sealed},
		"header only":                           {both, sealed[:1+keyIDLen]},
		"version 2 without its key id":          {both, sealed[:4]},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := tc.s.open(id, 1, tc.sealed)
			if err != errUnseal || got != "" {
				t.Fatalf("open: %q, %v; want errUnseal", got, err)
			}
			if strings.Contains(err.Error(), hex.EncodeToString(tc.sealed[1:5])) {
				t.Error("the error shows the key id")
			}
		})
	}
}

func mustSealer(t *testing.T, current []byte, previous ...[]byte) *sealer {
	t.Helper()
	s, err := newSealer(current, previous...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNewSealerRefusesRepeatedKeys(t *testing.T) {
	t.Parallel()
	a, b := randBytes(32), randBytes(32)
	for name, keys := range map[string][][]byte{
		"previous repeats current": {a, b, bytes.Clone(a)},
		"previous listed twice":    {a, b, bytes.Clone(b)},
		"short previous":           {a, b[:16]},
	} {
		if _, err := newSealer(keys[0], keys[1:]...); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
