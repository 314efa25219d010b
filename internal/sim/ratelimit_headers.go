package sim

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

const (
	unifiedPrefix = "anthropic-ratelimit-unified-"
	// warnUtilization is where a window turns allowed_warning.
	warnUtilization = 0.8
	// API-key limits reported in anthropic-ratelimit-* headers.
	requestsLimit     = 4000
	inputTokensLimit  = 2_000_000
	outputTokensLimit = 400_000
)

// setRateLimitHeaders adds the headers a successful response of the
// account carries: the unified family for OAuth, the per-key limits for
// API keys.
func (x *exchange) setRateLimitHeaders() {
	now := x.s.now()
	if x.acct.kind == KindOAuth {
		setUnified(x.w.Header(), now, x.s.unifiedView(x.acct, x.req.Model, now, false), nil)
		return
	}
	setAPIKeyLimits(x.w.Header(), apiKeyUsage{
		requestsRemaining: requestsLimit - 1,
		inputTokens:       x.inputTokens(),
		outputTokens:      x.s.reply.outputTokens,
		reset:             now.Add(time.Minute),
	})
}

// window is one unified rate-limit window as the headers report it.
type window struct {
	key         string // header infix: 5h, 7d, 7d_oi, overage
	claim       string
	utilization float64
	status      string
	reset       time.Time
}

// fiveHourReset and sevenDayReset are the regular window resets the
// simulator reports: on the hour, a while ahead of now.
func fiveHourReset(now time.Time) time.Time { return now.Add(2 * time.Hour).Truncate(time.Hour) }
func sevenDayReset(now time.Time) time.Time { return now.Add(72 * time.Hour).Truncate(time.Hour) }

func allowedStatus(u float64) string {
	if u >= warnUtilization {
		return "allowed_warning"
	}
	return "allowed"
}

// claimKeys maps the claims that have per-window headers to their infix.
var claimKeys = map[string]string{
	ClaimFiveHour:                "5h",
	ClaimSevenDay:                "7d",
	ClaimSevenDayOverageIncluded: "7d_oi",
	ClaimOverage:                 "overage",
}

// setUnified writes the unified headers of an OAuth account: allowed (or
// allowed_warning) from the windows of v, or, with rej, rejected with the
// claimed window at utilization 1.0.
func setUnified(h http.Header, now time.Time, v unifiedView, rej *UnifiedRejection) {
	windows := v.windows

	// Without a rejection the representative claim is the fullest window.
	var rep *window
	for i := range windows {
		if rep == nil || windows[i].utilization > rep.utilization {
			rep = &windows[i]
		}
	}
	status := "allowed"
	if rep != nil {
		status = allowedStatus(rep.utilization)
	}

	if rej != nil {
		reset := now.Add(time.Duration(rej.ResetIn))
		if rej.ResetIn == 0 {
			reset = regularReset(now, rej.Claim, windows)
		}
		rep = &window{claim: rej.Claim, reset: reset}
		status = "rejected"
		if key, ok := claimKeys[rej.Claim]; ok {
			rejected := window{key: key, claim: rej.Claim, utilization: 1, status: "rejected", reset: reset}
			replaced := false
			for i := range windows {
				if windows[i].key == key {
					windows[i], replaced = rejected, true
				}
			}
			if !replaced {
				windows = append(windows, rejected)
			}
		}
	}
	writeUnified(h, status, rep, windows, v.overage)
}

// regularReset is the reset a rejection fault without reset_in claims: the
// claimed window's own reset when the account has it, else the simulator's
// regular reset of five_hour or of a weekly window.
func regularReset(now time.Time, claim string, windows []window) time.Time {
	for _, w := range windows {
		if w.claim == claim {
			return w.reset
		}
	}
	if claim == ClaimFiveHour {
		return fiveHourReset(now)
	}
	return sevenDayReset(now)
}

// setUnifiedRejected writes the unified headers of a request that a full
// live window rejects. The representative claim is the rejecting window
// that resets last, since the request cannot pass before; it is returned.
func setUnifiedRejected(h http.Header, v unifiedView) window {
	var rep *window
	for i, w := range v.windows {
		if w.status == "rejected" && (rep == nil || w.reset.After(rep.reset)) {
			rep = &v.windows[i]
		}
	}
	writeUnified(h, "rejected", rep, v.windows, v.overage)
	return *rep
}

// writeUnified writes the unified header family: the overall status, the
// representative claim and its reset (when there is one), each window's
// status, utilization and reset, and the overage state when scripted.
func writeUnified(h http.Header, status string, rep *window, windows []window, overage *Overage) {
	h.Set(unifiedPrefix+"status", status)
	if rep != nil {
		h.Set(unifiedPrefix+"representative-claim", rep.claim)
		h.Set(unifiedPrefix+"reset", epoch(rep.reset))
	}
	for _, w := range windows {
		h.Set(unifiedPrefix+w.key+"-status", w.status)
		h.Set(unifiedPrefix+w.key+"-utilization", formatUtilization(w.utilization))
		h.Set(unifiedPrefix+w.key+"-reset", epoch(w.reset))
	}
	h.Set(unifiedPrefix+"fallback-percentage", "0.5")
	if overage != nil {
		h.Set(unifiedPrefix+"overage-status", overage.Status)
		if overage.DisabledReason != "" {
			h.Set(unifiedPrefix+"overage-disabled-reason", overage.DisabledReason)
		}
	}
}

// apiKeyUsage is what the per-key limit headers report.
type apiKeyUsage struct {
	requestsRemaining int
	inputTokens       int
	outputTokens      int
	reset             time.Time
}

// setAPIKeyLimits writes anthropic-ratelimit-{requests,tokens,input-tokens,
// output-tokens}-{limit,remaining,reset}, resets in RFC 3339.
func setAPIKeyLimits(h http.Header, u apiKeyUsage) {
	reset := u.reset.UTC().Format(time.RFC3339)
	set := func(name string, limit, remaining int) {
		h.Set("anthropic-ratelimit-"+name+"-limit", strconv.Itoa(limit))
		h.Set("anthropic-ratelimit-"+name+"-remaining", strconv.Itoa(max(0, remaining)))
		h.Set("anthropic-ratelimit-"+name+"-reset", reset)
	}
	set("requests", requestsLimit, u.requestsRemaining)
	set("input-tokens", inputTokensLimit, inputTokensLimit-u.inputTokens)
	set("output-tokens", outputTokensLimit, outputTokensLimit-u.outputTokens)
	set("tokens", inputTokensLimit+outputTokensLimit, inputTokensLimit+outputTokensLimit-u.inputTokens-u.outputTokens)
}

func epoch(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

// formatUtilization writes a fraction the way the real headers do: "0.94",
// "1.0", "0.0".
func formatUtilization(u float64) string {
	s := strconv.FormatFloat(u, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}
