package controlplane

import (
	"testing"
	"time"
)

// TestUsagePeriods: a key's day, week (from Monday) and month in the
// budget time zone, across a daylight-saving change and a month's end; an
// unknown zone is UTC.
func TestUsagePeriods(t *testing.T) {
	t.Parallel()
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		now  time.Time
		tz   string
		want [3][2]time.Time // day, week, month: start and end
	}{
		{
			name: "a Sunday night in New York is still Sunday, in the week that began Monday",
			now:  time.Date(2030, 3, 11, 2, 30, 0, 0, time.UTC), // Sunday 22:30 EDT
			tz:   "America/New_York",
			want: [3][2]time.Time{
				{time.Date(2030, 3, 10, 0, 0, 0, 0, ny), time.Date(2030, 3, 11, 0, 0, 0, 0, ny)},
				{time.Date(2030, 3, 4, 0, 0, 0, 0, ny), time.Date(2030, 3, 11, 0, 0, 0, 0, ny)}, // across the change to EDT
				{time.Date(2030, 3, 1, 0, 0, 0, 0, ny), time.Date(2030, 4, 1, 0, 0, 0, 0, ny)},
			},
		},
		{
			name: "the last day of a month, in UTC",
			now:  time.Date(2030, 1, 31, 23, 59, 0, 0, time.UTC), // a Thursday
			tz:   "UTC",
			want: [3][2]time.Time{
				{time.Date(2030, 1, 31, 0, 0, 0, 0, time.UTC), time.Date(2030, 2, 1, 0, 0, 0, 0, time.UTC)},
				{time.Date(2030, 1, 28, 0, 0, 0, 0, time.UTC), time.Date(2030, 2, 4, 0, 0, 0, 0, time.UTC)},
				{time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2030, 2, 1, 0, 0, 0, 0, time.UTC)},
			},
		},
		{
			name: "an unknown zone is UTC",
			now:  time.Date(2030, 1, 7, 0, 0, 0, 0, time.UTC), // a Monday, at its first instant
			tz:   "Nowhere/Atlantis",
			want: [3][2]time.Time{
				{time.Date(2030, 1, 7, 0, 0, 0, 0, time.UTC), time.Date(2030, 1, 8, 0, 0, 0, 0, time.UTC)},
				{time.Date(2030, 1, 7, 0, 0, 0, 0, time.UTC), time.Date(2030, 1, 14, 0, 0, 0, 0, time.UTC)},
				{time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2030, 2, 1, 0, 0, 0, 0, time.UTC)},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := usagePeriods(tc.now, tc.tz)
			for i, name := range []string{"day", "week", "month"} {
				if got[i].name != name || !got[i].start.Equal(tc.want[i][0]) || !got[i].end.Equal(tc.want[i][1]) {
					t.Errorf("%s: %s %v to %v, want %v to %v", name, got[i].name, got[i].start, got[i].end, tc.want[i][0], tc.want[i][1])
				}
			}
		})
	}
}
