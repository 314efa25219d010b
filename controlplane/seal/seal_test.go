package seal

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/weirhq/weir/internal/randid"
)

// apiKey looks like an Anthropic API key and is unique per call.
func apiKey() string { return "sk-ant-api03-" + randid.Hex(40) }

func TestSealBindsAccountAndRevision(t *testing.T) {
	t.Parallel()
	s, err := New(randid.Bytes(32))
	if err != nil {
		t.Fatal(err)
	}
	id, other := uuid.New(), uuid.New()
	secret := apiKey()
	sealed := s.Seal(id, 3, secret)
	if bytes.Contains(sealed, []byte(secret)) {
		t.Fatal("sealed bytes hold the plaintext")
	}
	if sealed[0] != sealVersion {
		t.Errorf("version byte %d", sealed[0])
	}
	if got, err := s.Open(id, 3, sealed); err != nil || got != secret {
		t.Fatalf("open with the right account and revision failed: %v", err)
	}
	// Sealing twice gives different ciphertexts (fresh nonce).
	if bytes.Equal(sealed, s.Seal(id, 3, secret)) {
		t.Error("two seals of one secret are identical")
	}
	other32, _ := New(randid.Bytes(32))
	tampered := bytes.Clone(sealed)
	tampered[len(tampered)-1] ^= 1
	badVersion := bytes.Clone(sealed)
	badVersion[0] = sealVersion + 1
	for _, tc := range []struct {
		name   string
		s      *Sealer
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
			got, err := tc.s.Open(tc.id, tc.rev, tc.sealed)
			if err == nil || got != "" {
				t.Fatalf("open succeeded (%d bytes)", len(got))
			}
			if err != ErrUnseal {
				t.Errorf("error %v, want ErrUnseal", err)
			}
		})
	}
	if _, err := New(randid.Bytes(16)); err == nil {
		t.Error("New accepted a 16-byte key")
	}
}

func TestParseSecretKey(t *testing.T) {
	t.Parallel()
	key := randid.Bytes(32)
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

func TestHint(t *testing.T) {
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
		if got := Hint(tc.secret); got != tc.want {
			t.Errorf("Hint(%d chars) = %q, want %q", len(tc.secret), got, tc.want)
		}
	}
	// Property: for any secret, the hint reveals at most the last four
	// characters beyond a well-known public prefix.
	prefixes := []string{"", "sk-", "sk-ant-", "sk-ant-api03-", "sk-ant-oat01-", "sk-proj-"}
	for _, p := range prefixes {
		for n := 0; n <= 64; n++ {
			secret := p + randid.Hex(n)[:n]
			if len(secret) < 8 {
				continue
			}
			hint := Hint(secret)
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

// sealV1 seals as weir did before key ids: version 1, nonce, ciphertext,
// the associated data unprefixed.
func sealV1(t *testing.T, key []byte, ad []byte, plaintext string) []byte {
	t.Helper()
	k, err := newSealKey(key)
	if err != nil {
		t.Fatal(err)
	}
	nonce := randid.Bytes(k.aead.NonceSize())
	return k.aead.Seal(append([]byte{sealVersion1}, nonce...), nonce, []byte(plaintext), ad)
}

// TestSealVersion1Opens: a credential sealed before key ids opens under
// whichever known key sealed it, current or previous, and is never taken
// for a current seal (rotation re-seals it).
func TestSealVersion1Opens(t *testing.T) {
	t.Parallel()
	a, b := randid.Bytes(32), randid.Bytes(32)
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
		{"as the second previous key", [][]byte{b, randid.Bytes(32), a}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.keys[0], tc.keys[1:]...)
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Open(id, 2, old)
			current := s.Current(old)
			if err != nil || got != secret || current {
				t.Fatalf("open: %v, plaintext matches %v, current %v; want the secret, not current", err, got == secret, current)
			}
			if got, err := s.OpenRefresh(id, 2, oldRefresh); err != nil || got != secret {
				t.Fatalf("refresh token: %v", err)
			}
			if _, err := s.Open(id, 2, oldRefresh); err != ErrUnseal {
				t.Errorf("a version 1 refresh token opened as an access token: %v", err)
			}
		})
	}
	s, _ := New(b)
	if _, err := s.Open(id, 2, old); err != ErrUnseal {
		t.Errorf("a version 1 seal opened without its key: %v", err)
	}
}

// TestSealKeyID: a seal names its key in its header (never the key), the
// Sealer opens it with that key whether current or previous, says whether
// it is current, and an unknown or altered key id fails with ErrUnseal.
func TestSealKeyID(t *testing.T) {
	t.Parallel()
	a, b, c := randid.Bytes(32), randid.Bytes(32), randid.Bytes(32)
	id := uuid.New()
	secret := apiKey()
	underA, _ := New(a)
	sealed := underA.Seal(id, 1, secret)
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
			s, err := New(tc.keys[0], tc.keys[1:]...)
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Open(id, 1, sealed)
			current := s.Current(sealed)
			if err != nil || got != secret || current != tc.wantCurrent {
				t.Fatalf("open: %v, plaintext matches %v, current %v (want %v)", err, got == secret, current, tc.wantCurrent)
			}
			// A new seal is always under the current key.
			resealed := s.Seal(id, 1, got)
			if cur := keyID(tc.keys[0]); !bytes.Equal(resealed[1:1+keyIDLen], cur[:]) {
				t.Error("a new seal names another key than the current one")
			}
		})
	}

	// The key id picks the key: a seal under a, its id rewritten to b's,
	// does not open even though a is known (no trying every key), and
	// the header is authenticated.
	both, _ := New(b, a)
	forged := bytes.Clone(sealed)
	bID := keyID(b)
	copy(forged[1:], bID[:])
	unknownID := bytes.Clone(sealed)
	unknownID[1] ^= 0xff
	for name, tc := range map[string]struct {
		s      *Sealer
		sealed []byte
	}{
		"key id rewritten to another known key": {both, forged},
		"unknown key id":                        {both, unknownID},
		"wrong keys only":                       {mustSealer(t, c, b), sealed},
		"header only":                           {both, sealed[:1+keyIDLen]},
		"version 2 without its key id":          {both, sealed[:4]},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := tc.s.Open(id, 1, tc.sealed)
			if err != ErrUnseal || got != "" {
				t.Fatalf("open: %q, %v; want ErrUnseal", got, err)
			}
			if strings.Contains(err.Error(), hex.EncodeToString(tc.sealed[1:5])) {
				t.Error("the error shows the key id")
			}
		})
	}
}

func mustSealer(t *testing.T, current []byte, previous ...[]byte) *Sealer {
	t.Helper()
	s, err := New(current, previous...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNewSealerRefusesRepeatedKeys(t *testing.T) {
	t.Parallel()
	a, b := randid.Bytes(32), randid.Bytes(32)
	for name, keys := range map[string][][]byte{
		"previous repeats current": {a, b, bytes.Clone(a)},
		"previous listed twice":    {a, b, bytes.Clone(b)},
		"short previous":           {a, b[:16]},
	} {
		if _, err := New(keys[0], keys[1:]...); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestSealTargetBindsTargetAndField: a notification target's URL and
// secret open only on their own target, each as itself, and never as an
// account credential.
func TestSealTargetBindsTargetAndField(t *testing.T) {
	t.Parallel()
	s, err := New(randid.Bytes(32))
	if err != nil {
		t.Fatal(err)
	}
	id, other := uuid.New(), uuid.New()
	url := "https://hooks.example.com/services/" + randid.Hex(16)
	sealed := s.SealTarget(id, "url", url)
	if bytes.Contains(sealed, []byte(url)) {
		t.Fatal("sealed bytes hold the plaintext")
	}
	if got, err := s.OpenTarget(id, "url", sealed); err != nil || got != url {
		t.Fatalf("open with the right target and field failed: %v", err)
	}
	for name, open := range map[string]func() (string, error){
		"other target":    func() (string, error) { return s.OpenTarget(other, "url", sealed) },
		"other field":     func() (string, error) { return s.OpenTarget(id, "secret", sealed) },
		"as a credential": func() (string, error) { return s.Open(id, 1, sealed) },
	} {
		if got, err := open(); err != ErrUnseal || got != "" {
			t.Errorf("%s: opened (%d bytes), %v", name, len(got), err)
		}
	}
	if _, err := s.OpenTarget(id, "url", s.Seal(id, 1, url)); err != ErrUnseal {
		t.Errorf("an account seal opened as a target's: %v", err)
	}
}

// TestSealProxyBindsOwner: a proxy URL opens for its owner only, never as
// a credential or refresh token (nor one as a proxy URL), and under a
// previous key too.
func TestSealProxyBindsOwner(t *testing.T) {
	t.Parallel()
	oldKey := randid.Bytes(32)
	s, err := New(oldKey)
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.New()
	url := "socks5://user:" + randid.Hex(12) + "@127.0.0.1:1080"
	sealed := s.SealProxy(id, url)
	if bytes.Contains(sealed, []byte(url)) {
		t.Fatal("sealed bytes hold the plaintext")
	}
	if got, err := s.OpenProxy(id, sealed); err != nil || got != url {
		t.Fatalf("open: %v", err)
	}
	def := s.SealProxy(uuid.Nil, url)
	if got, err := s.OpenProxy(uuid.Nil, def); err != nil || got != url {
		t.Fatalf("open the default: %v", err)
	}
	for name, open := range map[string]func() (string, error){
		"other owner":         func() (string, error) { return s.OpenProxy(uuid.New(), sealed) },
		"the default's owner": func() (string, error) { return s.OpenProxy(uuid.Nil, sealed) },
		"as a credential":     func() (string, error) { return s.Open(id, 0, sealed) },
		"as a refresh token":  func() (string, error) { return s.OpenRefresh(id, 0, sealed) },
		"a credential":        func() (string, error) { return s.OpenProxy(id, s.Seal(id, 0, url)) },
	} {
		if got, err := open(); err != ErrUnseal || got != "" {
			t.Errorf("%s: opened (%d bytes), %v", name, len(got), err)
		}
	}
	rotated, err := New(randid.Bytes(32), oldKey)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := rotated.OpenProxy(id, sealed); err != nil || got != url || rotated.Current(sealed) {
		t.Errorf("under a previous key: %v, current %v", err, rotated.Current(sealed))
	}
}
