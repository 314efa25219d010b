// Package seal encrypts account credentials at rest (AES-256-GCM, each
// seal bound to its account and credential revision and naming its key),
// opens them under the current key or a previous one, and masks them for
// display. It knows nothing of where the seals are stored.
package seal

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/uuid"
)

// Sealer encrypts account credentials at rest with AES-256-GCM. The
// associated data binds a ciphertext to its account and credential revision,
// so a sealed credential copied onto another row, or replayed after a
// rotation, fails to open.
//
// It seals under the current key and opens under the current key or any
// previous one, so the key can change while credentials sealed under the
// old one are still stored ('weir secrets rotate' re-seals them).
type Sealer struct {
	current sealKey
	// keys is every key that opens: the current one first.
	keys []sealKey
}

// sealKey is one AES-256-GCM key and its id.
type sealKey struct {
	id   [keyIDLen]byte
	aead cipher.AEAD
}

// The seal formats. Version 1 is version byte, nonce, ciphertext; it names
// no key, so opening tries each. Version 2 (every new seal) is version
// byte, key id, nonce, ciphertext, and its associated data starts with the
// version and key id, so the header cannot be altered either.
const (
	sealVersion1 = 1
	sealVersion  = 2
)

// keyIDLen is the length of a key id: the first bytes of SHA-256 over
// keyIDLabel and the key. It names a key among a handful; for a random
// 256-bit key it tells nothing more than any ciphertext sealed with it
// already does.
const keyIDLen = 8

const keyIDLabel = "weir-secret-key-id\x00"

// KeyID returns the id naming key in version 2 seals, in hex: what
// operators see in 'weir secrets rotate'. Never the key itself.
func KeyID(key []byte) string {
	id := keyID(key)
	return hex.EncodeToString(id[:])
}

func keyID(key []byte) [keyIDLen]byte {
	h := sha256.New()
	h.Write([]byte(keyIDLabel))
	h.Write(key)
	var id [keyIDLen]byte
	copy(id[:], h.Sum(nil))
	return id
}

// ParseSecretKey reads a 32-byte key given as 64 hex characters or as
// standard or URL-safe base64.
func ParseSecretKey(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	if b, err := hex.DecodeString(s); err == nil && len(b) == 32 {
		return b, nil
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil && len(b) == 32 {
			return b, nil
		}
	}
	return nil, errors.New("secret key must be 32 bytes, as 64 hex characters or base64")
}

// New seals under current and opens under current or any of previous.
func New(current []byte, previous ...[]byte) (*Sealer, error) {
	s := &Sealer{}
	for i, key := range append([][]byte{current}, previous...) {
		k, err := newSealKey(key)
		if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(s.keys, func(o sealKey) bool { return o.id == k.id }) {
			if bytes.Equal(key, current) {
				return nil, errors.New("a previous secret key repeats the current one")
			}
			return nil, fmt.Errorf("previous secret key %d repeats an earlier one", i)
		}
		s.keys = append(s.keys, k)
	}
	s.current = s.keys[0]
	return s, nil
}

func newSealKey(key []byte) (sealKey, error) {
	if len(key) != 32 {
		return sealKey{}, errors.New("secret key must be 32 bytes")
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return sealKey{}, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return sealKey{}, err
	}
	return sealKey{id: keyID(key), aead: aead}, nil
}

func sealAD(account uuid.UUID, revision int64) []byte {
	ad := make([]byte, 0, 16+8)
	ad = append(ad, account[:]...)
	return binary.BigEndian.AppendUint64(ad, uint64(revision))
}

// refreshADPrefix sets refresh tokens' associated data apart from access
// tokens': an access ciphertext never opens as a refresh token, nor the
// other way round, even on the same account and revision.
const refreshADPrefix = "weir-refresh-token\x00"

func refreshAD(account uuid.UUID, revision int64) []byte {
	return append([]byte(refreshADPrefix), sealAD(account, revision)...)
}

// proxyADPrefix sets egress proxy URLs apart from credentials and refresh
// tokens. A proxy URL has no revision of its own: it is bound to its
// owner, an account or, for the default, uuid.Nil.
const proxyADPrefix = "weir-egress-proxy\x00"

func proxyAD(owner uuid.UUID) []byte {
	return append([]byte(proxyADPrefix), owner[:]...)
}

// SealProxy seals an egress proxy URL (it may hold a password) for owner:
// an account, or uuid.Nil for the default every other account uses.
func (s *Sealer) SealProxy(owner uuid.UUID, url string) []byte {
	return s.sealWith(proxyAD(owner), url)
}

// OpenProxy opens a proxy URL sealed by SealProxy for the same owner.
func (s *Sealer) OpenProxy(owner uuid.UUID, sealed []byte) (string, error) {
	return s.openWith(proxyAD(owner), sealed)
}

// Seal seals an account's credential (its access token or API key) at a
// credential revision.
func (s *Sealer) Seal(account uuid.UUID, revision int64, plaintext string) []byte {
	return s.sealWith(sealAD(account, revision), plaintext)
}

// SealRefresh seals an OAuth refresh token.
func (s *Sealer) SealRefresh(account uuid.UUID, revision int64, plaintext string) []byte {
	return s.sealWith(refreshAD(account, revision), plaintext)
}

// targetADPrefix sets a notification target's seals apart from account
// credentials': its URL and its signing secret are each bound to the
// target's id and to which of the two they are, so neither opens as the
// other, nor on another target.
const targetADPrefix = "weir-notify-target\x00"

func targetAD(target uuid.UUID, field string) []byte {
	ad := append([]byte(targetADPrefix), field...)
	ad = append(ad, 0)
	return append(ad, target[:]...)
}

// SealTarget seals a notification target's secret material: field names
// it ("url", "secret").
func (s *Sealer) SealTarget(target uuid.UUID, field, plaintext string) []byte {
	return s.sealWith(targetAD(target, field), plaintext)
}

// OpenTarget opens what SealTarget sealed for the same target and field.
func (s *Sealer) OpenTarget(target uuid.UUID, field string, sealed []byte) (string, error) {
	return s.openWith(targetAD(target, field), sealed)
}

func (s *Sealer) sealWith(ad []byte, plaintext string) []byte {
	k := s.current
	out := make([]byte, 0, 1+keyIDLen+k.aead.NonceSize()+len(plaintext)+k.aead.Overhead())
	out = append(out, sealVersion)
	out = append(out, k.id[:]...)
	header := len(out)
	nonce := make([]byte, k.aead.NonceSize())
	rand.Read(nonce) //nolint:errcheck // crypto/rand.Read never fails on Linux
	out = append(out, nonce...)
	return k.aead.Seal(out, nonce, []byte(plaintext), v2AD(out[:header], ad))
}

// v2AD is a version 2 seal's associated data: its header, then ad.
func v2AD(header, ad []byte) []byte {
	return append(bytes.Clone(header), ad...)
}

// ErrUnseal is every failure to open: it never carries detail, as the
// ciphertext may be an attacker's probe.
var ErrUnseal = errors.New("credential cannot be decrypted (wrong WEIR_SECRET_KEY?)")

// Open opens a credential sealed by Seal for the same account and
// revision, under any of the keys.
func (s *Sealer) Open(account uuid.UUID, revision int64, sealed []byte) (string, error) {
	return s.openWith(sealAD(account, revision), sealed)
}

// OpenRefresh opens a refresh token sealed by SealRefresh.
func (s *Sealer) OpenRefresh(account uuid.UUID, revision int64, sealed []byte) (string, error) {
	return s.openWith(refreshAD(account, revision), sealed)
}

// Current says whether sealed is sealed as a new seal would be: version 2
// under the current key. Of a seal that opens, the others are what a key
// rotation re-seals.
func (s *Sealer) Current(sealed []byte) bool {
	return len(sealed) >= 1+keyIDLen && sealed[0] == sealVersion && bytes.Equal(sealed[1:1+keyIDLen], s.current.id[:])
}

func (s *Sealer) openWith(ad, sealed []byte) (string, error) {
	if len(sealed) == 0 {
		return "", ErrUnseal
	}
	switch sealed[0] {
	case sealVersion:
		if len(sealed) < 1+keyIDLen {
			return "", ErrUnseal
		}
		header := sealed[:1+keyIDLen]
		i := slices.IndexFunc(s.keys, func(k sealKey) bool { return bytes.Equal(k.id[:], header[1:]) })
		if i < 0 {
			return "", ErrUnseal
		}
		p, ok := openGCM(s.keys[i].aead, v2AD(header, ad), sealed[len(header):])
		if !ok {
			return "", ErrUnseal
		}
		return p, nil
	case sealVersion1:
		for _, k := range s.keys {
			if p, ok := openGCM(k.aead, ad, sealed[1:]); ok {
				return p, nil
			}
		}
	}
	return "", ErrUnseal
}

// openGCM opens nonce and ciphertext.
func openGCM(aead cipher.AEAD, ad, body []byte) (string, bool) {
	n := aead.NonceSize()
	if len(body) < n {
		return "", false
	}
	plain, err := aead.Open(nil, body[:n], body[n:], ad)
	if err != nil {
		return "", false
	}
	return string(plain), true
}

// Hint masks a credential for display: a recognisable prefix and the last
// four characters, e.g. "sk-ant-api03-…wxyz".
func Hint(secret string) string {
	const tail = 4
	if len(secret) < 16 {
		return "…" + strings.Repeat("*", 4)
	}
	prefix := ""
	for _, p := range []string{"sk-ant-api03-", "sk-ant-oat01-", "sk-ant-", "sk-proj-", "sk-"} {
		if strings.HasPrefix(secret, p) {
			prefix = p
			break
		}
	}
	r := []rune(secret)
	return fmt.Sprintf("%s…%s", prefix, string(r[len(r)-tail:]))
}
