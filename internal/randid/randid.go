// Package randid makes the random identifiers and secrets weir hands out
// (client keys, request ids, webhook secrets, generated tokens) from
// crypto/rand, in the few shapes they take.
package randid

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
)

// Bytes is n random bytes.
func Bytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b) //nolint:errcheck // crypto/rand.Read never fails on Linux
	return b
}

// Hex is n random bytes, hex: 2n characters.
func Hex(n int) string { return hex.EncodeToString(Bytes(n)) }

// URLSafe is n random bytes in unpadded base64url, for values that travel
// in URLs (OAuth state and PKCE verifiers).
func URLSafe(n int) string { return base64.RawURLEncoding.EncodeToString(Bytes(n)) }
