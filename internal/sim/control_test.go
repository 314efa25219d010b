package sim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func TestControlRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})

	const script = `{
	  "accept_unknown": false,
	  "accounts": [
	    {"name": "team", "credential": "sk-ant-api03-teamteamteamteam9876", "kind": "api_key"},
	    {"name": "max", "credential": "sk-ant-oat01-maxmaxmaxmaxmaxmax4321", "kind": "oauth",
	     "five_hour_utilization": 0.5, "seven_day_utilization": 0.2,
	     "faults": [{"kind": "rate_limit", "times": 1, "retry_after": 60, "unified": {"claim": "five_hour", "reset_in": "1h"}}]}
	  ]
	}`
	resp, data := b.call(t, "PUT", "/_sim/script", nil, script)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT script: %d %s", resp.StatusCode, data)
	}

	resp, data = b.call(t, "GET", "/_sim/script", nil, "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET script: %d %s", resp.StatusCode, data)
	}
	if strings.Contains(string(data), "teamteam") || strings.Contains(string(data), "maxmax") {
		t.Fatalf("GET script leaks a credential: %s", data)
	}
	got := decode[Script](t, data)
	if len(got.Accounts) != 2 || got.Accounts[0].Credential != "…9876" || got.Accounts[1].Credential != "…4321" {
		t.Fatalf("accounts %+v", got.Accounts)
	}
	if f := got.Accounts[1].Faults; len(f) != 1 || f[0].Kind != FaultRateLimit || f[0].Unified == nil ||
		f[0].Unified.Claim != ClaimFiveHour || f[0].Unified.ResetIn != Duration(3600e9) || f[0].RetryAfter != 60 {
		t.Errorf("faults %+v", f)
	}
	if !strings.Contains(string(data), `"reset_in":"1h0m0s"`) {
		t.Errorf("reset_in not written as a duration string: %s", data)
	}

	// The old accounts are gone, the new ones answer.
	if resp, _ := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, false)); resp.StatusCode != 401 {
		t.Errorf("old account: status %d, want 401", resp.StatusCode)
	}
	if resp, _ := b.call(t, "POST", "/v1/messages", oauthHeaders("sk-ant-oat01-maxmaxmaxmaxmaxmax4321"), messagesBody(sonnet, false)); resp.StatusCode != 429 {
		t.Errorf("scripted fault: status %d, want 429", resp.StatusCode)
	}

	// Faults added through the control API.
	resp, data = b.call(t, "POST", "/_sim/accounts/team/faults", nil, `[{"kind":"overloaded","times":2},{"kind":"slow_headers","delay":"1ms"}]`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST faults: %d %s", resp.StatusCode, data)
	}
	team := decode[AccountScript](t, data)
	if team.Name != "team" || len(team.Faults) != 2 || team.Faults[0].Times != 2 || team.Credential != "…9876" {
		t.Errorf("account after POST %+v", team)
	}
	teamKey := apiKeyHeaders("sk-ant-api03-teamteamteamteam9876")
	if resp, _ := b.call(t, "POST", "/v1/messages", teamKey, messagesBody(sonnet, false)); resp.StatusCode != 529 {
		t.Errorf("added fault: status %d, want 529", resp.StatusCode)
	}

	resp, data = b.call(t, "POST", "/_sim/accounts/nobody/faults", nil, `[{"kind":"overloaded"}]`)
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(data), "nobody") {
		t.Errorf("unknown account: %d %s", resp.StatusCode, data)
	}

	// The log, over HTTP.
	resp, data = b.call(t, "GET", "/_sim/attempts", nil, "")
	attempts := decode[[]Attempt](t, data)
	if resp.StatusCode != http.StatusOK || len(attempts) != 3 {
		t.Fatalf("attempts: %d %s", resp.StatusCode, data)
	}
	last := attempts[2]
	if last.Account != "team" || last.Outcome != FaultOverloaded || last.Status != 529 || last.BodySHA256 != bodyHash(messagesBody(sonnet, false)) {
		t.Errorf("last attempt %+v", last)
	}
	var raw []map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"time", "account", "model", "path", "stream", "body_sha256", "outcome", "status"} {
		if _, ok := raw[0][k]; !ok {
			t.Errorf("attempt JSON lacks %q", k)
		}
	}

	// Reset clears the log and the queues, not the accounts.
	if resp, _ := b.call(t, "POST", "/_sim/reset", nil, ""); resp.StatusCode != http.StatusNoContent {
		t.Errorf("reset: %d", resp.StatusCode)
	}
	if _, data := b.call(t, "GET", "/_sim/attempts", nil, ""); strings.TrimSpace(string(data)) != "[]" {
		t.Errorf("attempts after reset: %s", data)
	}
	if resp, _ := b.call(t, "POST", "/v1/messages", teamKey, messagesBody(sonnet, false)); resp.StatusCode != 200 {
		t.Errorf("after reset: status %d, want 200", resp.StatusCode)
	}
}

func TestControlErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	tests := []struct {
		name, method, path, body string
		status                   int
		want                     string // in the error message
	}{
		{"bad JSON", "PUT", "/_sim/script", `{"accounts":`, 400, "decode JSON"},
		{"unknown field", "PUT", "/_sim/script", `{"accounts":[],"acept_unknown":true}`, 400, "acept_unknown"},
		{"unknown fault kind", "PUT", "/_sim/script", `{"accounts":[{"name":"a","credential":"sk-ant-api03-x","faults":[{"kind":"meltdown"}]}]}`, 400, `accounts[0].faults[0].kind: unknown fault kind "meltdown"`},
		{"duplicate name", "PUT", "/_sim/script", `{"accounts":[{"name":"a","credential":"k1"},{"name":"a","credential":"k2"}]}`, 400, `accounts[1].name: "a" already used`},
		{"numeric delay", "POST", "/_sim/accounts/key-a/faults", `[{"kind":"slow_headers","delay":200}]`, 400, "duration string"},
		{"bad fault", "POST", "/_sim/accounts/key-a/faults", `[{"kind":"rate_limit","times":-2}]`, 400, "faults[0].times"},
		{"not a list", "POST", "/_sim/accounts/key-a/faults", `{"kind":"rate_limit"}`, 400, "decode JSON"},
		{"times and for", "POST", "/_sim/accounts/key-a/faults", `[{"kind":"overloaded","times":2,"for":"60s"}]`, 400, "faults[0].for: only one of times, for and until may be set, and this fault sets times too"},
		{"for and until", "PUT", "/_sim/script", `{"accounts":[{"name":"a","credential":"k1","faults":[{"kind":"overloaded","for":"1m","until":"2026-03-04T11:00:00Z"}]}]}`, 400, "accounts[0].faults[0].until: only one of times, for and until"},
		{"negative for", "POST", "/_sim/accounts/key-a/faults", `[{"kind":"overloaded","for":"-1s"}]`, 400, "faults[0].for: -1s is negative"},
		{"until not RFC 3339", "POST", "/_sim/accounts/key-a/faults", `[{"kind":"overloaded","until":"tomorrow"}]`, 400, "decode JSON"},
		{"unknown endpoint", "DELETE", "/_sim/script", ``, 404, "no such control endpoint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, data := b.call(t, tt.method, tt.path, nil, tt.body)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tt.status, data)
			}
			if msg := decode[controlErrorBody](t, data).Error; !strings.Contains(msg, tt.want) {
				t.Errorf("error %q, want it to contain %q", msg, tt.want)
			}
		})
	}
	// Nothing was changed by the refused requests.
	if resp, _ := b.call(t, "POST", "/v1/messages", apiKeyHeaders(keyA), messagesBody(sonnet, false)); resp.StatusCode != 200 {
		t.Errorf("status %d, want 200", resp.StatusCode)
	}
}

func TestMaskCredential(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"sk-ant-api03-abcdefgh1234": "…1234",
		"12345678":                  "…5678",
		"short":                     "…",
	} {
		if got := maskCredential(in); got != want {
			t.Errorf("maskCredential(%q) = %q, want %q", in, got, want)
		}
	}
}
