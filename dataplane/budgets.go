package dataplane

import (
	"cmp"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/pricing"
	"github.com/weirhq/weir/internal/vocab"
)

// spend is tokens and nano-dollars.
type spend struct{ tokens, nano int64 }

// ledger is what this worker's finished requests of budgeted keys spent
// that the control plane may not have stored yet: their route events are
// on their way (the reporter's outbox). Acquire counts each it has not
// stored with what it has (AcquireRequest.unreported), so that a budget
// holds across every worker to within the requests in flight. An entry
// leaves when its event's batch is taken, or after ledgerTTL (an event
// the outbox dropped is spent the control plane never learns of:
// counting it here for ever would refuse the key for nothing).
type ledger struct {
	mu      sync.Mutex
	now     func() time.Time
	pending map[string]ledgerEntry
}

// ledgerTTL bounds how long an unreported spend is counted: far longer
// than a report takes while the control plane is up. maxUnreported
// bounds what one Acquire carries.
const (
	ledgerTTL     = 2 * time.Minute
	maxUnreported = 1000
)

type ledgerEntry struct {
	key, team, session string
	spent              spend
	at                 time.Time
}

func newLedger(now func() time.Time) *ledger {
	return &ledger{now: now, pending: map[string]ledgerEntry{}}
}

// add counts a finished request's spend until its event is taken.
func (l *ledger) add(requestID, key, team, session string, s spend) {
	if s.tokens == 0 && s.nano == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending[requestID] = ledgerEntry{key: key, team: team, session: session, spent: s, at: l.now()}
}

// settle forgets the requests whose events the control plane took.
func (l *ledger) settle(requestIDs []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range requestIDs {
		delete(l.pending, id)
	}
}

// unreported is the spend Acquire adds to the stored spend for a request
// of key (in team, session): each entry of the key or its team, with the
// scopes it counts in.
func (l *ledger) unreported(key, team, session string) *weirv1.UnreportedSpend {
	l.mu.Lock()
	defer l.mu.Unlock()
	cutoff := l.now().Add(-ledgerTTL)
	out := &weirv1.UnreportedSpend{}
	for id, e := range l.pending {
		if e.at.Before(cutoff) {
			delete(l.pending, id)
			continue
		}
		sameKey, sameTeam := e.key == key, team != "" && e.team == team
		if (!sameKey && !sameTeam) || len(out.Requests) >= maxUnreported {
			continue
		}
		out.Requests = append(out.Requests, &weirv1.UnreportedRequest{RequestId: id, Tokens: e.spent.tokens,
			NanoUsd: e.spent.nano, Key: sameKey, Team: sameTeam, Session: sameKey && session != "" && e.session == session})
	}
	return out
}

// noteSpend puts what a budgeted request's attempt has spent so far in
// the ledger before the client has the answer: a client that sends its
// next request the moment this one's answer ends must find it counted
// (Acquire adds the ledger's unreported spend). The request's whole
// spend replaces it when the request ends.
func (s *Server) noteSpend(in *inbound, model string, u *weirv1.TokenUsage) {
	if !in.budgeted || u == nil {
		return
	}
	s.ledger.add(in.requestID, in.keyID, in.team, in.session, usageSpend(s.settings.get().prices, model, u))
}

// requestSpend is a finished request's spend: every token its attempts
// reported, priced by the model each was sent as.
func requestSpend(tab *pricing.Table, rec *weirv1.RouteEvent) spend {
	var s spend
	for _, a := range rec.GetAttemptRecords() {
		if u := a.GetUsage(); u != nil {
			as := usageSpend(tab, cmp.Or(a.GetModel(), rec.GetModel()), u)
			s.tokens += as.tokens
			s.nano += as.nano
		}
	}
	return s
}

// usageSpend is one attempt's usage: every token, priced as model.
func usageSpend(tab *pricing.Table, model string, u *weirv1.TokenUsage) spend {
	nano, _ := tab.Cost(model, pricing.Usage{InputTokens: u.GetInputTokens(), OutputTokens: u.GetOutputTokens(),
		CacheReadTokens: u.GetCacheReadTokens(), CacheCreationTokens: u.GetCacheCreationTokens()})
	return spend{tokens: u.GetInputTokens() + u.GetOutputTokens() + u.GetCacheReadTokens() + u.GetCacheCreationTokens(), nano: nano}
}

// priceTable is the shipped table under the operator's prices.
func priceTable(prices []*weirv1.ModelPrice) *pricing.Table {
	entries := make([]pricing.Entry, 0, len(prices))
	for _, p := range prices {
		entries = append(entries, pricing.Entry{Pattern: p.GetPattern(), Price: pricing.Price{Input: p.GetInputUsd(),
			Output: p.GetOutputUsd(), CacheRead: p.GetCacheReadUsd(), CacheWrite: p.GetCacheWriteUsd()}})
	}
	return pricing.NewTable(entries)
}

// failBudget answers a request over a budget: a final 429 in the
// client's own format naming the budget and when it resets
// (X-Should-Retry: false). On Responses it is Codex's usage-limit form,
// so that Codex stops and shows the reset.
func (s *Server) failBudget(w http.ResponseWriter, rt *routing, b *weirv1.BudgetBlock, message string) {
	rt.rec.FailureStage = weirv1.FailureStage_FAILURE_STAGE_BEFORE_OUTPUT
	rt.rec.ErrorType = "budget_exceeded"
	rt.rec.Verdict = message
	rt.in.outcome = outcomeBudget
	writeBudgetLimit(w, rt.in.sf, rt.in.requestID, b, message, s.cfg.Now())
}

// writeBudgetLimit writes a budget refusal. Nothing may have been
// written to w before.
func writeBudgetLimit(w http.ResponseWriter, sf surface, requestID string, b *weirv1.BudgetBlock, message string, now time.Time) {
	h := w.Header()
	h.Del("Retry-After")
	h.Set("Content-Type", "application/json")
	h.Set("X-Should-Retry", "false")
	detail := map[string]any{"scope": b.GetScope(), "name": b.GetScopeName(), "spent": b.GetSpent(),
		"limit": b.GetLimit().GetAmount(), "unit": vocab.Name(b.GetLimit().GetUnit()), "period": vocab.Name(b.GetLimit().GetPeriod())}
	var resets time.Time
	if r := b.GetResetsAt(); r != nil {
		resets = r.AsTime()
		detail["resets_at"] = resets.Unix()
	}
	var body []byte
	switch sf.api {
	case weirv1.Surface_SURFACE_RESPONSES:
		e := map[string]any{"type": "usage_limit_reached", "code": "budget_exceeded", "message": message,
			"param": nil, "retryable": false, "budget": detail}
		if !resets.IsZero() {
			wait := resets.Sub(now).Round(time.Second)
			e["resets_at"], e["reset_seconds"], e["reset_time"] = resets.Unix(), int64(wait/time.Second), wait.String()
		}
		body, _ = json.Marshal(map[string]any{"error": e})
	case weirv1.Surface_SURFACE_CHAT_COMPLETIONS:
		body, _ = json.Marshal(map[string]any{"error": map[string]any{"type": "insufficient_quota", "code": "budget_exceeded",
			"message": message, "param": nil, "budget": detail}})
	default:
		body, _ = json.Marshal(map[string]any{"type": "error", "request_id": requestID,
			"error": map[string]any{"type": "rate_limit_error", "message": message, "retryable": false, "budget": detail}})
	}
	w.WriteHeader(http.StatusTooManyRequests)
	w.Write(body)                         //nolint:errcheck // the client may be gone
	http.NewResponseController(w).Flush() //nolint:errcheck // as above
}
