package controlplane

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/weirhq/weir/controlplane/db"
	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// cacheLifetime is how long a provider keeps a prompt-cache entry after
// its last use: five minutes by default on Anthropic (refreshed by each
// read) and about as long on OpenAI. A request after a longer gap is
// expected to miss. (Anthropic's one-hour lifetime, when a client asks
// for it, makes some "expired" misses look early; the gap says so.)
const cacheLifetime = 5 * time.Minute

// openAICacheMin is the prompt length from which OpenAI caches a prompt
// on its own (1,024 tokens): below it no miss is expected.
const openAICacheMin = 1024

// Bounds on ExplainCache: the route events it reads at most, and the
// misses it lists per session.
const (
	maxCacheEvents        = 100000
	maxMissesPerSession   = 200
	defaultCacheSessions  = 50
	maxCacheSessionsLimit = 1000
)

// cacheEvent is one finished request of a session as the cache account
// reads it.
type cacheEvent struct {
	requestID                       string
	key, account                    uuid.UUID
	openAI                          bool
	at                              time.Time
	status                          int32
	input, cacheRead, cacheCreation int64
	holds                           int32
	attempts                        []*weirv1.AttemptRecord
}

// cached says whether a request left its prompt in the account's cache:
// it read or wrote the cache (Anthropic, with cache_control), or, on
// OpenAI, read it or sent a prompt long enough to be cached on its own.
func (e cacheEvent) cached() bool {
	if e.cacheRead > 0 || e.cacheCreation > 0 {
		return true
	}
	return e.openAI && e.input >= openAICacheMin
}

// missCause attributes a request that read nothing from the cache
// although the session's previous request, prev, cached its prompt. Pure.
// It returns the cause (moved, expired, prefix_changed) and one line of
// why.
func missCause(prev, cur cacheEvent, sessionTTL time.Duration, label func(uuid.UUID) string) (cause, why string) {
	gap := cur.at.Sub(prev.at)
	if cur.account != prev.account {
		return "moved", movedWhy(prev, cur, gap, sessionTTL, label)
	}
	if gap > cacheLifetime {
		return "expired", fmt.Sprintf("%s since the session's previous request, past the cache's %s lifetime", gap.Round(time.Second), cacheLifetime)
	}
	return "prefix_changed", "same account, within the cache's lifetime, and nothing read: the prompt's start changed (system prompt, tools, or a compacted conversation)"
}

// movedWhy says why a session's request went to another account than its
// previous one: the attempts tell a failover or a hold; else the binding
// lapsed or the account could not take it.
func movedWhy(prev, cur cacheEvent, gap, sessionTTL time.Duration, label func(uuid.UUID) string) string {
	prevName := label(prev.account)
	for _, a := range cur.attempts {
		if a.GetAccountId() == prev.account.String() && a.GetClass() != weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS {
			what := fmt.Sprintf("%d", a.GetStatus())
			if t := a.GetErrorType(); t != "" {
				what += " " + t
			} else if a.GetClass() != weirv1.OutcomeClass_OUTCOME_CLASS_UNSPECIFIED {
				what += " " + outcomeWord(a.GetClass())
			}
			return fmt.Sprintf("failover: %s answered %s, and %s served", prevName, what, label(cur.account))
		}
	}
	for _, a := range cur.attempts {
		if a.GetAccountId() == "" && a.GetHoldReason() != "" {
			return fmt.Sprintf("held (%s), then served by %s", a.GetHoldReason(), label(cur.account))
		}
	}
	if cur.holds > 0 {
		return fmt.Sprintf("held, then served by %s", label(cur.account))
	}
	if sessionTTL > 0 && gap > sessionTTL {
		return fmt.Sprintf("affinity lost: the session's binding to %s lapsed (%s idle, past %s)", prevName, gap.Round(time.Second), sessionTTL)
	}
	return fmt.Sprintf("affinity lost: %s could not take it (at its concurrency cap, cooling, out of quota or paused), so %s served", prevName, label(cur.account))
}

func outcomeWord(c weirv1.OutcomeClass) string {
	return strings.TrimPrefix(strings.ToLower(c.String()), "outcome_class_")
}

// explainSessions is the cache account of events (ordered by session and
// start). Pure.
func explainSessions(sessions map[string][]cacheEvent, keyNames map[uuid.UUID]string, sessionTTL time.Duration, label func(uuid.UUID) string) []*weirv1.SessionCache {
	out := make([]*weirv1.SessionCache, 0, len(sessions))
	for key, evs := range sessions {
		sc := &weirv1.SessionCache{SessionKey: key, Causes: map[string]int32{}}
		var prev *cacheEvent
		for i := range evs {
			e := evs[i]
			if sc.FirstAt == nil {
				sc.FirstAt = timestamppb.New(e.at)
				if e.key != uuid.Nil {
					sc.KeyId, sc.KeyName = e.key.String(), keyNames[e.key]
				}
			}
			sc.LastAt = timestamppb.New(e.at)
			if e.status < 200 || e.status > 299 {
				continue // not served: nothing to read or write
			}
			sc.Requests++
			sc.InputTokens += e.input
			sc.CacheReadTokens += e.cacheRead
			sc.CacheCreationTokens += e.cacheCreation
			if prev != nil && prev.cached() && e.cacheRead == 0 {
				cause, why := missCause(*prev, e, sessionTTL, label)
				sc.Causes[cause]++
				if len(sc.Misses) < maxMissesPerSession {
					m := &weirv1.CacheMiss{RequestId: e.requestID, StartedAt: timestamppb.New(e.at), Cause: cause, Why: why,
						Gap: durationpb.New(e.at.Sub(prev.at)), UncachedInputTokens: e.input + e.cacheCreation}
					if e.account != uuid.Nil {
						m.AccountId, m.AccountLabel = e.account.String(), label(e.account)
					}
					if prev.account != uuid.Nil {
						m.PreviousAccountId, m.PreviousAccountLabel = prev.account.String(), label(prev.account)
					}
					sc.Misses = append(sc.Misses, m)
				}
			}
			prev = &evs[i]
		}
		sc.CacheHitRatio = hitRatio(sc.InputTokens, sc.CacheReadTokens, sc.CacheCreationTokens)
		out = append(out, sc)
	}
	// The sessions whose misses cost the most first: uncached input.
	uncached := func(s *weirv1.SessionCache) int64 {
		var n int64
		for _, m := range s.Misses {
			n += m.UncachedInputTokens
		}
		return n
	}
	slices.SortFunc(out, func(a, b *weirv1.SessionCache) int {
		return cmp.Or(cmp.Compare(uncached(b), uncached(a)), cmp.Compare(a.SessionKey, b.SessionKey))
	})
	return out
}

func (u usageService) ExplainCache(ctx context.Context, req *connect.Request[weirv1.ExplainCacheRequest]) (*connect.Response[weirv1.ExplainCacheResponse], error) {
	m := req.Msg
	limit := int(m.GetLimit())
	switch {
	case limit < 0:
		return nil, invalidf("limit: must not be negative")
	case limit == 0:
		limit = defaultCacheSessions
	case limit > maxCacheSessionsLimit:
		limit = maxCacheSessionsLimit
	}
	p := db.SessionEventsParams{SessionKey: m.GetSessionKey(), MaxRows: maxCacheEvents}
	var err error
	if p.Since, p.Until, err = timeRange(m.GetSince(), m.GetUntil(), u.now()); err != nil {
		return nil, err
	}
	if ref := m.GetKey(); ref != "" {
		k, err := u.findKey(ctx, ref)
		if err != nil {
			return nil, err
		}
		p.KeyID = uuid.NullUUID{UUID: k.ID, Valid: true}
	}
	rows, err := u.q.SessionEvents(ctx, p)
	if err != nil {
		return nil, err
	}
	sessions := map[string][]cacheEvent{}
	for _, r := range rows {
		attempts, err := decodeAttempts(r.AttemptsJson)
		if err != nil {
			return nil, err
		}
		sessions[r.SessionKey] = append(sessions[r.SessionKey], cacheEvent{requestID: r.RequestID, key: r.KeyID.UUID,
			account: r.AccountID.UUID, openAI: r.Surface != "messages", at: r.StartedAt, status: r.Status,
			input: r.InputTokens, cacheRead: r.CacheReadTokens, cacheCreation: r.CacheCreationTokens,
			holds: r.HoldCount, attempts: attempts})
	}
	names, err := u.names(ctx)
	if err != nil {
		return nil, err
	}
	label := func(id uuid.UUID) string {
		if l := names.accounts[id]; l != "" {
			return l
		}
		if id == uuid.Nil {
			return "no account"
		}
		return id.String()
	}
	out := explainSessions(sessions, names.keys, u.sessionTTL, label)
	if len(out) > limit {
		out = out[:limit]
	}
	return connect.NewResponse(&weirv1.ExplainCacheResponse{Sessions: out}), nil
}
