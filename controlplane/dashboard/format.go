package dashboard

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// funcs are the templates' helpers. Times print in UTC; "ago" and "in"
// use the dashboard's clock, so what the server renders is consistent
// with the deadlines it compares against.
func (h *Handler) funcs() template.FuncMap {
	return template.FuncMap{
		"utc":     func(t any) string { return utc(deref(t)) },
		"iso":     func(t any) string { return iso(deref(t)) },
		"stamp":   func(t any) string { return deref(t).UTC().Format("Jan 2 15:04:05") },
		"ago":     func(t any) string { v := deref(t); return h.ago(&v) },
		"in":      func(t any) string { return h.in(deref(t)) },
		"dur":     shortDuration,
		"pct":     func(f float64) string { return fmt.Sprintf("%.0f%%", f*100) },
		"pctw":    func(f float64) string { return fmt.Sprintf("%.1f", math.Max(0, math.Min(1, f))*100) },
		"refresh": func() int { return int(refreshEvery / time.Millisecond) },
		"count":   groupDigits,
		"usd":     dollars,
		"lower":   strings.ToLower,
		// accountOf is the account id an audit entry's target names, ""
		// when it names none.
		"accountOf": accountTarget,
	}
}

// deref takes a time or a pointer to one (nil is the zero time).
func deref(t any) time.Time {
	switch v := t.(type) {
	case time.Time:
		return v
	case *time.Time:
		if v != nil {
			return *v
		}
	}
	return time.Time{}
}

func utc(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}

func iso(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

func (h *Handler) ago(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "never"
	}
	d := h.cfg.Now().Sub(*t)
	if d < 0 {
		return "just now"
	}
	return shortDuration(d) + " ago"
}

func (h *Handler) in(t time.Time) string {
	d := t.Sub(h.cfg.Now())
	if d <= 0 {
		return "now"
	}
	return "in " + shortDuration(d)
}

// shortDuration is d in its two largest units: "3d 4h", "4m 12s", "850ms".
func shortDuration(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour && d%time.Minute == 0:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < time.Hour:
		return fmt.Sprintf("%dm %02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh %02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
}

func tsPtr(t *timestamppb.Timestamp) *time.Time {
	if t == nil {
		return nil
	}
	v := t.AsTime()
	return &v
}

func durText(d *durationpb.Duration) string {
	if d == nil {
		return "-"
	}
	return shortDuration(d.AsDuration())
}

// enumText is a proto enum's value without its prefix, lower case:
// "COOLDOWN_REASON_QUOTA_EXHAUSTED" → "quota exhausted".
func enumText(s, prefix string) string {
	s = strings.TrimPrefix(s, prefix)
	if s == "UNSPECIFIED" || s == "" {
		return "-"
	}
	return strings.ReplaceAll(strings.ToLower(s), "_", " ")
}

// windowText names a usage window for people.
func windowText(w string) string {
	switch w {
	case "five_hour":
		return "5h"
	case "seven_day":
		return "weekly"
	case "seven_day_opus":
		return "weekly opus"
	case "seven_day_sonnet":
		return "weekly sonnet"
	case "seven_day_oauth_apps":
		return "weekly apps"
	}
	return strings.ReplaceAll(w, "_", " ")
}

// groupDigits is a count with its thousands apart: 1234567 as 1,234,567.
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// dollars is an amount in US dollars: cents from a dollar up, else to the
// hundredth of a cent.
func dollars(v float64) string {
	if v != 0 && math.Abs(v) < 1 {
		return fmt.Sprintf("$%.4f", v)
	}
	whole, cents, _ := strings.Cut(fmt.Sprintf("%.2f", v), ".")
	n, _ := strconv.ParseInt(whole, 10, 64)
	return "$" + groupDigits(n) + "." + cents
}
