package dashboard

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// The history charts' axis starts at the earliest data: a usage point or
// a bucket with requests or holds; an empty bucket is no data.
func TestFirstData(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	if _, ok := firstData(nil, nil); ok {
		t.Error("no data has a first")
	}
	series := []*weirv1.UsageSeries{{Points: []*weirv1.UsagePoint{{At: timestamppb.New(now.Add(-10 * time.Minute))}}}}
	buckets := []*weirv1.RouteBucket{
		{Start: timestamppb.New(now.Add(-time.Hour))},
		{Start: timestamppb.New(now.Add(-20 * time.Minute)), Requests: 3},
	}
	if got, ok := firstData(series, buckets); !ok || !got.Equal(now.Add(-20*time.Minute)) {
		t.Errorf("first %v %v, want 20 minutes ago (the empty bucket an hour ago is no data)", got, ok)
	}
}

// Pausing warns when it leaves a surface with no account that can serve
// now: the last active Codex login leaves Responses to the OpenAI key,
// so no warning; the last active Anthropic account leaves Messages bare.
func TestPauseWarning(t *testing.T) {
	t.Parallel()
	active, cooling := weirv1.AccountState_ACCOUNT_STATE_ACTIVE, weirv1.AccountState_ACCOUNT_STATE_COOLING
	accts := []*weirv1.Account{
		{Id: "claude-1", Provider: weirv1.Provider_PROVIDER_ANTHROPIC, State: active},
		{Id: "claude-2", Provider: weirv1.Provider_PROVIDER_ANTHROPIC, State: cooling},
		{Id: "codex-1", Provider: weirv1.Provider_PROVIDER_CODEX, State: active},
		{Id: "oai-1", Provider: weirv1.Provider_PROVIDER_OPENAI, State: active},
	}
	if w := pauseWarning(accts, "claude-1"); !strings.Contains(w, "Messages") {
		t.Errorf("the last active Anthropic account: %q", w)
	}
	if w := pauseWarning(accts, "codex-1"); w != "" {
		t.Errorf("a Codex login beside an OpenAI key: %q", w)
	}
	if w := pauseWarning(accts, "oai-1"); !strings.Contains(w, "Chat Completions") || strings.Contains(w, "Responses") {
		t.Errorf("the only OpenAI key: %q, want Chat Completions alone (Codex still serves Responses)", w)
	}
	if w := pauseWarning(accts, "claude-2"); w != "" {
		t.Errorf("a cooling account: %q", w)
	}
}

// An account out of quota reads "spent", with the cooldown that says when
// it is back; a broken one shows only why it is broken, no usage windows,
// gates or cooldown beside the point; a rate-limited one is cooling.
func TestAccountViewsStates(t *testing.T) {
	t.Parallel()
	until := timestamppb.New(time.Date(2030, 1, 1, 14, 0, 0, 0, time.UTC))
	used := 0.08
	win := []*weirv1.UsageWindow{{Window: "five_hour", Utilization: &used}}
	vs := accountViews([]*weirv1.Account{
		{Id: "a", State: weirv1.AccountState_ACCOUNT_STATE_COOLING, Usage: win,
			Cooldown: &weirv1.Cooldown{Reason: weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, Until: until}},
		{Id: "b", State: weirv1.AccountState_ACCOUNT_STATE_BROKEN, BrokenReason: "401 invalid x-api-key", Usage: win,
			Cooldown:    &weirv1.Cooldown{Reason: weirv1.CooldownReason_COOLDOWN_REASON_INVALID_CREDENTIAL, Until: until},
			FamilyGates: []*weirv1.FamilyGate{{Family: "opus", Until: until}}},
		{Id: "c", State: weirv1.AccountState_ACCOUNT_STATE_COOLING,
			Cooldown: &weirv1.Cooldown{Reason: weirv1.CooldownReason_COOLDOWN_REASON_RATE_LIMITED, Until: until}},
	})
	if vs[0].State != "spent" || vs[0].Cooldown == nil {
		t.Errorf("out of quota: %+v", vs[0])
	}
	if v := vs[1]; v.State != "broken" || v.BrokenWhy == "" || v.Usage != nil || v.Gates != nil || v.Cooldown != nil {
		t.Errorf("broken: %+v", v)
	}
	if vs[2].State != "cooling" {
		t.Errorf("rate limited: %+v", vs[2])
	}
}
