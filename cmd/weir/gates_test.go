package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

// TestPrintAccountsFamilyGates: a gated account stays active and says
// which family is gated until when; a cooling one says both.
func TestPrintAccountsFamilyGates(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 3, 4, 12, 0, 0, 0, time.UTC)
	ts := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(now.Add(d)) }
	accts := []*weirv1.Account{
		{Label: "max", State: weirv1.AccountState_ACCOUNT_STATE_ACTIVE, Id: "id-max",
			FamilyGates: []*weirv1.FamilyGate{{Family: "opus", Until: ts(14 * time.Hour)}}},
		{Label: "pro", State: weirv1.AccountState_ACCOUNT_STATE_COOLING, Id: "id-pro",
			Cooldown:    &weirv1.Cooldown{Reason: weirv1.CooldownReason_COOLDOWN_REASON_QUOTA_EXHAUSTED, Until: ts(3 * time.Hour)},
			FamilyGates: []*weirv1.FamilyGate{{Family: "opus", Until: ts(time.Hour)}, {Family: "sonnet", Until: ts(2 * time.Hour)}}},
		{Label: "team", State: weirv1.AccountState_ACCOUNT_STATE_COOLING, Id: "id-team",
			Cooldown: &weirv1.Cooldown{Reason: weirv1.CooldownReason_COOLDOWN_REASON_OUT_OF_CREDITS, Until: ts(6 * time.Hour)}},
	}
	var b bytes.Buffer
	printAccounts(&b, accts, now)
	out := b.String()
	for _, want := range []string{
		"active (opus gated until in 14h0m0s)",
		"cooling (quota_exhausted, until in 3h0m0s; opus gated until in 1h0m0s; sonnet gated until in 2h0m0s)",
		"cooling (out_of_credits, until in 6h0m0s)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("accounts list lacks %q:\n%s", want, out)
		}
	}
}
