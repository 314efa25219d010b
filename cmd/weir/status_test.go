package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
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
	got := sumSpills(events, accts, now)
	want := []spillStatus{
		{Account: "oai", Surface: "responses", Requests: 2, Latest: now.Add(-3 * time.Minute)},
		{Account: "team-key", Surface: "messages", Requests: 1, Latest: now.Add(-time.Hour)},
		{Account: "(deleted account)", Surface: "responses", Requests: 1, Latest: now.Add(-time.Minute)},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("spills %+v, want %+v", got, want)
	}
	var b strings.Builder
	if err := printStatus(&b, poolStatus{At: now, Spills: got}, false); err != nil {
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
	if err := printStatus(&b, poolStatus{At: now}, false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "No spills to metered accounts in the last 24h.") {
		t.Errorf("no spills:\n%s", b.String())
	}
}
