package sim

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"time"
)

// newID returns an id in the real API's style ("msg_01…", "req_01…"): the
// time from the injected clock, then randomness, so ids are unique and
// carry when they were made.
func newID(prefix string, now time.Time) string {
	var ms [8]byte
	binary.BigEndian.PutUint64(ms[:], uint64(now.UnixMilli()))
	stamp := base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(ms[2:])
	return prefix + "01" + stamp + rand.Text()[:14]
}
