package upstream

import (
	"strconv"
	"testing"
	"time"
)

func TestParseAnthropicUsage(t *testing.T) {
	t.Parallel()
	reset := time.Date(2030, 3, 4, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		body string
		want []Reading
		err  bool
	}{
		{
			name: "percent becomes a fraction; ISO resets; null windows absent",
			body: `{"five_hour":{"utilization":45.2,"resets_at":"2030-03-04T10:00:00Z"},
				"seven_day":{"utilization":100,"resets_at":"2030-03-04T10:00:00.123456+00:00"},
				"seven_day_oauth_apps":null,"seven_day_opus":null,"seven_day_sonnet":null,
				"extra_usage":{"is_enabled":false}}`,
			want: []Reading{
				{Window: FiveHour, Utilization: f64(0.452), ResetsAt: tm(reset)},
				{Window: SevenDay, Utilization: f64(1), ResetsAt: tm(reset.Add(123456 * time.Microsecond))},
			},
		},
		{
			name: "zero is evidence, not absence; a window without a reset keeps its utilization",
			body: `{"five_hour":{"utilization":0,"resets_at":null},"seven_day_opus":{"utilization":12.5,"resets_at":"2030-03-04T10:00:00Z"}}`,
			want: []Reading{
				{Window: FiveHour, Utilization: f64(0)},
				{Window: SevenDayOpus, Utilization: f64(0.125), ResetsAt: tm(reset)},
			},
		},
		{
			name: "null utilization is no evidence, never 0; the reset still counts",
			body: `{"seven_day":{"utilization":null,"resets_at":"2030-03-04T10:00:00Z"},"seven_day_sonnet":{"utilization":null,"resets_at":null}}`,
			want: []Reading{{Window: SevenDay, ResetsAt: tm(reset)}},
		},
		{
			name: "over 100 is spent; negative is no evidence",
			body: `{"five_hour":{"utilization":104,"resets_at":"2030-03-04T10:00:00Z"},"seven_day":{"utilization":-3,"resets_at":"2030-03-04T10:00:00Z"}}`,
			want: []Reading{
				{Window: FiveHour, Utilization: f64(1), ResetsAt: tm(reset)},
				{Window: SevenDay, ResetsAt: tm(reset)},
			},
		},
		{
			name: "an unreadable reset is no reset",
			body: `{"seven_day_oauth_apps":{"utilization":7,"resets_at":"next tuesday"}}`,
			want: []Reading{{Window: SevenDayOAuthApps, Utilization: f64(0.07)}},
		},
		{name: "unknown windows are ignored", body: `{"seven_day_cowork":{"utilization":50,"resets_at":"2030-03-04T10:00:00Z"}}`},
		{name: "not an object", body: `[1,2]`, err: true},
		{name: "a window that is not one", body: `{"five_hour":"45%"}`, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseAnthropicUsage([]byte(tc.body))
			if (err != nil) != tc.err {
				t.Fatalf("err %v, want error %v", err, tc.err)
			}
			requireReadings(t, got, tc.want)
		})
	}
}

func TestAnthropicHeaderReadings(t *testing.T) {
	t.Parallel()
	now := epoch
	later := now.Add(3 * time.Hour)
	hdr := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m["anthropic-ratelimit-unified-"+kv[i]] = kv[i+1]
		}
		return m
	}
	at := strconv.FormatInt(later.Unix(), 10)
	for _, tc := range []struct {
		name string
		h    map[string]string
		want []Reading
	}{
		{
			name: "allowed and allowed_warning count",
			h: hdr("5h-status", "allowed", "5h-utilization", "0.45", "5h-reset", at,
				"7d-status", "allowed_warning", "7d-utilization", "0.94", "7d-reset", at),
			want: []Reading{
				{Window: FiveHour, Utilization: f64(0.45), ResetsAt: &later},
				{Window: SevenDay, Utilization: f64(0.94), ResetsAt: &later},
			},
		},
		{
			name: "rejected does not count",
			h:    hdr("5h-status", "rejected", "5h-utilization", "1.0", "5h-reset", at, "7d-status", "allowed", "7d-utilization", "0.2", "7d-reset", at),
			want: []Reading{{Window: SevenDay, Utilization: f64(0.2), ResetsAt: &later}},
		},
		{name: "no status does not count", h: hdr("5h-utilization", "0.45", "5h-reset", at)},
		{name: "utilization above 1", h: hdr("5h-status", "allowed", "5h-utilization", "1.2", "5h-reset", at)},
		{name: "negative utilization", h: hdr("5h-status", "allowed", "5h-utilization", "-0.1", "5h-reset", at)},
		{name: "utilization not a number", h: hdr("5h-status", "allowed", "5h-utilization", "NaN", "5h-reset", at)},
		{name: "reset in the past", h: hdr("5h-status", "allowed", "5h-utilization", "0.3", "5h-reset", strconv.FormatInt(now.Add(-time.Second).Unix(), 10))},
		{name: "reset exactly now", h: hdr("5h-status", "allowed", "5h-utilization", "0.3", "5h-reset", strconv.FormatInt(now.Unix(), 10))},
		{name: "no reset", h: hdr("5h-status", "allowed", "5h-utilization", "0.3")},
		{
			name: "scoped windows are not account-wide windows",
			h:    hdr("7d_oi-status", "allowed", "7d_oi-utilization", "0.5", "7d_oi-reset", at),
		},
		{
			name: "0 is a reading",
			h:    hdr("5h-status", "allowed", "5h-utilization", "0", "5h-reset", at),
			want: []Reading{{Window: FiveHour, Utilization: f64(0), ResetsAt: &later}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requireReadings(t, HeaderReadings(tc.h, now), tc.want)
		})
	}
}
