package upstream

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

func TestCodexHeaderReadings(t *testing.T) {
	t.Parallel()
	now := epoch
	soon, later := now.Add(3*time.Hour), now.Add(100*time.Hour)
	at := func(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }
	hdr := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m["x-codex-"+kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name string
		h    map[string]string
		want []Reading
	}{
		{
			name: "both windows",
			h: hdr("primary-used-percent", "45", "primary-window-minutes", "300", "primary-reset-at", at(soon),
				"secondary-used-percent", "94.5", "secondary-window-minutes", "10080", "secondary-reset-at", at(later)),
			want: []Reading{
				{Window: FiveHour, Utilization: f64(0.45), ResetsAt: &soon},
				{Window: SevenDay, Utilization: f64(0.945), ResetsAt: &later},
			},
		},
		{
			name: "named by length, not position",
			h: hdr("primary-used-percent", "10", "primary-window-minutes", "10080", "primary-reset-at", at(later),
				"secondary-used-percent", "20", "secondary-window-minutes", "300", "secondary-reset-at", at(soon)),
			want: []Reading{
				{Window: SevenDay, Utilization: f64(0.1), ResetsAt: &later},
				{Window: FiveHour, Utilization: f64(0.2), ResetsAt: &soon},
			},
		},
		{
			name: "unknown lengths go by position",
			h: hdr("primary-used-percent", "10", "primary-window-minutes", "60", "primary-reset-at", at(soon),
				"secondary-used-percent", "20", "secondary-reset-at", at(later)),
			want: []Reading{
				{Window: FiveHour, Utilization: f64(0.1), ResetsAt: &soon},
				{Window: SevenDay, Utilization: f64(0.2), ResetsAt: &later},
			},
		},
		{name: "100 is a reading", h: hdr("primary-used-percent", "100", "primary-window-minutes", "300", "primary-reset-at", at(soon)),
			want: []Reading{{Window: FiveHour, Utilization: f64(1), ResetsAt: &soon}}},
		{name: "0 is a reading", h: hdr("primary-used-percent", "0", "primary-window-minutes", "300", "primary-reset-at", at(soon)),
			want: []Reading{{Window: FiveHour, Utilization: f64(0), ResetsAt: &soon}}},
		{name: "above 100", h: hdr("primary-used-percent", "101", "primary-reset-at", at(soon))},
		{name: "negative", h: hdr("primary-used-percent", "-1", "primary-reset-at", at(soon))},
		{name: "not a number", h: hdr("primary-used-percent", "NaN", "primary-reset-at", at(soon))},
		{name: "reset in the past", h: hdr("primary-used-percent", "5", "primary-reset-at", at(now.Add(-time.Second)))},
		{name: "reset exactly now", h: hdr("primary-used-percent", "5", "primary-reset-at", at(now))},
		{name: "no reset", h: hdr("primary-used-percent", "5", "primary-window-minutes", "300")},
		{name: "two windows of one length: the first counts",
			h: hdr("primary-used-percent", "5", "primary-window-minutes", "300", "primary-reset-at", at(soon),
				"secondary-used-percent", "9", "secondary-window-minutes", "300", "secondary-reset-at", at(soon)),
			want: []Reading{{Window: FiveHour, Utilization: f64(0.05), ResetsAt: &soon}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requireReadings(t, HeaderReadings(tc.h, now), tc.want)
		})
	}
}

func TestParseCodexUsage(t *testing.T) {
	t.Parallel()
	now := epoch
	soon, later := now.Add(3*time.Hour), now.Add(100*time.Hour)
	win := func(pct float64, secs int64, resetAt time.Time) string {
		return fmt.Sprintf(`{"used_percent":%v,"limit_window_seconds":%d,"reset_after_seconds":%d,"reset_at":%d}`,
			pct, secs, int64(resetAt.Sub(now)/time.Second), resetAt.Unix())
	}
	body := func(primary, secondary string) string {
		return `{"plan_type":"plus","rate_limit":{"allowed":true,"limit_reached":false,"primary_window":` + primary + `,"secondary_window":` + secondary + `},"credits":null}`
	}
	for _, tc := range []struct {
		name    string
		body    string
		want    []Reading
		wantErr bool
	}{
		{name: "both windows", body: body(win(25, 18000, soon), win(62, 604800, later)), want: []Reading{
			{Window: FiveHour, Utilization: f64(0.25), ResetsAt: &soon},
			{Window: SevenDay, Utilization: f64(0.62), ResetsAt: &later},
		}},
		{name: "by length: a weekly primary", body: body(win(40, 604800, later), "null"), want: []Reading{
			{Window: SevenDay, Utilization: f64(0.4), ResetsAt: &later},
		}},
		{name: "unknown length by position", body: body("null", win(10, 3600, soon)), want: []Reading{
			{Window: SevenDay, Utilization: f64(0.1), ResetsAt: &soon},
		}},
		{name: "null windows", body: body("null", "null")},
		{name: "no rate_limit", body: `{"plan_type":"free"}`},
		{name: "reset_after_seconds without reset_at", body: body(`{"used_percent":5,"limit_window_seconds":18000,"reset_after_seconds":60}`, "null"),
			want: []Reading{{Window: FiveHour, Utilization: f64(0.05), ResetsAt: tm(now.Add(time.Minute))}}},
		{name: "above 100 is spent", body: body(win(130, 18000, soon), "null"), want: []Reading{
			{Window: FiveHour, Utilization: f64(1), ResetsAt: &soon},
		}},
		{name: "not JSON", body: `<html>`, wantErr: true},
		{name: "a window that is not one", body: body(`"x"`, "null"), wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCodexUsage([]byte(tc.body), now)
			if tc.wantErr {
				if err == nil {
					t.Fatal("want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			requireReadings(t, got, tc.want)
		})
	}
}
