// Package upstream speaks to the upstream providers' account endpoints on
// the control plane's behalf: it reads an OAuth account's usage (Anthropic's
// /api/oauth/usage, Codex's /wham/usage) and the usage headers of their
// responses, and refreshes OAuth tokens at each provider's token endpoint.
// It knows nothing of the database: the control plane hands it an
// account's address and tokens and stores what comes back.
//
// One package with a file per provider, not a package each: the two
// providers differ in a path, a header, a request body and a parser, while
// the call, the readings, the error classes and the scrubbing of tokens
// out of errors are the same code.
package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Usage window names, as the usage endpoints and headers are read into
// them, in the one order readings come in.
const (
	FiveHour          = "five_hour"
	SevenDay          = "seven_day"
	SevenDayOAuthApps = "seven_day_oauth_apps"
	SevenDayOpus      = "seven_day_opus"
	SevenDaySonnet    = "seven_day_sonnet"
)

// Windows is every window, in that order.
var Windows = []string{FiveHour, SevenDay, SevenDayOAuthApps, SevenDayOpus, SevenDaySonnet}

// Reading is one window as read.
type Reading struct {
	Window string
	// Utilization is a fraction 0..1; nil means no evidence, never 0.
	Utilization *float64
	ResetsAt    *time.Time
}

const (
	// maxUsageBody bounds what a usage answer may weigh.
	maxUsageBody = 1 << 20
	// maxRetryAfter bounds the retry-after a usage endpoint may ask for.
	maxRetryAfter = 30 * time.Minute
)

// getUsage GETs a usage endpoint with token and the provider's headers,
// and returns the answer's body, or an error without the token in it and
// how long the endpoint asked us to wait (0: it did not say).
func getUsage(ctx context.Context, client *http.Client, target, token string, header map[string]string) ([]byte, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("usage request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		// url.Error names the URL, which carries no secret; the rest is the
		// transport's own words. The token is scrubbed all the same.
		return nil, 0, fmt.Errorf("usage endpoint unreachable: %w", Scrub(transportErr(err), token))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxUsageBody))
	if resp.StatusCode != http.StatusOK {
		return nil, retryAfter(resp.Header.Get("retry-after")), &StatusError{Endpoint: "usage endpoint", Code: resp.StatusCode}
	}
	if err != nil {
		return nil, 0, fmt.Errorf("usage endpoint: read answer: %w", Scrub(err, token))
	}
	return body, 0, nil
}

// StatusError is an endpoint's answer other than 200, by its status
// alone: the body may echo what was sent.
type StatusError struct {
	Endpoint string
	Code     int
}

func (e *StatusError) Error() string { return fmt.Sprintf("%s answered %d", e.Endpoint, e.Code) }

// Rejected says whether the answer refused the credential itself: a 401.
// A 403 may be a token's scope or a key's permissions, not the credential.
func (e *StatusError) Rejected() bool { return e.Code == http.StatusUnauthorized }

// transportErr is a failed call's error without the url.Error around it.
func transportErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// retryAfter reads a retry-after in seconds, at most maxRetryAfter; 0 when
// absent or not seconds.
func retryAfter(v string) time.Duration {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(min(n, int64(maxRetryAfter/time.Second))) * time.Second
}

// percentFraction turns an endpoint's percent into a fraction: above 100
// is spent (1); negative or not a number is no evidence (nil).
func percentFraction(p *float64) *float64 {
	if p == nil || math.IsNaN(*p) || *p < 0 {
		return nil
	}
	f := min(*p/100, 1)
	return &f
}

// HeaderReadings reads the rate-limit headers (lower-cased) of a response
// that arrived at now: Codex's x-codex-{primary,secondary}-*, then
// Anthropic's unified headers. A response carries one provider's or none.
func HeaderReadings(h map[string]string, now time.Time) []Reading {
	return append(codexHeaderReadings(h, now), anthropicHeaderReadings(h, now)...)
}

// Scrub returns err with every occurrence of secret in its text replaced;
// errors.Is and errors.As still see err.
func Scrub(err error, secret string) error { return scrubbed{err, secret} }

// scrubbed is an error whose text never holds the secret.
type scrubbed struct {
	err    error
	secret string
}

func (e scrubbed) Error() string {
	msg := e.err.Error()
	if e.secret != "" {
		msg = strings.ReplaceAll(msg, e.secret, "[credential]")
	}
	return msg
}

func (e scrubbed) Unwrap() error { return e.err }

// TokenShaped says whether s can travel in an HTTP header as a
// credential: 8 to 8192 printable ASCII characters.
func TokenShaped(s string) bool {
	if len(s) < 8 || len(s) > 8192 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
