package controlplane

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// sealer encrypts account credentials at rest with AES-256-GCM. The
// associated data binds a ciphertext to its account and credential revision,
// so a sealed credential copied onto another row, or replayed after a
// rotation, fails to open.
type sealer struct {
	aead cipher.AEAD
}

// sealVersion prefixes every ciphertext so the format can change later.
const sealVersion = 1

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

func newSealer(key []byte) (*sealer, error) {
	if len(key) != 32 {
		return nil, errors.New("secret key must be 32 bytes")
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &sealer{aead: aead}, nil
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

func (s *sealer) seal(account uuid.UUID, revision int64, plaintext string) []byte {
	return s.sealWith(sealAD(account, revision), plaintext)
}

// sealRefresh seals an OAuth refresh token.
func (s *sealer) sealRefresh(account uuid.UUID, revision int64, plaintext string) []byte {
	return s.sealWith(refreshAD(account, revision), plaintext)
}

func (s *sealer) sealWith(ad []byte, plaintext string) []byte {
	nonce := make([]byte, s.aead.NonceSize())
	rand.Read(nonce) //nolint:errcheck // crypto/rand.Read never fails on Linux
	out := append([]byte{sealVersion}, nonce...)
	return s.aead.Seal(out, nonce, []byte(plaintext), ad)
}

// errUnseal never carries detail: the ciphertext may be an attacker's probe.
var errUnseal = errors.New("credential cannot be decrypted (wrong WEIR_SECRET_KEY?)")

func (s *sealer) open(account uuid.UUID, revision int64, sealed []byte) (string, error) {
	return s.openWith(sealAD(account, revision), sealed)
}

// openRefresh opens a refresh token sealed by sealRefresh.
func (s *sealer) openRefresh(account uuid.UUID, revision int64, sealed []byte) (string, error) {
	return s.openWith(refreshAD(account, revision), sealed)
}

func (s *sealer) openWith(ad, sealed []byte) (string, error) {
	n := s.aead.NonceSize()
	if len(sealed) < 1+n || sealed[0] != sealVersion {
		return "", errUnseal
	}
	plain, err := s.aead.Open(nil, sealed[1:1+n], sealed[1+n:], ad)
	if err != nil {
		return "", errUnseal
	}
	return string(plain), nil
}

// credentialHint masks a credential for display: a recognisable prefix and
// the last four characters, e.g. "sk-ant-api03-…wxyz".
func credentialHint(secret string) string {
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
