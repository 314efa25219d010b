package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/weirhq/weir/controlplane/notify"
)

// hookReceiver records what weir posts; a path under /fail/ answers 500.
type hookReceiver struct {
	*httptest.Server
	mu  sync.Mutex
	got []hookRequest
}

type hookRequest struct {
	path   string
	header http.Header
	body   []byte
}

func newHookReceiver(t *testing.T) *hookReceiver {
	t.Helper()
	r := &hookReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.got = append(r.got, hookRequest{req.URL.Path, req.Header.Clone(), body})
		r.mu.Unlock()
		if strings.HasPrefix(req.URL.Path, "/fail/") {
			http.Error(w, "receiver down for maintenance", http.StatusInternalServerError)
		}
	}))
	t.Cleanup(r.Close)
	return r
}

// tests are the test events that reached path's prefix.
func (r *hookReceiver) tests(prefix string) []hookRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []hookRequest
	for _, h := range r.got {
		if strings.HasPrefix(h.path, prefix) && h.header.Get("Weir-Event") == notify.Test {
			out = append(out, h)
		}
	}
	return out
}

// TestNotifyCommands runs `weir notify add|list|test|remove` against a
// real `weir dev --simulate` and a receiver: a webhook's generated secret
// is shown once and verifies the test event's signature; a Slack target
// gets {"text": ...}; a failing receiver's test prints its error; list
// shows the targets by scheme and host and the deliveries' status,
// attempts and last error, as text and JSON; no output shows a URL's
// path or a given secret. The thresholds are settings.
func TestNotifyCommands(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	admin := dev.adminIn
	recv := newHookReceiver(t)
	hookURL := recv.URL + "/ok/T0SECRETPATH?token=SECRETQUERY"
	chatURL := recv.URL + "/slack/services/T000/B000/SLACKSECRET"
	badURL := recv.URL + "/fail/BADSECRETPATH"
	given := "given-secret-" + strings.Repeat("x", 12)
	var outputs []string
	run := func(stdin string, args ...string) (string, error) {
		t.Helper()
		out, err := admin(stdin, args...)
		if err != nil {
			out += err.Error()
		}
		outputs = append(outputs, out)
		return out, err
	}
	t.Cleanup(func() {
		for _, name := range []string{"cli-hook", "cli-chat", "cli-bad"} {
			admin("", "notify", "remove", name) //nolint:errcheck // a removed one is gone already
		}
	})

	out, err := run("", "notify", "add", "cli-hook", "--url", hookURL, "--events", "account_broken")
	if err != nil || !strings.Contains(out, "added webhook target cli-hook ("+recv.URL+"), events account_broken") {
		t.Fatalf("notify add: %v: %s", err, out)
	}
	secret := regexp.MustCompile(`whsec_[0-9a-f]{64}`).FindString(out)
	if secret == "" || !strings.Contains(out, "shown once") {
		t.Fatalf("notify add shows no generated secret: %s", out)
	}
	if out, err := run(chatURL+"\n", "notify", "add", "cli-chat", "--slack", "--url", "-", "--events", "pool_exhausted,pool_restored"); err != nil ||
		strings.Contains(out, "whsec_") || !strings.Contains(out, "added slack target cli-chat") {
		t.Fatalf("notify add --slack --url -: %v: %s", err, out)
	}
	if out, err := run("", "notify", "add", "cli-bad", "--url", badURL, "--secret", given, "--events", "budget_threshold", "--json"); err != nil ||
		strings.Contains(out, "whsec_") {
		t.Fatalf("notify add --secret: %v: %s", err, out)
	}

	if out, err := run("", "notify", "test", "cli-hook"); err != nil || !strings.Contains(out, "delivered to cli-hook (attempt 1)") {
		t.Fatalf("notify test cli-hook: %v: %s", err, out)
	}
	hooks := recv.tests("/ok/")
	if len(hooks) != 1 {
		t.Fatalf("%d test events reached the webhook, want 1", len(hooks))
	}
	h := hooks[0]
	if err := notify.Verify(secret, h.header.Get(notify.SignatureHeader), h.body, time.Now(), time.Minute); err != nil {
		t.Errorf("the test event's signature does not verify with the secret add showed: %v", err)
	}
	if err := notify.Verify(secret, h.header.Get(notify.SignatureHeader), append(h.body, ' '), time.Now(), time.Minute); err == nil {
		t.Error("a tampered body verifies")
	}
	var p notify.Payload
	if err := json.Unmarshal(h.body, &p); err != nil || p.Kind != notify.Test || p.Text != "test notification from weir to cli-hook" {
		t.Errorf("test payload %s: %v", h.body, err)
	}
	if out, err := run("", "notify", "test", "cli-chat"); err != nil || !strings.Contains(out, "delivered to cli-chat") {
		t.Fatalf("notify test cli-chat: %v: %s", err, out)
	}
	chats := recv.tests("/slack/services/T000/B000/SLACKSECRET")
	var text map[string]string
	if len(chats) != 1 || json.Unmarshal(chats[0].body, &text) != nil ||
		text["text"] != ":information_source: *weir test* test notification from weir to cli-chat\n> target: cli-chat" {
		t.Errorf("the Slack target got %d test events: %v", len(chats), text)
	}
	out, err = run("", "notify", "test", "cli-bad")
	if err == nil || !strings.Contains(out, "the test notification to cli-bad failed (attempt 1): HTTP 500: receiver down for maintenance") {
		t.Errorf("notify test cli-bad: %v: %s", err, out)
	}

	out, err = run("", "notify", "list")
	if err != nil {
		t.Fatalf("notify list: %v: %s", err, out)
	}
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`cli-hook\s+webhook\s+` + regexp.QuoteMeta(recv.URL) + `\s+account_broken\s`),
		regexp.MustCompile(`cli-chat\s+slack\s+` + regexp.QuoteMeta(recv.URL) + `\s+pool_exhausted,pool_restored\s`),
		regexp.MustCompile(`cli-bad\s+test\s+pending\s+1\s+HTTP 500: receiver down for maintenance\s`),
		regexp.MustCompile(`cli-hook\s+test\s+delivered\s+1\s+-\s`),
	} {
		if !want.MatchString(out) {
			t.Errorf("notify list lacks %s:\n%s", want, out)
		}
	}
	out, err = run("", "notify", "list", "--json")
	var listed struct {
		Targets    []struct{ Name, UrlHint string }
		EventKinds []string
		Deliveries []struct {
			TargetName, EventKind, Status, LastError string
			Attempts                                 int
		}
	}
	if err != nil || json.Unmarshal([]byte(out), &listed) != nil || len(listed.EventKinds) != len(notify.Kinds()) {
		t.Fatalf("notify list --json: %v: %s", err, out)
	}
	statuses := map[string]string{}
	for _, d := range listed.Deliveries {
		if d.EventKind == notify.Test {
			statuses[d.TargetName] = d.Status + " " + d.LastError
		}
	}
	if statuses["cli-hook"] != "NOTIFY_DELIVERY_STATUS_DELIVERED " || statuses["cli-chat"] != "NOTIFY_DELIVERY_STATUS_DELIVERED " ||
		statuses["cli-bad"] != "NOTIFY_DELIVERY_STATUS_PENDING HTTP 500: receiver down for maintenance" {
		t.Errorf("notify list --json deliveries: %v", statuses)
	}

	if out, err := run("", "notify", "remove", "cli-bad"); err != nil || !strings.Contains(out, "removed cli-bad") {
		t.Errorf("notify remove: %v: %s", err, out)
	}
	if out, err := run("", "notify", "list"); err != nil || strings.Contains(out, "cli-bad") {
		t.Errorf("notify list after remove: %v: %s", err, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"notify", "add", "x"}, "--url is required"},
		{[]string{"notify", "add", "x", "--url", "ftp://example.com/FTPSECRET"}, "must be an http or https URL"},
		{[]string{"notify", "add", "x", "--url", recv.URL, "--events", "nope"}, `unknown event kind "nope"`},
		{[]string{"notify", "test", "nope"}, "not found"},
		{[]string{"notify", "remove", "nope"}, "not found"},
	} {
		if out, err := run("", tc.args...); err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("%v: %v: %s, want %q", tc.args, err, out, tc.want)
		}
	}

	// The thresholds are settings.
	if out, err := run("", "settings", "set", "pool_low_accounts=2", "breaker_notify_after=10m"); err != nil ||
		!regexp.MustCompile(`pool_low_accounts\s+2\n`).MatchString(out) || !regexp.MustCompile(`breaker_notify_after\s+10m\n`).MatchString(out) {
		t.Errorf("settings set the thresholds: %v: %s", err, out)
	}
	if out, err := run("", "settings", "set", "pool_low_accounts=1", "breaker_notify_after=5m"); err != nil {
		t.Errorf("settings set back: %v: %s", err, out)
	}

	for _, o := range outputs {
		for _, s := range []string{"T0SECRETPATH", "SECRETQUERY", "SLACKSECRET", "BADSECRETPATH", "FTPSECRET", given} {
			if strings.Contains(o, s) {
				t.Errorf("an output shows %q:\n%s", s, o)
			}
		}
	}
}
