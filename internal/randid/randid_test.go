package randid

import (
	"encoding/base64"
	"encoding/hex"
	"testing"
)

func TestShapes(t *testing.T) {
	if b := Bytes(32); len(b) != 32 {
		t.Errorf("Bytes(32) is %d bytes", len(b))
	}
	h := Hex(12)
	if b, err := hex.DecodeString(h); err != nil || len(b) != 12 {
		t.Errorf("Hex(12) = %q: %d bytes, %v", h, len(b), err)
	}
	u := URLSafe(32)
	if b, err := base64.RawURLEncoding.DecodeString(u); err != nil || len(b) != 32 {
		t.Errorf("URLSafe(32) = %q: %d bytes, %v", u, len(b), err)
	}
	// Two draws of 16 bytes colliding would mean the source is not random.
	if a, b := Hex(16), Hex(16); a == b {
		t.Error("two draws are equal")
	}
}
