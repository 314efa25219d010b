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
	serving := servingNow(accts)
	if w := pauseWarning(accts[0], serving); !strings.Contains(w, "Messages") {
		t.Errorf("the last active Anthropic account: %q", w)
	}
	if w := pauseWarning(accts[2], serving); w != "" {
		t.Errorf("a Codex login beside an OpenAI key: %q", w)
	}
	if w := pauseWarning(accts[3], serving); !strings.Contains(w, "Chat Completions") || strings.Contains(w, "Responses") {
		t.Errorf("the only OpenAI key: %q, want Chat Completions alone (Codex still serves Responses)", w)
	}
	if w := pauseWarning(accts[1], serving); w != "" {
		t.Errorf("a cooling account: %q", w)
	}
}

// An account out of quota reads "spent", with the cooldown that says when
// it is back; a broken one shows only why it is broken, no usage windows,
// gates or cooldown beside the point; a rate-limited one is cooling; an
// active one whose last answer, seconds ago, was overloaded reads
// overloaded, and one overloaded an hour ago active.
func TestAccountViewsStates(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
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
		{Id: "d", State: weirv1.AccountState_ACCOUNT_STATE_ACTIVE, OverloadedAt: timestamppb.New(now.Add(-5 * time.Second))},
		{Id: "e", State: weirv1.AccountState_ACCOUNT_STATE_ACTIVE, OverloadedAt: timestamppb.New(now.Add(-time.Hour))},
	}, now)
	if vs[0].State != "spent" || vs[0].Cooldown == nil {
		t.Errorf("out of quota: %+v", vs[0])
	}
	if v := vs[1]; v.State != "broken" || v.BrokenWhy == "" || v.Usage != nil || v.Gates != nil || v.Cooldown != nil {
		t.Errorf("broken: %+v", v)
	}
	if vs[2].State != "cooling" {
		t.Errorf("rate limited: %+v", vs[2])
	}
	if v := vs[3]; v.State != "overloaded" || v.OverloadedAt == nil {
		t.Errorf("overloaded 5s ago: %+v", v)
	}
	if vs[4].State != "active" {
		t.Errorf("overloaded an hour ago: %+v", vs[4])
	}
}

// The usage chart marks each reset a window's readings name (once, and
// only within the axis); the pool chart puts errors and holds on an axis
// of their own, so a few errors beside many requests still show.
func TestChartsResetsAndRightAxis(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	ax := timeAxis{from: now.Add(-6 * time.Hour), to: now.Add(90 * time.Minute)}
	reset, later := now.Add(-2*time.Hour), now.Add(3*time.Hour)
	s := usageSeries{Window: "5h", Points: []usagePoint{
		{At: now.Add(-4 * time.Hour), Utilization: 0.9, ResetsAt: reset},
		{At: now.Add(-3 * time.Hour), Utilization: 0.95, ResetsAt: reset},
		{At: now.Add(-time.Hour), Utilization: 0.1, ResetsAt: later},
	}}
	if got := s.resets(ax); len(got) != 1 || !got[0].Equal(reset) {
		t.Errorf("resets %v, want the one within the axis once", got)
	}
	if svg := string(usageChart("t", "t", ax, now, []usageSeries{s})); strings.Count(svg, `class="reset s0"`) != 1 {
		t.Errorf("usage chart has %d reset marks, want 1", strings.Count(svg, `class="reset s0"`))
	}
	svg := string(poolChart(ax, 10*time.Minute, now, []poolBucket{
		{Start: now.Add(-time.Hour), Requests: 5000, Errors: 3, Holds: 1},
		{Start: now.Add(-50 * time.Minute), Requests: 4000, Errors: 1},
	}))
	if !strings.Contains(svg, `class="err-line"`) || !strings.Contains(svg, `class="axis-right"`) || !strings.Contains(svg, `class="hold-dot"`) {
		t.Errorf("pool chart lacks its right axis, error line or hold dots: %s", svg)
	}
	// Three errors of a right axis up to 5 stand at 3/5 of the plot's
	// height (y 89.2), though requests are a thousand times more.
	if !strings.Contains(svg, `,89.2 `) {
		t.Errorf("the errors are not on their own axis: %s", svg)
	}
}
