package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

const (
	// CodexUsagePath is a Codex account's usage endpoint, under its base
	// URL (https://chatgpt.com/backend-api by default).
	CodexUsagePath = "/wham/usage"
	// CodexTokenURL refreshes ChatGPT logins (Codex accounts).
	CodexTokenURL = "https://auth.openai.com/oauth/token"
	// CodexClientID is Codex CLI's public OAuth client id.
	CodexClientID = "app_EMoamEEZ73f0CkXaXp7hrann"
	// CodexTokenPath is the Codex token endpoint under the scheme and host
	// of a Codex account's base URL override (the simulator serves it
	// there, beside /backend-api).
	CodexTokenPath = "/oauth/token"
	// codexTokenScope is the scope Codex CLI asks for on a refresh.
	codexTokenScope = "openid profile email"
)

// ReadCodexUsage GETs a ChatGPT login's Codex usage endpoint under base
// (the account's base URL) with its access token and ChatGPT account id;
// now is the clock the answer is read by (a reset may come as seconds
// from now). Errors as ReadAnthropicUsage's.
func ReadCodexUsage(ctx context.Context, client *http.Client, base, token, accountID string, now func() time.Time) ([]Reading, time.Duration, error) {
	body, wait, err := getUsage(ctx, client, base+CodexUsagePath, token, map[string]string{"chatgpt-account-id": accountID})
	if err != nil {
		return nil, wait, err
	}
	readings, err := parseCodexUsage(body, now())
	return readings, 0, err
}

// CodexTokenURLUnder is the token endpoint of a Codex account whose base
// URL is base: at its scheme and host; false when base is no URL.
func CodexTokenURLUnder(base string) (string, bool) {
	u, err := url.Parse(base)
	if err != nil {
		return "", false
	}
	return u.Scheme + "://" + u.Host + CodexTokenPath, true
}

// codexWindowJSON is one window of the Codex usage endpoint's answer.
type codexWindowJSON struct {
	// UsedPercent is a percent, 0..100.
	UsedPercent        *float64 `json:"used_percent"`
	LimitWindowSeconds *int64   `json:"limit_window_seconds"`
	ResetAfterSeconds  *int64   `json:"reset_after_seconds"`
	// ResetAt is in Unix seconds.
	ResetAt *int64 `json:"reset_at"`
}

// parseCodexUsage reads the Codex usage endpoint's answer, read at now:
// rate_limit.primary_window and secondary_window, either of which may be
// null, named by their length (codexWindow).
func parseCodexUsage(body []byte, now time.Time) ([]Reading, error) {
	var doc struct {
		RateLimit *struct {
			Primary   *codexWindowJSON `json:"primary_window"`
			Secondary *codexWindowJSON `json:"secondary_window"`
		} `json:"rate_limit"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, errors.New("usage endpoint: answer is not a Codex usage object")
	}
	if doc.RateLimit == nil {
		return nil, nil
	}
	var out []Reading
	for i, w := range []*codexWindowJSON{doc.RateLimit.Primary, doc.RateLimit.Secondary} {
		if w == nil {
			continue
		}
		var minutes int64
		if w.LimitWindowSeconds != nil {
			minutes = *w.LimitWindowSeconds / 60
		}
		r := Reading{Window: codexWindow(i == 0, minutes), Utilization: percentFraction(w.UsedPercent)}
		switch {
		case w.ResetAt != nil && *w.ResetAt > 0:
			t := time.Unix(*w.ResetAt, 0).UTC()
			r.ResetsAt = &t
		case w.ResetAfterSeconds != nil && *w.ResetAfterSeconds >= 0:
			t := now.Add(time.Duration(*w.ResetAfterSeconds) * time.Second).UTC()
			r.ResetsAt = &t
		}
		if (r.Utilization == nil && r.ResetsAt == nil) || slices.ContainsFunc(out, func(o Reading) bool { return o.Window == r.Window }) {
			continue
		}
		out = append(out, r)
	}
	// In Windows order, as every reading comes.
	slices.SortFunc(out, func(a, b Reading) int {
		return slices.Index(Windows, a.Window) - slices.Index(Windows, b.Window)
	})
	return out, nil
}

// codexWindow names a Codex rate-limit window by its length: 300 minutes
// is the five_hour window and 10080 the seven_day one; a length weir does
// not know goes by position (primary five_hour, secondary seven_day).
func codexWindow(primary bool, minutes int64) string {
	switch {
	case minutes == 300:
		return FiveHour
	case minutes == 10080:
		return SevenDay
	case primary:
		return FiveHour
	}
	return SevenDay
}

// codexHeaderReadings reads x-codex-{primary,secondary}-used-percent (a
// percent 0..100), -window-minutes and -reset-at (Unix seconds). A window
// counts only when its percent is within 0..100 and its reset is after
// now; it is named by its length (codexWindow). Codex sends no status: a
// spent window's 100 is a reading like any other.
func codexHeaderReadings(h map[string]string, now time.Time) []Reading {
	var out []Reading
	for _, name := range []string{"primary", "secondary"} {
		prefix := "x-codex-" + name + "-"
		p, err := strconv.ParseFloat(strings.TrimSpace(h[prefix+"used-percent"]), 64)
		if err != nil || math.IsNaN(p) || p < 0 || p > 100 {
			continue
		}
		secs, err := strconv.ParseInt(strings.TrimSpace(h[prefix+"reset-at"]), 10, 64)
		if err != nil {
			continue
		}
		reset := time.Unix(secs, 0).UTC()
		if !reset.After(now) {
			continue
		}
		minutes, _ := strconv.ParseInt(strings.TrimSpace(h[prefix+"window-minutes"]), 10, 64)
		w := codexWindow(name == "primary", minutes)
		if slices.ContainsFunc(out, func(r Reading) bool { return r.Window == w }) {
			continue
		}
		u := p / 100
		out = append(out, Reading{Window: w, Utilization: &u, ResetsAt: &reset})
	}
	return out
}

// RefreshCodex spends a ChatGPT login's refresh token at tokenURL for new
// tokens, as Codex CLI does: JSON with clientID, the grant, the refresh
// token and its scope. Errors as refreshTokens'.
func RefreshCodex(ctx context.Context, client *http.Client, tokenURL, clientID, refresh string) (Tokens, error) {
	body, _ := json.Marshal(map[string]string{
		"client_id":     clientID,
		"grant_type":    "refresh_token",
		"refresh_token": refresh,
		"scope":         codexTokenScope,
	})
	return refreshTokens(ctx, client, tokenURL, body, refresh)
}
