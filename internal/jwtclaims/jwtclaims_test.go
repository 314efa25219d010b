package jwtclaims

import (
	"encoding/base64"
	"testing"
)

func TestDecode(t *testing.T) {
	t.Parallel()
	payload := base64.RawURLEncoding.EncodeToString([]byte(`{"exp":1893456000,"email":"a@example.com"}`))
	var c struct {
		Exp   int64  `json:"exp"`
		Email string `json:"email"`
	}
	if !Decode("h."+payload+".sig", &c) || c.Exp != 1893456000 || c.Email != "a@example.com" {
		t.Errorf("Decode = %+v", c)
	}
	// Padded payloads decode too.
	if !Decode("h."+payload+"==.sig", &c) {
		t.Error("a padded payload did not decode")
	}
	for _, bad := range []string{"", "a.b", "a.b.c.d", "h.!!!.s", "h." + base64.RawURLEncoding.EncodeToString([]byte("not json")) + ".s"} {
		if Decode(bad, &c) {
			t.Errorf("Decode(%q) = true", bad)
		}
	}
}
