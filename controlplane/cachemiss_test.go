package controlplane

import (
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/uuid"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestMissCause: each way a session's request can miss the cache, and the
// line that says why.
func TestMissCause(t *testing.T) {
	t.Parallel()
	a, b := uuid.New(), uuid.New()
	label := func(id uuid.UUID) string {
		if id == a {
			return "max-a"
		}
		return "max-b"
	}
	prev := cacheEvent{account: a, at: epoch, cacheCreation: 5000}
	at := func(d time.Duration, acct uuid.UUID) cacheEvent {
		return cacheEvent{account: acct, at: epoch.Add(d), cacheCreation: 5000}
	}
	failover := at(time.Minute, b)
	failover.attempts = []*weirv1.AttemptRecord{{AccountId: a.String(), Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, Status: 529, ErrorType: "overloaded_error"}, {AccountId: b.String(), Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Status: 200}}
	held := at(time.Minute, b)
	held.holds = 1
	held.attempts = []*weirv1.AttemptRecord{{HoldReason: "all accounts cooling"}, {AccountId: b.String(), Status: 200}}
	for _, c := range []struct {
		name         string
		cur          cacheEvent
		cause, words string
	}{
		{"failover", failover, "moved", "failover: max-a answered 529 overloaded_error, and max-b served"},
		{"hold", held, "moved", "held (all accounts cooling), then served by max-b"},
		{"binding lapsed", at(2*time.Hour, b), "moved", "binding to max-a lapsed"},
		{"account busy", at(time.Minute, b), "moved", "max-a could not take it"},
		{"expired", at(6*time.Minute, a), "expired", "6m0s since the session's previous request"},
		{"prefix", at(time.Minute, a), "prefix_changed", "the prompt's start changed"},
	} {
		cause, why := missCause(prev, c.cur, time.Hour, label)
		if cause != c.cause || !strings.Contains(why, c.words) {
			t.Errorf("%s: %s %q; want %s containing %q", c.name, cause, why, c.cause, c.words)
		}
	}
}

// TestExplainCache: reported sessions come back with their hit ratios and
// their misses, each attributed; a hit, a first request and an unserved
// request are no misses.
func TestExplainCache(t *testing.T) {
	t.Parallel()
	e := setup(t)
	k, _ := e.createKey("alice")
	a, _ := e.createAccount(acct{label: "max-a"})
	b, _ := e.createAccount(acct{label: "max-b"})
	n := 0
	report := func(session, account string, at time.Duration, status int32, u *weirv1.TokenUsage, recs ...*weirv1.AttemptRecord) string {
		n++
		id := "req-cache-" + session + "-" + string(rune('a'+n))
		if recs == nil {
			recs = []*weirv1.AttemptRecord{{AccountId: account, Status: status, Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Usage: u}}
		}
		e.report(&weirv1.RouteEvent{RequestId: id, KeyId: k.Id, AccountId: account, Model: "claude-sonnet-4-5", Status: status,
			Surface: "messages", Attempts: int32(len(recs)), StartedAt: timestamppb.New(epoch.Add(at)), SessionKey: session,
			AttemptRecords: recs})
		return id
	}
	write := &weirv1.TokenUsage{InputTokens: 10, CacheCreationTokens: 20000, OutputTokens: 100}
	read := &weirv1.TokenUsage{InputTokens: 10, CacheReadTokens: 20000, CacheCreationTokens: 300, OutputTokens: 100}
	report("s1", a.Id, 0, 200, write)                      // first: writes
	report("s1", a.Id, time.Minute, 200, read)             // hit
	moved := report("s1", b.Id, 2*time.Minute, 200, write, // failover from a
		&weirv1.AttemptRecord{AccountId: a.Id, Status: 529, Class: weirv1.OutcomeClass_OUTCOME_CLASS_OVERLOADED, ErrorType: "overloaded_error", Action: weirv1.Action_ACTION_FAILOVER},
		&weirv1.AttemptRecord{At: durationpb.New(time.Second), AccountId: b.Id, Status: 200, Class: weirv1.OutcomeClass_OUTCOME_CLASS_SUCCESS, Usage: write})
	report("s1", b.Id, 3*time.Minute, 529, nil) // not served: no miss
	expired := report("s1", b.Id, 20*time.Minute, 200, write)
	report("s2", a.Id, 0, 200, write)
	prefix := report("s2", a.Id, time.Minute, 200, write)

	resp, err := e.admin.usage.ExplainCache(t.Context(), connect.NewRequest(&weirv1.ExplainCacheRequest{Key: "alice",
		Since: timestamppb.New(epoch.Add(-time.Hour)), Until: timestamppb.New(epoch.Add(time.Hour))}))
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]*weirv1.SessionCache{}
	for _, s := range resp.Msg.Sessions {
		byKey[s.SessionKey] = s
	}
	s1, s2 := byKey["s1"], byKey["s2"]
	if s1 == nil || s2 == nil || len(resp.Msg.Sessions) != 2 {
		t.Fatalf("sessions: %v", resp.Msg.Sessions)
	}
	if s1.Requests != 4 || s1.KeyName != "alice" || len(s1.Misses) != 2 || s1.Causes["moved"] != 1 || s1.Causes["expired"] != 1 {
		t.Errorf("s1: %v", s1)
	}
	if m := s1.Misses[0]; m.RequestId != moved || m.Cause != "moved" || m.PreviousAccountLabel != "max-a" || m.AccountLabel != "max-b" ||
		!strings.Contains(m.Why, "failover: max-a answered 529 overloaded_error") || m.UncachedInputTokens != 20010 {
		t.Errorf("the failover miss: %v", m)
	}
	if m := s1.Misses[1]; m.RequestId != expired || m.Cause != "expired" || m.Gap.AsDuration() != 18*time.Minute {
		t.Errorf("the expired miss: %v", m)
	}
	if len(s2.Misses) != 1 || s2.Misses[0].RequestId != prefix || s2.Misses[0].Cause != "prefix_changed" {
		t.Errorf("s2: %v", s2)
	}
	// 20,000 read of 4 requests' 10·4 + 20,000 read + 3·20,000 + 300 written.
	if want := hitRatio(40, 20000, 60300); s1.CacheHitRatio != want {
		t.Errorf("s1 hit ratio %v, want %v", s1.CacheHitRatio, want)
	}
	// The costliest session first.
	if resp.Msg.Sessions[0].SessionKey != "s1" {
		t.Errorf("order: %v first", resp.Msg.Sessions[0].SessionKey)
	}
}
