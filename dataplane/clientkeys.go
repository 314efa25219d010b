package dataplane

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/gen/weir/v1/weirv1connect"
)

// clientKey reads the client's weir key from x-api-key (what Claude Code
// sends with ANTHROPIC_API_KEY) or a bearer (ANTHROPIC_AUTH_TOKEN).
func clientKey(r *http.Request) string {
	if k := strings.TrimSpace(r.Header.Get("X-Api-Key")); k != "" {
		return k
	}
	// The auth scheme is case-insensitive (RFC 9110 §11.1).
	if scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
		return strings.TrimSpace(tok)
	}
	return ""
}

func hashKey(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// keyCache remembers verified keys briefly so that most requests do not
// pay a VerifyKey round trip. It only ever admits: Acquire checks the key
// again, so a revoked key gets no lease even while it is cached here.
type keyCache struct {
	client weirv1connect.LeaseServiceClient
	ttl    time.Duration
	now    func() time.Time

	mu      sync.Mutex
	entries map[string]keyEntry
}

type keyEntry struct {
	key     verifiedKey
	expires time.Time
}

// verifiedKey is a live key and what restricts it on this side: the
// model allowlist (checked before anything is leased) and the rate limit
// (a key with one takes a token for each request). Account pinning is the
// control plane's alone.
type verifiedKey struct {
	id            string
	allowedModels []string
	ratePerMinute int32
	// budgeted: the key or its team has a budget (every request asks
	// Acquire, with the worker's unreported spend); team is its team.
	budgeted bool
	team     string
}

// errKeyRejected is a key the control plane does not know or revoked.
var errKeyRejected = errors.New("key rejected")

// keyStale is how long past its expiry a verification still admits a key
// while the control plane cannot be asked: a worker keeps serving (and
// holding) the agents it knew through a control-plane restart. It admits
// only: no lease is granted without Acquire checking the key again.
const keyStale = 10 * time.Minute

// verify returns the key for a key hash.
func (c *keyCache) verify(ctx context.Context, hash string) (verifiedKey, error) {
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[hash]
	c.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.key, nil
	}
	resp, err := c.client.VerifyKey(ctx, connect.NewRequest(&weirv1.VerifyKeyRequest{KeyHash: hash}))
	if err != nil {
		if connect.CodeOf(err) == connect.CodePermissionDenied {
			c.forget(hash)
			return verifiedKey{}, errKeyRejected
		}
		if ok && undelivered(err) && now.Before(e.expires.Add(keyStale)) {
			return e.key, nil
		}
		return verifiedKey{}, err
	}
	k := verifiedKey{id: resp.Msg.KeyId, allowedModels: resp.Msg.AllowedModels, ratePerMinute: resp.Msg.RateLimitPerMinute,
		budgeted: resp.Msg.Budgeted, team: resp.Msg.TeamId}
	c.mu.Lock()
	if len(c.entries) > 10000 {
		// Bounded: a flood of distinct valid keys cannot grow it forever.
		clear(c.entries)
	}
	c.entries[hash] = keyEntry{key: k, expires: now.Add(c.ttl)}
	c.mu.Unlock()
	return k, nil
}

// forgetAll drops every cached verification: a key changed.
func (c *keyCache) forgetAll() {
	c.mu.Lock()
	clear(c.entries)
	c.mu.Unlock()
}

func (c *keyCache) forget(hash string) {
	c.mu.Lock()
	delete(c.entries, hash)
	c.mu.Unlock()
}
