package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

func TestPrintAccountsUsageColumns(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 3, 4, 12, 0, 0, 0, time.UTC)
	ts := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(now.Add(d)) }
	u := func(f float64) *float64 { return &f }
	accts := []*weirv1.Account{
		{Label: "max", AuthKind: weirv1.AuthKind_AUTH_KIND_OAUTH, State: weirv1.AccountState_ACCOUNT_STATE_ACTIVE, Id: "id-max",
			Usage: []*weirv1.UsageWindow{
				{Window: "five_hour", Utilization: u(0.452), ResetsAt: ts(3*time.Hour + 20*time.Minute)},
				{Window: "seven_day", Utilization: u(0.94), ResetsAt: ts(100 * time.Hour)},
				{Window: "seven_day_opus", Utilization: u(1), ResetsAt: ts(time.Hour)},
			}},
		{Label: "pro", AuthKind: weirv1.AuthKind_AUTH_KIND_OAUTH, State: weirv1.AccountState_ACCOUNT_STATE_ACTIVE, Id: "id-pro",
			Usage: []*weirv1.UsageWindow{
				// No evidence of the level: "-", never 0%.
				{Window: "five_hour", ResetsAt: ts(time.Hour)},
				// A window that has reset since it was read says nothing of now.
				{Window: "seven_day", Utilization: u(0.5), ResetsAt: ts(-time.Minute)},
			}},
		{Label: "fresh", AuthKind: weirv1.AuthKind_AUTH_KIND_OAUTH, State: weirv1.AccountState_ACCOUNT_STATE_ACTIVE, Id: "id-fresh",
			Usage: []*weirv1.UsageWindow{{Window: "five_hour", Utilization: u(0), ResetsAt: ts(30 * time.Second)}}},
		{Label: "team", AuthKind: weirv1.AuthKind_AUTH_KIND_API_KEY, State: weirv1.AccountState_ACCOUNT_STATE_ACTIVE, Id: "id-team"},
	}
	var b bytes.Buffer
	printAccounts(&b, accts, now)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("%d lines:\n%s", len(lines), b.String())
	}
	if f := strings.Fields(lines[0]); f[5] != "5H" || f[6] != "7D" {
		t.Fatalf("header %q: want 5H and 7D after STATE", lines[0])
	}
	for i, want := range [][2]string{
		{"45% ↺3h", "94% ↺4d"},
		{"-", "-"},
		{"0% ↺<1m", "-"},
		{"-", "-"},
	} {
		line := lines[i+1]
		cells := columns(lines[0], line)
		if cells["5H"] != want[0] || cells["7D"] != want[1] {
			t.Errorf("%s: 5H %q 7D %q, want %q %q\n%s", accts[i].Label, cells["5H"], cells["7D"], want[0], want[1], b.String())
		}
	}
}

// columns cuts the 5H and 7D cells out of a table row, by where the
// header puts them (tabwriter aligns by runes).
func columns(header, row string) map[string]string {
	at := func(name string) int { return len([]rune(header[:strings.Index(header, name)])) }
	r := []rune(row)
	cell := func(from, to int) string { return strings.TrimSpace(string(r[from:min(to, len(r))])) }
	return map[string]string{
		"5H": cell(at("5H"), at("7D")),
		"7D": cell(at("7D"), at("CHECK")),
	}
}

func TestPrintUsage(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 3, 4, 12, 0, 0, 0, time.UTC)
	half := 0.5
	acct := &weirv1.Account{Label: "max", UsageReadAt: timestamppb.New(now.Add(-time.Minute)), Usage: []*weirv1.UsageWindow{
		{Window: "five_hour", Utilization: &half, ResetsAt: timestamppb.New(now.Add(2 * time.Hour)), Source: "poll", ObservedAt: timestamppb.New(now.Add(-time.Minute))},
	}}
	for _, tc := range []struct {
		name string
		r    *weirv1.RefreshUsageResponse
		want []string
	}{
		{"read", &weirv1.RefreshUsageResponse{Read: true, NextReadAllowedAt: timestamppb.New(now.Add(150 * time.Second)), Account: acct},
			[]string{"read now", "five_hour", "50.0%", "in 2h0m0s", "poll", "1m0s ago"}},
		{"refused", &weirv1.RefreshUsageResponse{NextReadAllowedAt: timestamppb.New(now.Add(100 * time.Second)), Account: acct},
			[]string{"not read: the next read is allowed at", "(in 1m40s)"}},
		{"failed", &weirv1.RefreshUsageResponse{Read: true, Error: "usage endpoint answered 429", NextReadAllowedAt: timestamppb.New(now.Add(450 * time.Second)), Account: acct},
			[]string{"read failed: usage endpoint answered 429", "(in 7m30s)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			printUsage(&b, tc.r, now)
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
}
