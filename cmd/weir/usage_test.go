package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestUsageCommands runs `weir usage`, `weir prices`, `weir teams` and the
// budget flags of `weir keys` against a real `weir dev --simulate`.
func TestUsageCommands(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	admin := dev.admin
	secret := func(out string) string {
		var created struct{ Secret string }
		if err := json.Unmarshal([]byte(out), &created); err != nil || created.Secret == "" {
			t.Fatalf("keys create --json: %v: %s", err, out)
		}
		return created.Secret
	}
	out, err := admin("teams", "create", "usage-team", "--budget", "$1000/month", "--budget", "5Mtok/day")
	if err != nil || !strings.Contains(out, "usage-team") || !strings.Contains(out, "$1000.00/month") || !strings.Contains(out, "5.00Mtok/day") {
		t.Fatalf("teams create: %v: %s", err, out)
	}
	out, err = admin("keys", "create", "usage-a", "--team", "usage-team", "--session-budget", "1usd", "--json")
	if err != nil {
		t.Fatalf("keys create: %v: %s", err, out)
	}
	keyA := secret(out)
	out, err = admin("keys", "create", "usage-b", "--json")
	if err != nil {
		t.Fatal(err)
	}
	keyB := secret(out)
	for i := range 3 {
		if resp, body := postMessage(t, dev.DataplaneURL, keyA, hello); resp.StatusCode != 200 {
			t.Fatalf("request %d of usage-a: %d %s", i, resp.StatusCode, body)
		}
	}
	if resp, body := postMessage(t, dev.DataplaneURL, keyB, hello); resp.StatusCode != 200 {
		t.Fatalf("usage-b: %d %s", resp.StatusCode, body)
	}

	// The rows come as they are stored: wait for usage-a's three.
	var rows []map[string]any
	pollUntil(t, "usage-a's three requests stored", func() bool {
		out, err = admin("usage", "--by", "key", "--by", "model", "--key", "usage-a", "--json")
		if err != nil {
			t.Fatalf("usage --json: %v: %s", err, out)
		}
		rows = nil
		for l := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
			if l == "" {
				continue
			}
			var row map[string]any
			if err := json.Unmarshal([]byte(l), &row); err != nil {
				t.Fatalf("a --json line is not an object: %q", l)
			}
			rows = append(rows, row)
		}
		return len(rows) == 1 && rows[0]["requests"] == float64(3)
	})
	if len(rows) != 1 {
		t.Fatalf("usage --key usage-a: %v", rows)
	}
	r := rows[0]
	for _, f := range []string{"key", "model", "requests", "input_tokens", "output_tokens", "cache_read_tokens", "cache_creation_tokens", "reasoning_tokens", "cost_usd"} {
		if _, ok := r[f]; !ok {
			t.Errorf("row lacks %q: %v", f, r)
		}
	}
	if r["key"] != "usage-a" || r["requests"] != float64(3) || r["input_tokens"].(float64) <= 0 || r["cost_usd"].(float64) <= 0 {
		t.Errorf("usage-a's row: %v", r)
	}
	pollUntil(t, "usage-b's request stored", func() bool {
		out, err = admin("usage", "--by", "key", "--csv")
		return err != nil || strings.Contains(out, "usage-b,1,")
	})
	if err != nil || !strings.HasPrefix(out, "key,requests,input_tokens,output_tokens,cache_read_tokens,cache_creation_tokens,reasoning_tokens,cost_usd\n") ||
		!strings.Contains(out, "usage-b,1,") {
		t.Errorf("usage --csv: %v: %s", err, out)
	}
	out, err = admin("usage", "--by", "day", "--tz", "Europe/Berlin")
	if err != nil || !strings.Contains(out, "DAY") || !strings.Contains(out, "API-equivalent list prices as of") {
		t.Errorf("usage --by day: %v: %s", err, out)
	}
	// usage-a's requests named no session (no session header, no
	// metadata.user_id): the cache account has none to show.
	out, err = admin("usage", "--by", "session", "--cache", "--key", "usage-a")
	if err != nil || !strings.Contains(out, "no sessions in the range") {
		t.Errorf("usage --cache: %v: %s", err, out)
	}
	for _, bad := range [][]string{{"usage", "--by", "team"}, {"usage", "--since", "yesterday"}, {"usage", "--tz", "Mars/Base"}} {
		if out, err := admin(bad...); err == nil {
			t.Errorf("%v: want an error, got %s", bad, out)
		}
	}

	out, err = admin("prices", "set", "gpt-6.2-sol", "--input", "2", "--output", "10")
	if err != nil || !strings.Contains(out, "$2 in, $10 out, $0.2 cache read") {
		t.Errorf("prices set: %v: %s", err, out)
	}
	out, err = admin("prices", "list")
	if err != nil || !strings.Contains(out, "gpt-6.2-sol") || !strings.Contains(out, "operator") || !strings.Contains(out, "claude-sonnet-4*") {
		t.Errorf("prices list: %v: %s", err, out)
	}

	// A key put over a day's budget is refused with a final 429 naming it.
	if out, err := admin("keys", "update", "usage-b", "--budget", "100tok/day"); err != nil || !strings.Contains(out, "100tok/day") {
		t.Fatalf("keys update --budget: %v: %s", err, out)
	}
	var resp *http.Response
	var body []byte
	pollUntil(t, "usage-b refused", func() bool {
		resp, body = postMessage(t, dev.DataplaneURL, keyB, hello)
		return resp.StatusCode != http.StatusOK
	})
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("X-Should-Retry") != "false" ||
		!strings.Contains(string(body), `key \"usage-b\" is over its budget of 100 tokens per day`) {
		t.Errorf("over budget: %d %s", resp.StatusCode, body)
	}
	if out, err := admin("keys", "create", "bad-budget", "--budget", "5eur/day"); err == nil || !strings.Contains(err.Error()+out, "usd or tok") {
		t.Errorf("a budget in euros: %v %s", err, out)
	}
}

// pollUntil checks cond every 50 ms until it holds, failing the test after
// 10 s: for what a separate process stores on its own time.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}
