package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

const (
	// AnthropicUsagePath is the usage endpoint, under an account's base URL.
	AnthropicUsagePath = "/api/oauth/usage"
	// AnthropicOAuthBeta is the anthropic-beta value the OAuth endpoints
	// require.
	AnthropicOAuthBeta = "oauth-2025-04-20"
	// AnthropicTokenURL refreshes Claude logins.
	AnthropicTokenURL = "https://platform.claude.com/v1/oauth/token"
	// AnthropicClientID is Claude Code's public OAuth client id.
	AnthropicClientID = "9d1c250a-e61b-44d9-88ed-5944d1962f5e"
	// AnthropicTokenPath is the token endpoint under an account's base URL
	// override (the simulator, a proxy).
	AnthropicTokenPath = "/v1/oauth/token"
)

// AnthropicUsage is what Anthropic's usage endpoint answered.
type AnthropicUsage struct {
	Readings []Reading
	// Body is the answer as it came, for what else the caller reads in it
	// (the banked reset grants, when asked for).
	Body []byte
}

// ReadAnthropicUsage GETs a Claude login's usage endpoint under base (the
// account's base URL) with its access token; with grants, it asks for the
// account's banked reset grants too. The error never holds the token;
// the duration is how long the endpoint asked us to wait (0: it did not
// say).
func ReadAnthropicUsage(ctx context.Context, client *http.Client, base, token string, grants bool) (AnthropicUsage, time.Duration, error) {
	target := base + AnthropicUsagePath
	if grants {
		target += "?include_grants=true"
	}
	body, wait, err := getUsage(ctx, client, target, token, map[string]string{"anthropic-beta": AnthropicOAuthBeta})
	if err != nil {
		return AnthropicUsage{}, wait, err
	}
	readings, err := parseAnthropicUsage(body)
	if err != nil {
		return AnthropicUsage{}, 0, err
	}
	return AnthropicUsage{Readings: readings, Body: body}, 0, nil
}

// anthropicWindowJSON is one window of the usage endpoint's answer.
type anthropicWindowJSON struct {
	// Utilization is a percent, 0..100.
	Utilization *float64 `json:"utilization"`
	ResetsAt    *string  `json:"resets_at"`
}

// parseAnthropicUsage reads the usage endpoint's answer: the windows it
// reports, as fractions, in Windows order. A null window, or one with
// neither a utilization nor a reset, is absent.
func parseAnthropicUsage(body []byte) ([]Reading, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, errors.New("usage endpoint: answer is not a JSON object")
	}
	var out []Reading
	for _, name := range Windows {
		raw, ok := doc[name]
		if !ok {
			continue
		}
		var w *anthropicWindowJSON
		if err := json.Unmarshal(raw, &w); err != nil {
			return nil, fmt.Errorf("usage endpoint: %s: not a window", name)
		}
		if w == nil {
			continue
		}
		r := Reading{Window: name, Utilization: percentFraction(w.Utilization)}
		if w.ResetsAt != nil {
			if t, err := time.Parse(time.RFC3339Nano, *w.ResetsAt); err == nil {
				t = t.UTC()
				r.ResetsAt = &t
			}
		}
		if r.Utilization == nil && r.ResetsAt == nil {
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// anthropicHeaderWindows maps the unified headers' window infixes to
// window names.
var anthropicHeaderWindows = []struct{ infix, window string }{
	{"5h", FiveHour},
	{"7d", SevenDay},
}

// anthropicHeaderReadings reads Anthropic's unified rate-limit headers. A
// window counts only when its status is allowed or allowed_warning (a
// rejection's 1.0 says why this request failed, not how full the window
// is), its utilization is within 0..1, and its reset is after now.
func anthropicHeaderReadings(h map[string]string, now time.Time) []Reading {
	var out []Reading
	for _, hw := range anthropicHeaderWindows {
		prefix := "anthropic-ratelimit-unified-" + hw.infix + "-"
		switch strings.TrimSpace(h[prefix+"status"]) {
		case "allowed", "allowed_warning":
		default:
			continue
		}
		u, err := strconv.ParseFloat(strings.TrimSpace(h[prefix+"utilization"]), 64)
		if err != nil || math.IsNaN(u) || u < 0 || u > 1 {
			continue
		}
		secs, err := strconv.ParseInt(strings.TrimSpace(h[prefix+"reset"]), 10, 64)
		if err != nil {
			continue
		}
		reset := time.Unix(secs, 0).UTC()
		if !reset.After(now) {
			continue
		}
		out = append(out, Reading{Window: hw.window, Utilization: &u, ResetsAt: &reset})
	}
	return out
}

// RefreshAnthropic spends a Claude login's refresh token at tokenURL for
// new tokens, as Claude Code does: JSON with the grant, the refresh token
// and clientID. Errors as refreshTokens'.
func RefreshAnthropic(ctx context.Context, client *http.Client, tokenURL, clientID, refresh string) (Tokens, error) {
	body, _ := json.Marshal(map[string]string{
		"grant_type":    "refresh_token",
		"refresh_token": refresh,
		"client_id":     clientID,
	})
	return refreshTokens(ctx, client, tokenURL, body, refresh)
}
