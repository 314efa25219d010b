package dataplane

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"connectrpc.com/connect"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/vocab"
)

// usageLimitMinWait: a pool that reopens within this is answered
// retryably, since a client's ordinary retries will find it open. Exactly
// 5:00 stays retryable; 5:01 is a usage limit.
const usageLimitMinWait = 5 * time.Minute

// usageLimit is a pool out of quota as the client hears of it: the final
// answer in the usage_limit mode (usageLimitBody), and the cause of the
// retryable mode's quota error (quotaError).
type usageLimit struct {
	model     string
	provider  weirv1.Provider
	kind      weirv1.QuotaKind
	resetsAt  time.Time // zero: no blocked account has a known reset
	window    int32     // minutes; 0 when unknown
	lastError string
	// accounts are the blocked accounts, noReset those without a known
	// reset.
	accounts, noReset int32
	// wait is how long until resetsAt, in whole seconds rounded up.
	wait time.Duration
}

// usageLimitOf reads a quota block.
func usageLimitOf(qb *weirv1.QuotaBlock, model string, now time.Time) usageLimit {
	ul := usageLimit{model: model, provider: qb.GetProvider(), kind: qb.GetKind(), window: qb.GetWindowMinutes(),
		lastError: qb.GetLastUpstreamError(), accounts: qb.GetAccounts(), noReset: qb.GetAccountsWithoutReset()}
	if r := qb.GetResetsAt(); r != nil {
		ul.resetsAt = r.AsTime()
		ul.wait = ul.resetsAt.Sub(now).Round(time.Second)
	}
	return ul
}

// known says whether the pool's first reset is known.
func (ul usageLimit) known() bool { return !ul.resetsAt.IsZero() }

// cause says what the pool is out of, and when that ends: "out of usage
// quota; the first resets in 2h0m0s, at …", or for a pool with no known
// reset, what brings it back.
func (ul usageLimit) cause() string {
	if ul.known() {
		return fmt.Sprintf("out of usage quota; the first resets in %s, at %s", ul.resetTime(), ul.resetsAt.UTC().Format(time.RFC3339))
	}
	switch ul.kind {
	case weirv1.QuotaKind_QUOTA_KIND_OPENAI_INSUFFICIENT_QUOTA, weirv1.QuotaKind_QUOTA_KIND_ANTHROPIC_OUT_OF_CREDITS:
		return "out of credits; an operator must add credits"
	}
	return "out of usage quota and the upstream named no reset; an operator must look at them"
}

// resetTime is the wait as a duration string ("2h0m0s").
func (ul usageLimit) resetTime() string { return ul.wait.Truncate(time.Second).String() }

// usageLimitFor says whether a request that could not be served gets a
// final usage limit: in the usage_limit mode (as the control plane said
// when it answered, else this worker's last settings), when every eligible
// account is blocked by quota evidence and the first reset is more than
// usageLimitMinWait away, or none is known.
func (s *Server) usageLimitFor(in *inbound, none *weirv1.NoAccount) (usageLimit, bool) {
	mode := none.GetQuotaResponseMode()
	if mode == weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_UNSPECIFIED {
		mode = s.settings.get().quotaMode
	}
	return decideUsageLimit(mode, none.GetQuotaBlock(), in.model, s.cfg.Now())
}

// decideUsageLimit is usageLimitFor's rule. Pure.
func decideUsageLimit(mode weirv1.QuotaResponseMode, qb *weirv1.QuotaBlock, model string, now time.Time) (usageLimit, bool) {
	if mode != weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT || qb == nil {
		return usageLimit{}, false
	}
	ul := usageLimitOf(qb, model, now)
	if ul.known() && ul.resetsAt.Sub(now) <= usageLimitMinWait {
		return usageLimit{}, false
	}
	return ul, true
}

// recoversBy says whether a pool out of quota reopens by t: its first
// reset is known and not after t.
func recoversBy(qb *weirv1.QuotaBlock, t time.Time) bool {
	return qb.GetResetsAt() != nil && !qb.GetResetsAt().AsTime().After(t)
}

// quotaError is the retryable mode's answer for a pool out of quota: a
// 429 in the client's own words for a spent quota (Anthropic
// rate_limit_error; on Responses, Codex's usage_limit_reached; on Chat
// Completions, OpenAI's insufficient_quota), never "overloaded". It says
// retry (X-Should-Retry: true) only when the first reset comes by
// retryBy, and carries a Retry-After only when a reset is known.
func quotaError(qb *weirv1.QuotaBlock, sf surface, model string, now, retryBy time.Time) *apiError {
	ul := usageLimitOf(qb, model, now)
	e := &apiError{status: http.StatusTooManyRequests, typ: "rate_limit_error",
		message: fmt.Sprintf("weir: all %d accounts that serve model %s are %s. Last upstream error: %s",
			ul.accounts, model, ul.cause(), orNone(ul.lastError)),
		final: !recoversBy(qb, retryBy)}
	switch sf.api {
	case weirv1.Surface_SURFACE_RESPONSES:
		e.openAIType, e.code = "usage_limit_reached", "usage_limit_reached"
	case weirv1.Surface_SURFACE_CHAT_COMPLETIONS:
		e.openAIType, e.code = "insufficient_quota", "insufficient_quota"
	}
	if ul.known() {
		e.retryAfter = max(ul.resetsAt.Sub(now), time.Second)
	}
	return e
}

// orNone is s, or "none recorded" when it is empty.
func orNone(s string) string {
	if s == "" {
		return "none recorded"
	}
	return s
}

// failUsageLimit answers the final usage limit.
func (s *Server) failUsageLimit(w http.ResponseWriter, rt *routing, ul usageLimit) {
	rt.rec.FailureStage = weirv1.FailureStage_FAILURE_STAGE_BEFORE_OUTPUT
	rt.rec.ErrorType = "usage_limit_reached"
	rt.in.outcome = outcomeUsageLimit
	s.metrics.usageLimits.WithLabelValues(rt.in.sf.name).Inc()
	writeUsageLimit(w, rt.in.sf, rt.in.requestID, ul)
}

// writeUsageLimit writes a final usage limit in the client's format:
// status 429, X-Should-Retry: false, no Retry-After, the Codex rate-limit
// headers of the exhausted window (when its reset is known), and the reset
// in the body (when known). Nothing may have been written to w before.
func writeUsageLimit(w http.ResponseWriter, sf surface, requestID string, ul usageLimit) {
	h := w.Header()
	h.Del("Retry-After")
	h.Set("Content-Type", "application/json")
	h.Set("X-Should-Retry", "false")
	if ul.window > 0 && ul.known() {
		// The window that reopens first, at 100%: the primary trio for a
		// window shorter than a day, the secondary for the weekly one.
		prefix := "X-Codex-Secondary-"
		if ul.window < 24*60 {
			prefix = "X-Codex-Primary-"
		}
		h.Set(prefix+"Used-Percent", "100")
		h.Set(prefix+"Window-Minutes", strconv.Itoa(int(ul.window)))
		h.Set(prefix+"Reset-At", strconv.FormatInt(ul.resetsAt.Unix(), 10))
	}
	body := usageLimitBody(sf, requestID, ul)
	w.WriteHeader(http.StatusTooManyRequests)
	w.Write(body)                         //nolint:errcheck // the client may be gone
	http.NewResponseController(w).Flush() //nolint:errcheck // as above
}

// finishTerminal ends a stream that the quota cut after output. In the
// usage_limit mode (as the control plane says now), when the whole pool is now blocked by quota with the
// first reset more than usageLimitMinWait away, the terminal event carries
// the usage limit's metadata (the same as the HTTP answer's), so that the
// client pauses the thread until the reset; otherwise the upstream's own
// event goes out as it came.
func (s *Server) finishTerminal(ctx context.Context, w http.ResponseWriter, in *inbound, raw []byte) {
	out := raw
	// The control plane answers with the mode in force now: a change
	// applies here as on the next request, without waiting for a poll.
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	resp, err := s.leases.PoolQuota(qctx, connect.NewRequest(&weirv1.PoolQuotaRequest{
		KeyHash: in.keyHash, Model: in.model, Surface: in.sf.api}))
	cancel()
	if err != nil {
		s.cfg.Logger.WarnContext(ctx, "pool quota failed", "request_id", in.requestID, "err", err)
	} else if ul, ok := decideUsageLimit(resp.Msg.GetQuotaResponseMode(), resp.Msg.GetQuotaBlock(), in.model, s.cfg.Now()); ok {
		out = usageLimitEvent(in.sf, in.requestID, ul)
		s.metrics.usageLimits.WithLabelValues(in.sf.name).Inc()
	}
	w.Write(out)                          //nolint:errcheck // the client may be gone
	http.NewResponseController(w).Flush() //nolint:errcheck // as above
}

// usageLimitEvent is a usage limit as a stream's terminal event.
func usageLimitEvent(sf surface, requestID string, ul usageLimit) []byte {
	body := usageLimitBody(sf, requestID, ul)
	switch sf.api {
	case weirv1.Surface_SURFACE_RESPONSES:
		var e struct {
			Error map[string]any `json:"error"`
		}
		json.Unmarshal(body, &e) //nolint:errcheck // our own JSON
		b, _ := json.Marshal(map[string]any{"type": "response.failed",
			"response": map[string]any{"status": "failed", "error": e.Error}})
		return []byte("event: response.failed\ndata: " + string(b) + "\n\n")
	case weirv1.Surface_SURFACE_CHAT_COMPLETIONS:
		return []byte("data: " + string(body) + "\n\n")
	}
	return []byte("event: error\ndata: " + string(body) + "\n\n")
}

// usageLimitBody is a usage limit's error body in the surface's format.
// The OpenAI form is the one Codex stops on (type usage_limit_reached,
// resets_at); a pool with no known reset has no reset fields at all,
// rather than a made-up one.
func usageLimitBody(sf surface, requestID string, ul usageLimit) []byte {
	provider := providerName(ul.provider)
	last := orNone(ul.lastError)
	if sf.wire == wireOpenAI {
		e := map[string]any{
			"message":              fmt.Sprintf("All credentials for model %s (%s) are %s. Last upstream error: %s", ul.model, provider, ul.cause(), last),
			"type":                 "usage_limit_reached",
			"code":                 "model_cooldown",
			"param":                nil,
			"retryable":            false,
			"limit_window_minutes": ul.window,
			"model":                ul.model,
			"provider":             provider,
			"last_upstream_error":  ul.lastError,
		}
		if ul.known() {
			e["resets_at"] = ul.resetsAt.Unix()
			e["reset_seconds"] = int64(ul.wait / time.Second)
			e["reset_time"] = ul.resetTime()
		}
		body, _ := json.Marshal(map[string]any{"error": e})
		return body
	}
	e := map[string]any{"type": "rate_limit_error", "retryable": false}
	if ul.known() {
		e["message"] = fmt.Sprintf("All credentials for model %s (%s) are out of usage quota. Last upstream error: %s (reset after %s)",
			ul.model, provider, last, ul.resetTime())
		e["resets_at"] = ul.resetsAt.Unix()
	} else {
		e["message"] = fmt.Sprintf("All credentials for model %s (%s) are %s. Last upstream error: %s", ul.model, provider, ul.cause(), last)
	}
	body, _ := json.Marshal(map[string]any{"type": "error", "error": e, "request_id": requestID})
	return body
}

// providerName is a provider's short name ("anthropic", "codex"), or
// "unknown" for none.
func providerName(p weirv1.Provider) string {
	if p == weirv1.Provider_PROVIDER_UNSPECIFIED {
		return "unknown"
	}
	return vocab.Name(p)
}

// CORS: browsers may read weir's answers from any origin (clients
// authenticate with a bearer key, never a cookie). In the usage_limit mode
// the headers that carry the verdict are exposed as well.
var (
	exposeHeaders           = "Weir-Request-Id, Request-Id, X-Request-Id, Retry-After"
	exposeUsageLimitHeaders = exposeHeaders + ", X-Should-Retry, " +
		"X-Codex-Primary-Used-Percent, X-Codex-Primary-Window-Minutes, X-Codex-Primary-Reset-At, " +
		"X-Codex-Secondary-Used-Percent, X-Codex-Secondary-Window-Minutes, X-Codex-Secondary-Reset-At"
)

// cors sets the CORS response headers of a request that came with an
// Origin.
func (s *Server) cors(h http.Header, r *http.Request) {
	if r.Header.Get("Origin") == "" {
		return
	}
	h.Set("Access-Control-Allow-Origin", "*")
	if s.settings.get().quotaMode == weirv1.QuotaResponseMode_QUOTA_RESPONSE_MODE_USAGE_LIMIT {
		h.Set("Access-Control-Expose-Headers", exposeUsageLimitHeaders)
	} else {
		h.Set("Access-Control-Expose-Headers", exposeHeaders)
	}
}
