package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
	"github.com/weirhq/weir/internal/poolstatus"
)

// TestStatusSpills: the spills of the last day, summed per account and
// surface (most first, older ones and non-spills left out), as text and
// as JSON; and the line that says there were none.
func TestStatusSpills(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	accts := []*weirv1.Account{{Id: "id-oai", Label: "oai"}, {Id: "id-key", Label: "team-key"}}
	ev := func(account, surface string, ago time.Duration, spilled bool) *weirv1.RouteEvent {
		return &weirv1.RouteEvent{AccountId: account, Surface: surface, StartedAt: timestamppb.New(now.Add(-ago)), SpilledToMetered: spilled}
	}
	events := []*weirv1.RouteEvent{
		ev("id-key", "messages", time.Hour, true),
		ev("id-oai", "responses", 3*time.Minute, true),
		ev("id-oai", "responses", 2*time.Hour, true),
		ev("id-oai", "responses", time.Minute, false),
		ev("id-oai", "responses", 25*time.Hour, true),
		ev("gone", "responses", time.Minute, true),
	}
	got := poolstatus.Spills(events, accts, now)
	want := []poolstatus.Spill{
		{Account: "oai", Surface: "responses", Requests: 2, Latest: now.Add(-3 * time.Minute)},
		{Account: "team-key", Surface: "messages", Requests: 1, Latest: now.Add(-time.Hour)},
		{Account: "(deleted account)", Surface: "responses", Requests: 1, Latest: now.Add(-time.Minute)},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("spills %+v, want %+v", got, want)
	}
	var b strings.Builder
	if err := printStatus(&b, poolstatus.Status{At: now, Spills: got}, false); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"Spills to metered accounts in the last 24h: 4 requests served by a metered account because no subscription could",
		"oai", "responses", "3m0s ago", "team-key",
	} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("status lacks %q:\n%s", line, b.String())
		}
	}
	b.Reset()
	if err := printStatus(&b, poolstatus.Status{At: now}, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "No spills to metered accounts in the last 24h.") {
		t.Errorf("no spills:\n%s", b.String())
	}
}

// TestStatusShowsAStorm: a storm is what status shows, not "Nothing is
// wrong": the open breaker, the accounts that answered overloaded, and
// the requests held now by model and reason, the longest first.
func TestStatusShowsAStorm(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(now.Add(-d)) }
	accts := []*weirv1.Account{
		{Label: "max-1", Provider: weirv1.Provider_PROVIDER_ANTHROPIC, State: weirv1.AccountState_ACCOUNT_STATE_ACTIVE, OverloadedAt: ago(3 * time.Second)},
		{Label: "max-2", Provider: weirv1.Provider_PROVIDER_ANTHROPIC, State: weirv1.AccountState_ACCOUNT_STATE_ACTIVE, OverloadedAt: ago(time.Hour)},
	}
	st := poolstatus.Build(accts, &weirv1.Settings{}, nil, now)
	const why = "the provider is overloaded for sonnet models; weir is probing it before sending more"
	st.Held = poolstatus.HeldNow([]*weirv1.RouteEvent{
		{RequestId: "weir_1", Model: "claude-sonnet-4-5", Pending: true, HeldSince: ago(20 * time.Second), HoldReason: why},
		{RequestId: "weir_2", Model: "claude-sonnet-4-5", Pending: true, HeldSince: ago(50 * time.Second), HoldReason: why},
		{RequestId: "weir_3", Model: "claude-opus-4-1", Pending: true, HeldSince: ago(5 * time.Second), HoldReason: "all 2 eligible accounts were tried for this request"},
		{RequestId: "weir_4", Model: "claude-opus-4-1", Pending: true}, // in progress, not held
	}, now)
	st.Breakers = poolstatus.Breakers([]*weirv1.Breaker{{Provider: "anthropic", Family: "sonnet", NextProbeAt: timestamppb.New(now.Add(time.Second)),
		ProbeEvery: durationpb.New(time.Second), Overloads: 7}})
	if len(st.Held) != 2 || st.Held[0].Requests != 2 || st.Held[0].Longest != 50*time.Second || st.Held[0].Request != "weir_2" {
		t.Errorf("held %+v, want sonnet's two first, the longest 50s (weir_2)", st.Held)
	}
	var b strings.Builder
	if err := printStatus(&b, st, false); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"anthropic sonnet: breaker open", "Held now: 3 requests", "weir_2", why,
		"overloaded  max-1: answered overloaded 3s ago"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	for _, unwanted := range []string{"Nothing is wrong", "max-2"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("status says %q during a storm:\n%s", unwanted, out)
		}
	}
}

// TestStatusNamesBrokenAndUnreadable: an account its check found broken,
// and one whose credential this control plane cannot open (shown broken
// by the control plane at once), are what is wrong; not "Nothing is
// wrong".
func TestStatusNamesBrokenAndUnreadable(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	const rejected = "credential rejected by the upstream (checked when added: models endpoint answered 401)"
	accts := []*weirv1.Account{
		{Label: "fine", Provider: weirv1.Provider_PROVIDER_ANTHROPIC, State: weirv1.AccountState_ACCOUNT_STATE_ACTIVE, Check: weirv1.AccountCheck_ACCOUNT_CHECK_GOOD},
		{Label: "revoked", Provider: weirv1.Provider_PROVIDER_ANTHROPIC, State: weirv1.AccountState_ACCOUNT_STATE_BROKEN,
			Check: weirv1.AccountCheck_ACCOUNT_CHECK_BROKEN, BrokenReason: rejected, CheckReason: rejected},
		{Label: "sealed-elsewhere", Provider: weirv1.Provider_PROVIDER_OPENAI, State: weirv1.AccountState_ACCOUNT_STATE_BROKEN,
			Check: weirv1.AccountCheck_ACCOUNT_CHECK_BROKEN, CredentialUnreadable: true,
			BrokenReason: "unreadable_credential: the sealed credential opens with none of a control plane's secret keys"},
	}
	var b strings.Builder
	if err := printStatus(&b, poolstatus.Build(accts, &weirv1.Settings{}, nil, now), false); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"revoked: " + rejected, "sealed-elsewhere: unreadable_credential"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Nothing is wrong") || strings.Contains(out, "fine:") {
		t.Errorf("status:\n%s", out)
	}
}
