package sim

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestScriptValidate(t *testing.T) {
	t.Parallel()
	acct := func(mod func(*AccountScript)) Script {
		a := AccountScript{Name: "a", Credential: "sk-ant-api03-aaaa"}
		mod(&a)
		return Script{Accounts: []AccountScript{a}}
	}
	tests := []struct {
		name string
		sc   Script
		want []string // substrings of the error; none means valid
	}{
		{"valid", testScript(), nil},
		{"empty", Script{}, nil},
		{"no name", acct(func(a *AccountScript) { a.Name = "" }), []string{"accounts[0].name: required"}},
		{"slash in name", acct(func(a *AccountScript) { a.Name = "a/b" }), []string{"accounts[0].name"}},
		{"no credential", acct(func(a *AccountScript) { a.Credential = "" }), []string{"accounts[0].credential: required"}},
		{"bad credential", acct(func(a *AccountScript) { a.Credential = "has space" }), []string{"accounts[0].credential: not a well-formed"}},
		{"bad kind", acct(func(a *AccountScript) { a.Kind = "cookie" }), []string{`accounts[0].kind: "cookie"`}},
		{"utilization", acct(func(a *AccountScript) { a.FiveHourUtilization = 45.2 }), []string{"five_hour_utilization: 45.2 is outside 0..1"}},
		{"several problems", acct(func(a *AccountScript) {
			a.SevenDayUtilization = -1
			a.Faults = []Fault{
				{Kind: "boom"},
				{Kind: FaultRateLimit, Times: -3, RetryAfter: -1},
				{Kind: FaultRateLimit, Unified: &UnifiedRejection{Claim: "weekly"}},
				{Kind: FaultOverloaded, Unified: &UnifiedRejection{Claim: ClaimFiveHour}},
				{Kind: FaultSlowHeaders, Delay: Duration(-time.Second)},
				{Kind: FaultDropMidStream, AfterDeltas: -1},
			}
		}), []string{
			"seven_day_utilization",
			`faults[0].kind: unknown fault kind "boom"`,
			"faults[1].times: -3",
			"faults[1].retry_after",
			`faults[2].unified.claim: unknown claim "weekly"`,
			"faults[3].unified: only valid for kind",
			"faults[4].delay",
			"faults[5].after_deltas",
		}},
		{"duplicates", Script{Accounts: []AccountScript{
			{Name: "a", Credential: "k1"}, {Name: "a", Credential: "k1"},
		}}, []string{`accounts[1].name: "a" already used by accounts[0]`, "accounts[1].credential: already used by accounts[0]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.sc.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate accepted an invalid script")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestLoadScript(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	sc, err := LoadScript(write("ok.json", `{
	  "accept_unknown": true,
	  "accounts": [
	    {"name": "max", "credential": "sk-ant-oat01-xyz", "five_hour_utilization": 0.5,
	     "faults": [{"kind": "slow_headers", "delay": "2s", "model": "claude-opus-4-1-20250805"},
	                {"kind": "rate_limit", "unified": {"claim": "seven_day", "reset_in": "36h"}}]}
	  ]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	a := sc.Accounts[0]
	if !sc.AcceptUnknown || a.Name != "max" || len(a.Faults) != 2 ||
		a.Faults[0].Delay != Duration(2*time.Second) || a.Faults[0].Model != opus ||
		a.Faults[1].Unified.ResetIn != Duration(36*time.Hour) {
		t.Errorf("loaded %+v", sc)
	}
	// An empty kind is inferred from the credential's prefix.
	if got := newRegistry(sc).byName["max"].kind; got != KindOAuth {
		t.Errorf("inferred kind %q, want oauth", got)
	}

	for name, content := range map[string]string{
		"syntax.json":   `{"accounts": [`,
		"unknown.json":  `{"accounts": [], "acceptUnknown": true}`,
		"trailing.json": `{"accounts": []} {}`,
		"invalid.json":  `{"accounts": [{"name": "a", "credential": "k", "faults": [{"kind": "nope"}]}]}`,
	} {
		if _, err := LoadScript(write(name, content)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("LoadScript(%s): error %v, want one naming the file", name, err)
		}
	}
	if _, err := LoadScript(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("LoadScript of a missing file succeeded")
	}
}

func TestDurationJSON(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal(Fault{Kind: FaultSlowHeaders, Delay: Duration(1500 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"kind":"slow_headers","times":0,"delay":"1.5s"}`; string(b) != want {
		t.Errorf("marshal %s, want %s", b, want)
	}
	var f Fault
	if err := json.Unmarshal(b, &f); err != nil || f.Delay != Duration(1500*time.Millisecond) {
		t.Errorf("unmarshal: %+v, %v", f, err)
	}
	for _, bad := range []string{`{"delay":2}`, `{"delay":"2 seconds"}`} {
		if err := json.Unmarshal([]byte(bad), &f); err == nil {
			t.Errorf("unmarshal %s succeeded", bad)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	err := Config{DeltaDelay: -1, Deltas: -1, Script: Script{Accounts: []AccountScript{{}}}}.Validate()
	for _, w := range []string{"DeltaDelay", "Deltas", "Script: accounts[0].name"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v lacks %q", err, w)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("New accepted an invalid config")
		}
	}()
	New(Config{Deltas: -1})
}

func TestAttemptLogBounded(t *testing.T) {
	t.Parallel()
	var l attemptLog
	for i := range maxAttempts + 5 {
		l.add(Attempt{Status: i})
	}
	got := l.list()
	if len(got) != maxAttempts || got[0].Status != 5 || got[len(got)-1].Status != maxAttempts+4 {
		t.Fatalf("len %d, first %d, last %d", len(got), got[0].Status, got[len(got)-1].Status)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Status != got[i-1].Status+1 {
			t.Fatalf("out of order at %d", i)
		}
	}
	got[0].Status = -1
	if l.list()[0].Status == -1 {
		t.Error("list shares memory with the log")
	}
	l.clear()
	if len(l.list()) != 0 {
		t.Error("clear left attempts")
	}
}

// TestConcurrentUse hammers the server while the script and queues change,
// for the race detector.
func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	sc := testScript()
	sc.AcceptUnknown = true
	b := setup(t, Config{Script: sc})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 10 {
				h := apiKeyHeaders(keyA)
				if (i+j)%2 == 0 {
					h = oauthHeaders(tokO)
				}
				resp, err := b.send(t, "POST", "/v1/messages", h, messagesBody(sonnet, j%3 == 0))
				if err == nil {
					resp.Body.Close()
				}
			}
		})
	}
	for range 10 {
		wg.Go(func() {
			b.sim.AddFaults("key-a", Fault{Kind: FaultOverloaded}) //nolint:errcheck // a SetScript may race it
			b.sim.AddFaults("sub-o", Fault{Kind: FaultOverloadedEvent, Times: 2})
			b.sim.Attempts()
			b.sim.script()
		})
	}
	wg.Go(func() {
		b.sim.SetScript(sc) //nolint:errcheck // valid
		b.sim.Reset()
	})
	wg.Wait()
}
