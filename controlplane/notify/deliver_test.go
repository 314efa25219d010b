package notify

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func payload() Payload {
	return Payload{ID: 42, Kind: PoolExhausted, Severity: Critical, Text: "anthropic: no account can serve now (3 accounts: 1 paused)",
		DedupKey: "pool/anthropic:exhausted@x", OccurredAt: t0,
		Fields: json.RawMessage(`{"provider":"anthropic","serving":0,"accounts":3,"note":"<b>&"}`)}
}

// TestSignature: a signature verifies with the secret, and not with a
// tampered body, another secret, another time, or outside the tolerance.
func TestSignature(t *testing.T) {
	t.Parallel()
	secret := NewSecret()
	body, err := WebhookBody(payload())
	if err != nil {
		t.Fatal(err)
	}
	sig := Sign(secret, t0, body)
	if !strings.HasPrefix(sig, "t=1898831167,v1=") || len(sig) != len("t=1898831167,v1=")+64 {
		t.Fatalf("signature %q: want t=<unix seconds>,v1=<64 hex digits>", sig)
	}
	if err := Verify(secret, sig, body, t0.Add(time.Minute), 5*time.Minute); err != nil {
		t.Fatalf("a genuine signature: %v", err)
	}
	tampered := bytes.Replace(body, []byte(`"serving":0`), []byte(`"serving":9`), 1)
	if bytes.Equal(tampered, body) {
		t.Fatal("the tampering changed nothing")
	}
	for name, tc := range map[string]struct {
		secret, header string
		body           []byte
		now            time.Time
	}{
		"tampered body":   {secret, sig, tampered, t0},
		"other secret":    {NewSecret(), sig, body, t0},
		"other time":      {secret, strings.Replace(sig, "t=1898831167", "t=1898831168", 1), body, t0},
		"replayed late":   {secret, sig, body, t0.Add(6 * time.Minute)},
		"no v1":           {secret, "t=1898831167", body, t0},
		"garbage":         {secret, "nonsense", body, t0},
		"empty signature": {secret, "", body, t0},
	} {
		if err := Verify(tc.secret, tc.header, tc.body, tc.now, 5*time.Minute); err != ErrSignature {
			t.Errorf("%s: %v, want ErrSignature", name, err)
		}
	}
}

// TestSlackText: one line with the severity, kind and text, then a line
// per field, Slack's markup escaped.
func TestSlackText(t *testing.T) {
	t.Parallel()
	got := SlackText(payload())
	want := ":red_circle: *weir pool_exhausted* anthropic: no account can serve now (3 accounts: 1 paused)\n" +
		"> accounts: 3\n> note: &lt;b&gt;&amp;\n> provider: anthropic\n> serving: 0"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestSend: a webhook gets the JSON payload, signed, with its event and
// delivery in headers; a Slack target gets {"text": ...}; a non-2xx
// answer, a redirect and a refused connection are one-line errors that
// never show the URL's path, query or user.
func TestSend(t *testing.T) {
	t.Parallel()
	secret := NewSecret()
	type got struct {
		header http.Header
		body   []byte
	}
	received := make(chan got, 4)
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		received <- got{r.Header.Clone(), b}
		if r.URL.Path == "/moved/T0SECRETPATH" {
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
			return
		}
		w.WriteHeader(status)
		io.WriteString(w, "invalid_token\n  for this hook\x00") //nolint:errcheck // the test reads what arrives
	}))
	defer srv.Close()
	client := NewClient()
	url := srv.URL + "/services/T0SECRETPATH?token=SECRETQUERY"

	if err := Send(t.Context(), client, Target{Kind: KindWebhook, URL: url, Secret: secret}, payload(), t0, 7); err != nil {
		t.Fatalf("webhook: %v", err)
	}
	r := <-received
	if err := Verify(secret, r.header.Get(SignatureHeader), r.body, t0, time.Minute); err != nil {
		t.Errorf("webhook signature: %v", err)
	}
	var p Payload
	if err := json.Unmarshal(r.body, &p); err != nil || p.ID != 42 || p.Kind != PoolExhausted || !p.OccurredAt.Equal(t0) ||
		!strings.Contains(string(p.Fields), `"serving":0`) {
		t.Errorf("webhook body %s: %v", r.body, err)
	}
	if r.header.Get("Content-Type") != "application/json" || r.header.Get("Weir-Event") != PoolExhausted || r.header.Get("Weir-Delivery") != "7" {
		t.Errorf("webhook headers %v", r.header)
	}

	if err := Send(t.Context(), client, Target{Kind: KindSlack, URL: url}, payload(), t0, 8); err != nil {
		t.Fatalf("slack: %v", err)
	}
	r = <-received
	var slack map[string]string
	if err := json.Unmarshal(r.body, &slack); err != nil || len(slack) != 1 || slack["text"] != SlackText(payload()) {
		t.Errorf("slack body %s: %v", r.body, err)
	}
	if r.header.Get(SignatureHeader) != "" {
		t.Error("a Slack target got a signature")
	}

	status = http.StatusInternalServerError
	err := Send(t.Context(), client, Target{Kind: KindWebhook, URL: url, Secret: secret}, payload(), t0, 9)
	<-received
	if err == nil || err.Error() != "HTTP 500: invalid_token for this hook" {
		t.Errorf("a 500: %v", err)
	}
	err = Send(t.Context(), client, Target{Kind: KindWebhook, URL: srv.URL + "/moved/T0SECRETPATH", Secret: secret}, payload(), t0, 10)
	<-received
	if err == nil || !strings.HasPrefix(err.Error(), "HTTP 302") {
		t.Errorf("a redirect: %v, want a failure", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://user:PASSWORD@" + ln.Addr().String() + "/services/T0SECRETPATH?token=SECRETQUERY"
	ln.Close()
	err = Send(t.Context(), client, Target{Kind: KindSlack, URL: closed}, payload(), t0, 11)
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("a refused connection: %v", err)
	}
	for _, e := range []error{err} {
		for _, secretPart := range []string{"T0SECRETPATH", "SECRETQUERY", "PASSWORD", "\n"} {
			if strings.Contains(e.Error(), secretPart) {
				t.Errorf("error %q shows %q", e, secretPart)
			}
		}
	}
}

// TestScrub: what a transport error may carry of a URL is taken out.
func TestScrub(t *testing.T) {
	t.Parallel()
	raw := "https://hooks.slack.com/services/T000/B000/XXXXSECRET?x=SECRET2"
	msg := scrub(`Post "`+raw+`": dial tcp: lookup hooks.slack.com: no such host; path /services/T000/B000/XXXXSECRET`, raw)
	if strings.Contains(msg, "XXXXSECRET") || strings.Contains(msg, "SECRET2") || !strings.Contains(msg, "https://hooks.slack.com") {
		t.Errorf("scrubbed: %q", msg)
	}
	if got := URLHint(raw); got != "https://hooks.slack.com" {
		t.Errorf("hint %q", got)
	}
}

// TestCheckURL: http(s) with a host only, and no error repeats the URL.
func TestCheckURL(t *testing.T) {
	t.Parallel()
	for raw, ok := range map[string]bool{
		"https://hooks.slack.com/services/T/B/X": true,
		"http://127.0.0.1:9000/hook":             true,
		"ftp://example.com/SECRET":               false,
		"https:///SECRET":                        false,
		"/relative/SECRET":                       false,
		"https://example.com/SECRET#frag":        false,
		"https://example.com/a SECRET":           false,
	} {
		err := CheckURL(raw)
		if (err == nil) != ok {
			t.Errorf("%q: %v, want ok=%v", raw, err, ok)
		}
		if err != nil && strings.Contains(err.Error(), "SECRET") {
			t.Errorf("%q: the error repeats the URL: %v", raw, err)
		}
	}
}

// TestRetrySchedule: MaxAttempts attempts, the waits between them
// doubling from 30 s, span about an hour.
func TestRetrySchedule(t *testing.T) {
	t.Parallel()
	var total time.Duration
	var waits []string
	for attempt := 1; attempt < MaxAttempts; attempt++ {
		total += RetryDelay(attempt)
		waits = append(waits, RetryDelay(attempt).String())
	}
	if got := strings.Join(waits, " "); got != "30s 1m0s 2m0s 4m0s 8m0s 16m0s 30m0s" {
		t.Errorf("waits %s", got)
	}
	if total < 50*time.Minute || total > 70*time.Minute {
		t.Errorf("%d attempts span %v, want about an hour", MaxAttempts, total)
	}
}
