package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/weirhq/weir/controlplane/policy"
)

// Payload is an event as a webhook target receives it (the JSON body).
// Its fields are the same on every attempt and for every target.
type Payload struct {
	// ID is the event's id: a receiver that sees it twice (a delivery is
	// at least once) drops the second.
	ID         int64           `json:"id"`
	Kind       string          `json:"kind"`
	Severity   Severity        `json:"severity"`
	Text       string          `json:"text"`
	DedupKey   string          `json:"dedup_key"`
	OccurredAt time.Time       `json:"occurred_at"`
	Fields     json.RawMessage `json:"fields"`
}

// WebhookBody is p as a webhook target's JSON body.
func WebhookBody(p Payload) ([]byte, error) {
	if len(p.Fields) == 0 {
		p.Fields = json.RawMessage("{}")
	}
	return json.Marshal(p)
}

// SlackBody is p as a Slack-compatible incoming webhook's body:
// {"text": ...}, a first line with the severity, kind and text, then one
// line per field.
func SlackBody(p Payload) ([]byte, error) {
	return json.Marshal(struct {
		Text string `json:"text"`
	}{SlackText(p)})
}

// severityMark is the first thing a Slack line shows.
var severityMark = map[Severity]string{Critical: ":red_circle:", Warning: ":warning:", Info: ":information_source:"}

// SlackText is p as Slack mrkdwn: "<mark> *weir pool_exhausted* text",
// then "> name: value" for each field, sorted by name.
func SlackText(p Payload) string {
	var b strings.Builder
	mark := severityMark[p.Severity]
	if mark == "" {
		mark = severityMark[Info]
	}
	fmt.Fprintf(&b, "%s *weir %s* %s", mark, slackEscape(p.Kind), slackEscape(p.Text))
	var fields map[string]any
	if len(p.Fields) > 0 && json.Unmarshal(p.Fields, &fields) == nil {
		for _, k := range slices.Sorted(maps.Keys(fields)) {
			fmt.Fprintf(&b, "\n> %s: %s", slackEscape(k), slackEscape(fieldText(fields[k])))
		}
	}
	return b.String()
}

// fieldText renders one field's JSON value on one line.
func fieldText(v any) string {
	switch v := v.(type) {
	case string:
		return oneLine(v, 300)
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case nil:
		return "-"
	}
	b, _ := json.Marshal(v)
	return oneLine(string(b), 300)
}

// slackEscape escapes what Slack's mrkdwn reads as markup of its own
// (links, mentions).
func slackEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// oneLine is s on one line (control characters and runs of spaces become
// one space), cut to at most n bytes with an ellipsis.
func oneLine(s string, n int) string {
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }), " ")
	if len(s) <= n {
		return s
	}
	return policy.Truncate(s, n-len("…")) + "…"
}

// SignatureHeader carries a webhook body's signature.
const SignatureHeader = "Weir-Signature"

// Sign is the Weir-Signature of body sent at t with secret:
// "t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">".
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac(secret, ts, body))
}

func mac(secret, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// ErrSignature is every way a signature fails to verify.
var ErrSignature = errors.New("notify: signature does not verify")

// Verify checks a Weir-Signature header against body and secret, and that
// its time is within tolerance of now (a replayed old delivery fails): the
// receiver's side of Sign, as docs/notifications.md describes it.
func Verify(secret, header string, body []byte, now time.Time, tolerance time.Duration) error {
	var ts string
	var sigs [][]byte
	for part := range strings.SplitSeq(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			if b, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, b)
			}
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return ErrSignature
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return ErrSignature
	}
	want := mac(secret, ts, body)
	for _, s := range sigs {
		if hmac.Equal(s, want) {
			return nil
		}
	}
	return ErrSignature
}
