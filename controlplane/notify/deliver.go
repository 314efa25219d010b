package notify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/weirhq/weir/internal/backoff"
	"github.com/weirhq/weir/internal/randid"
)

// The target kinds, as stored.
const (
	KindWebhook = "webhook"
	KindSlack   = "slack"
)

// Target is a target opened for one delivery. Its URL and Secret are
// secret material: they never reach a log, an error or an answer.
type Target struct {
	Kind   string
	URL    string
	Secret string
}

// Timeout bounds one delivery attempt, the answer's first bytes included:
// a receiver that takes longer is retried like one that failed.
const Timeout = 10 * time.Second

// RetryDelay is the wait after a delivery's attempt-th failure (1-based):
// 30 s doubling to at most 30 minutes, so MaxAttempts attempts span
// about an hour.
func RetryDelay(attempt int) time.Duration {
	return backoff.Capped(30*time.Second, 30*time.Minute, attempt-1)
}

// NewClient is the HTTP client deliveries use: Timeout overall, and no
// redirects followed (a 3xx is a failure, so a body meant for one URL is
// never posted to another).
func NewClient() *http.Client {
	return &http.Client{
		Timeout:       Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Send posts p to t once: nil when the target answered 2xx. An error is
// one line naming what happened (the status and the start of the answer,
// or the transport's failure) and no part of the URL beyond its scheme and
// host.
func Send(ctx context.Context, client *http.Client, t Target, p Payload, now time.Time, deliveryID int64) error {
	var body []byte
	var err error
	switch t.Kind {
	case KindSlack:
		body, err = SlackBody(p)
	case KindWebhook:
		body, err = WebhookBody(p)
	default:
		return fmt.Errorf("unknown target kind %q", t.Kind)
	}
	if err != nil {
		return fmt.Errorf("render: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.URL, bytes.NewReader(body))
	if err != nil {
		return errors.New("the target's URL does not parse")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "weir-notify")
	req.Header.Set("Weir-Event", p.Kind)
	req.Header.Set("Weir-Delivery", strconv.FormatInt(deliveryID, 10))
	if t.Kind == KindWebhook {
		req.Header.Set(SignatureHeader, Sign(t.Secret, now, body))
	}
	resp, err := client.Do(req)
	if err != nil {
		return errors.New(transportError(err, t.URL))
	}
	defer resp.Body.Close()
	head, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) //nolint:errcheck // draining for reuse only
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	msg := "HTTP " + strconv.Itoa(resp.StatusCode)
	if s := oneLine(string(head), 200); s != "" {
		msg += ": " + s
	}
	return errors.New(scrub(msg, t.URL))
}

// transportError is a failed request's cause without the URL that
// net/http puts in front of it.
func transportError(err error, raw string) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	msg := err.Error()
	if errors.Is(err, context.DeadlineExceeded) || strings.Contains(msg, "Client.Timeout") {
		msg = "no answer within " + Timeout.String()
	}
	return scrub(oneLine(msg, 200), raw)
}

// scrub takes out of msg any part of the URL raw that may be secret: the
// whole URL, its path, query and user information. Its scheme and host
// stay (URLHint shows them anyway).
func scrub(msg, raw string) string {
	if raw == "" {
		return msg
	}
	msg = strings.ReplaceAll(msg, raw, URLHint(raw))
	u, err := url.Parse(raw)
	if err != nil {
		return msg
	}
	for _, part := range []string{u.RawQuery, u.EscapedPath(), u.Path, u.User.String()} {
		if len(part) > 1 {
			msg = strings.ReplaceAll(msg, part, "…")
		}
	}
	return msg
}

// URLHint is what operators see of a target's URL: its scheme and host
// ("https://hooks.slack.com"); the rest often holds a secret.
func URLHint(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(invalid URL)"
	}
	return u.Scheme + "://" + u.Host
}

// CheckURL accepts an absolute http or https URL with a host. Its error
// never repeats the URL.
func CheckURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return errors.New("not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("must be an http or https URL")
	case u.Host == "" || u.Hostname() == "":
		return errors.New("has no host")
	case u.Fragment != "":
		return errors.New("must not have a fragment")
	case strings.ContainsAny(raw, " \t\r\n"):
		return errors.New("must not contain spaces")
	}
	return nil
}

// NewSecret is a webhook target's generated signing secret: 32 random
// bytes, hex, prefixed so that it is recognisable in a receiver's config.
func NewSecret() string {
	return "whsec_" + randid.Hex(32)
}
