package bench

import (
	"strings"
	"testing"
	"time"
)

// TestHoldsMarkdown: a row says whether each faulted account met its
// fault, and one whose fault no attempt met says so instead of passing;
// every row measures something (the turns that met the fault, or the
// turns waiting at its mark), none prints a dash; accounts outside the
// faulted ones are named.
func TestHoldsMarkdown(t *testing.T) {
	t.Parallel()
	cfg := HoldsConfig{Accounts: []string{"a", "b"}, Model: "m", Agents: 2, Turns: 1, Runs: 1}
	turn := func(took time.Duration, ok bool) TurnResult { return TurnResult{OK: ok, Took: took} }
	runs := []ScenarioRun{
		{Scenario: "only a overloaded", Turns: []TurnResult{turn(time.Second, true), turn(200*time.Millisecond, true)},
			Upstream: 7, Failed: 5, Faulted: []AccountAttempts{{"a", 6, 5}}, Met: []time.Duration{time.Second}, Others: []string{"z"}},
		{Scenario: "only b overloaded", Turns: []TurnResult{turn(200*time.Millisecond, true), turn(200*time.Millisecond, true)},
			Upstream: 2, Faulted: []AccountAttempts{{"b", 0, 0}}, Others: []string{"z"}},
		{Scenario: "a storm", Turns: []TurnResult{turn(21*time.Second, true), turn(21*time.Second, false)},
			Upstream: 30, Failed: 20, Faulted: []AccountAttempts{{"a", 15, 10}, {"b", 15, 10}}, Mark: "the storm ended",
			Waiting: []time.Duration{time.Second, 1300 * time.Millisecond}, WaitingOK: 1, Others: []string{"z"}},
		{Scenario: "a short storm", Turns: []TurnResult{turn(time.Second, true)},
			Upstream: 3, Failed: 2, Faulted: []AccountAttempts{{"a", 2, 1}, {"b", 1, 1}}, Mark: "the storm ended", Others: []string{"z"}},
	}
	md := HoldsMarkdown(cfg, runs)
	rows := map[string]string{}
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(l, "| ") {
			rows[strings.Split(strings.TrimPrefix(l, "| "), " | ")[0]] = l
		}
	}
	for name, want := range map[string]string{
		"only a overloaded": "| only a overloaded | yes: a 5/6 | 2/2 | 1s | 1s | 1 turns met the fault, the slowest 1s | 7 (5) |",
		"only b overloaded": "| only b overloaded | **NOT MET** on b: this run did not test that fault (b 0/0) | 2/2 | 200ms | 200ms | no turn met the fault | 2 (0) |",
		"a storm":           "| a storm | yes: a 10/15, b 10/15 | 1/2 | 21s | 21s | ended ≤ 1.3s after the storm ended (2 turns waiting, 1 served) | 30 (20) |",
		"a short storm":     "| a short storm | yes: a 1/2, b 1/1 | 1/1 | 1s | 1s | no turn was waiting when the storm ended | 3 (2) |",
	} {
		if rows[name] != want {
			t.Errorf("row %q:\n got %s\nwant %s", name, rows[name], want)
		}
	}
	if !strings.Contains(md, "Not faulted, yet in weir's pool") || !strings.Contains(md, ": z.") {
		t.Errorf("the accounts outside the faulted ones are not named:\n%s", md)
	}
	if strings.Contains(md, "—") {
		t.Errorf("a cell measures nothing:\n%s", md)
	}
	if got := runs[1].Unmet(); len(got) != 1 || got[0] != "b" {
		t.Errorf("Unmet() = %v, want [b]", got)
	}
}
