package main

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	weirv1 "github.com/weirhq/weir/gen/weir/v1"
)

func TestPrintForecasts(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 5, 12, 0, 0, 0, time.UTC)
	var b strings.Builder
	printForecasts(&b, &weirv1.Account{Forecasts: []*weirv1.Forecast{
		{Window: "five_hour", BurnPerHour: 0.3, ExhaustsAt: timestamppb.New(now.Add(40 * time.Minute))},
		{Window: "seven_day", BurnPerHour: 0.02, ExhaustsAt: timestamppb.New(now.Add(3*time.Hour + 10*time.Minute))},
		{Window: "seven_day_opus", BurnPerHour: 0},
		{Window: "seven_day_sonnet", BurnPerHour: 0.5, ExhaustsAt: timestamppb.New(now.Add(-time.Minute))},
	}}, now)
	got := b.String()
	for _, want := range []string{"WINDOW", "five_hour", "30.0%/h", "full in 40m", "seven_day ", "2.0%/h", "full in 3h", "not before reset", "full now"} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	b.Reset()
	printForecasts(&b, &weirv1.Account{}, now)
	if b.Len() != 0 {
		t.Errorf("no forecasts printed %q", b.String())
	}
}
