package dashboard

import (
	"cmp"
	"html/template"
	"net/http"
	"slices"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// The prompt cache page: ExplainCache per session over a range, each
// session's misses with their causes, and the causes summed per key.

// cacheSessions is how many sessions the page asks for, those with the
// most uncached input first; up to openSessions of them show their
// misses at once, more fold to a line each.
const (
	cacheSessions = 100
	openSessions  = 10
)

// causeOrder is the order causes are shown in; others follow by name.
var causeOrder = []string{"moved", "expired", "prefix_changed"}

type cacheQuery struct {
	timeRange
	// Key (a name or id) and Session narrow the sessions.
	Key, Session string
}

// Query is the whole query as a query string (safe in an href).
func (c cacheQuery) Query() template.URL {
	v := c.values()
	if c.Key != "" {
		v.Set("key", c.Key)
	}
	if c.Session != "" {
		v.Set("session", c.Session)
	}
	return template.URL(v.Encode()) //nolint:gosec // url.Values encoded it
}

// WithRange is the query with another preset range.
func (c cacheQuery) WithRange(name string) template.URL {
	c.Range = name
	return c.Query()
}

// ForKey is the range's query narrowed to one key.
func (c cacheQuery) ForKey(key string) template.URL {
	c.Key, c.Session = key, ""
	return c.Query()
}

// ForSession is the range's query narrowed to one session.
func (c cacheQuery) ForSession(session string) template.URL {
	c.Key, c.Session = "", session
	return c.Query()
}

type cacheData struct {
	Q     cacheQuery
	Error string
	// Unavailable: the control plane does not answer ExplainCache.
	Unavailable bool
	From, To    string
	Keys        []keyCacheView
	Sessions    []sessionCacheView
	// Limit is how many sessions were asked for; Truncated, that many came.
	Limit     int
	Truncated bool
}

// Open: the sessions show their misses unfolded (one asked for, or few).
func (d cacheData) Open() bool { return d.Q.Session != "" || len(d.Sessions) <= openSessions }

// Tabs is the usage pages' navigation from this page.
func (d cacheData) Tabs() tabs { return tabs{Tab: "cache", Query: d.Q.RangeQuery()} }

type causeCount struct {
	Cause string
	N     int32
}

type sessionCacheView struct {
	SessionKey, Key, KeyRef                 string
	First, Last                             string
	Requests, Input, CacheRead, CacheCreate int64
	Hit                                     float64
	Causes                                  []causeCount
	Misses                                  []missView
	// MissCount counts every miss (the list holds at most the RPC's bound).
	MissCount int32
}

type missView struct {
	RequestID, At, Cause, CauseClass, Why, Account, Previous, Gap string
	Uncached                                                      int64
}

// keyCacheView is one key's sessions summed.
type keyCacheView struct {
	Key, KeyRef                   string
	Sessions                      int
	Requests, cacheRead, all      int64
	Moved, Expired, Prefix, Other int32
	Uncached                      int64
}

// Hit is the key's cache reads over all its input.
func (k keyCacheView) Hit() float64 {
	if k.all == 0 {
		return 0
	}
	return float64(k.cacheRead) / float64(k.all)
}

func (h *Handler) cachePage(w http.ResponseWriter, r *http.Request, s session) {
	q := r.URL.Query()
	c := cacheQuery{Key: strings.TrimSpace(q.Get("key")), Session: strings.TrimSpace(q.Get("session"))}
	var err error
	c.timeRange, err = parseRange(q, h.cfg.Now(), "24h")
	d := cacheData{Q: c, Limit: cacheSessions}
	page := func(status int) {
		h.render(w, r, status, "cache", view{Title: "Prompt cache", Nav: "usage", CSRF: s.csrf, Role: s.role, Data: d})
	}
	if err != nil {
		d.Error = err.Error()
		page(http.StatusBadRequest)
		return
	}
	d.From, d.To = c.fmtIn(c.Since, "2006-01-02 15:04"), c.fmtIn(c.Until, "2006-01-02 15:04")
	res, err := h.cfg.Usage.ExplainCache(r.Context(), connect.NewRequest(&weirv1.ExplainCacheRequest{
		Key: c.Key, SessionKey: c.Session, Since: timestamppb.New(c.Since), Until: timestamppb.New(c.Until), Limit: cacheSessions}))
	switch connect.CodeOf(err) {
	case connect.CodeUnimplemented:
		d.Unavailable = true
		page(http.StatusOK)
		return
	case connect.CodeInvalidArgument, connect.CodeNotFound:
		d.Error = rpcMessage(err)
		page(http.StatusBadRequest)
		return
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	d.Truncated = len(res.Msg.Sessions) >= cacheSessions
	byKey := map[string]*keyCacheView{}
	var keyOrder []string
	for _, sc := range res.Msg.Sessions {
		v := sessionView(sc, c)
		d.Sessions = append(d.Sessions, v)
		kv := byKey[v.KeyRef]
		if kv == nil {
			kv = &keyCacheView{Key: v.Key, KeyRef: v.KeyRef}
			byKey[v.KeyRef] = kv
			keyOrder = append(keyOrder, v.KeyRef)
		}
		kv.Sessions++
		kv.Requests += sc.Requests
		kv.cacheRead += sc.CacheReadTokens
		kv.all += sc.InputTokens + sc.CacheReadTokens + sc.CacheCreationTokens
		for cause, n := range sc.Causes {
			switch cause {
			case "moved":
				kv.Moved += n
			case "expired":
				kv.Expired += n
			case "prefix_changed":
				kv.Prefix += n
			default:
				kv.Other += n
			}
		}
		for _, m := range sc.Misses {
			kv.Uncached += m.UncachedInputTokens
		}
	}
	for _, k := range keyOrder {
		d.Keys = append(d.Keys, *byKey[k])
	}
	slices.SortStableFunc(d.Keys, func(a, b keyCacheView) int { return cmp.Compare(b.Uncached, a.Uncached) })
	page(http.StatusOK)
}

func sessionView(sc *weirv1.SessionCache, c cacheQuery) sessionCacheView {
	v := sessionCacheView{SessionKey: sc.SessionKey, Key: cmp.Or(sc.KeyName, sc.KeyId, "(no key)"), KeyRef: cmp.Or(sc.KeyName, sc.KeyId),
		Requests: sc.Requests, Input: sc.InputTokens, CacheRead: sc.CacheReadTokens, CacheCreate: sc.CacheCreationTokens,
		Hit: sc.CacheHitRatio}
	if sc.FirstAt != nil {
		v.First = c.fmtIn(sc.FirstAt.AsTime(), "2006-01-02 15:04:05")
	}
	if sc.LastAt != nil {
		v.Last = c.fmtIn(sc.LastAt.AsTime(), "2006-01-02 15:04:05")
	}
	for cause, n := range sc.Causes {
		v.Causes = append(v.Causes, causeCount{Cause: cause, N: n})
		v.MissCount += n
	}
	slices.SortFunc(v.Causes, func(a, b causeCount) int {
		return cmp.Or(cmp.Compare(causeRank(a.Cause), causeRank(b.Cause)), cmp.Compare(a.Cause, b.Cause))
	})
	for i := range v.Causes {
		v.Causes[i].Cause = causeText(v.Causes[i].Cause)
	}
	if v.MissCount < int32(len(sc.Misses)) {
		v.MissCount = int32(len(sc.Misses))
	}
	for _, m := range sc.Misses {
		mv := missView{RequestID: m.RequestId, Cause: causeText(m.Cause), CauseClass: strings.ReplaceAll(m.Cause, "_", "-"), Why: m.Why,
			Account:  cmp.Or(m.AccountLabel, m.AccountId, "-"),
			Previous: cmp.Or(m.PreviousAccountLabel, m.PreviousAccountId, "-"),
			Gap:      durText(m.Gap), Uncached: m.UncachedInputTokens}
		if m.StartedAt != nil {
			mv.At = c.fmtIn(m.StartedAt.AsTime(), "2006-01-02 15:04:05")
		}
		v.Misses = append(v.Misses, mv)
	}
	return v
}

func causeRank(cause string) int {
	if i := slices.Index(causeOrder, cause); i >= 0 {
		return i
	}
	return len(causeOrder)
}

// causeText is a miss's cause for people: prefix_changed as "prefix
// changed".
func causeText(cause string) string {
	if cause == "" {
		return "-"
	}
	return strings.ReplaceAll(cause, "_", " ")
}
