// Package jwtclaims reads the claims of a JWT-shaped token without
// verifying it: weir only ever reads tokens the provider issued to an
// operator (an expiry, an account id, an email for a label), never trusts
// them for authorization.
package jwtclaims

import (
	"encoding/base64"
	"encoding/json"
	"strings"
)

// Decode unmarshals the token's payload into v; false when the token is
// not three dot-separated parts or its payload is not base64url JSON.
func Decode(tok string, v any) bool {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return false
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return false
	}
	return json.Unmarshal(payload, v) == nil
}
