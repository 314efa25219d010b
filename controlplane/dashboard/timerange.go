package dashboard

import (
	"errors"
	"fmt"
	"html/template"
	"net/url"
	"strings"
	"time"
)

// usageRanges are the presets of the Usage and prompt cache pages; custom
// reads since and until.
var usageRanges = []struct {
	Name string
	D    time.Duration
}{{"1h", time.Hour}, {"24h", 24 * time.Hour}, {"7d", 7 * 24 * time.Hour}, {"30d", 30 * 24 * time.Hour}}

// localLayout is a datetime-local input's value.
const localLayout = "2006-01-02T15:04"

// timeRange is a page's range: as asked (for the form and links) and as
// it resolves.
type timeRange struct {
	// Range is a preset's name or "custom".
	Range string
	// SinceText and UntilText are the custom bounds as typed.
	SinceText, UntilText string
	// TZ is the time zone as typed; "" is UTC.
	TZ           string
	Since, Until time.Time
	loc          *time.Location
}

// parseRange reads range, since, until and tz. A page without a range
// shows def, or custom when since is given.
func parseRange(q url.Values, now time.Time, def string) (timeRange, error) {
	r := timeRange{Range: strings.TrimSpace(q.Get("range")), TZ: strings.TrimSpace(q.Get("tz")),
		SinceText: strings.TrimSpace(q.Get("since")), UntilText: strings.TrimSpace(q.Get("until")), loc: time.UTC}
	if r.TZ != "" && r.TZ != "UTC" {
		loc, err := time.LoadLocation(r.TZ)
		if err != nil || r.TZ == "Local" {
			return r, fmt.Errorf("tz: %q is not an IANA time zone (UTC, Europe/Berlin, America/New_York)", r.TZ)
		}
		r.loc = loc
	}
	if r.Range == "" {
		r.Range = def
		if r.SinceText != "" {
			r.Range = "custom"
		}
	}
	if r.Range == "custom" {
		if r.SinceText == "" {
			return r, errors.New("since: a custom range needs its start")
		}
		var err error
		if r.Since, err = parseLocal(r.SinceText, r.loc); err != nil {
			return r, fmt.Errorf("since: %w", err)
		}
		r.Until = now
		if r.UntilText != "" {
			if r.Until, err = parseLocal(r.UntilText, r.loc); err != nil {
				return r, fmt.Errorf("until: %w", err)
			}
		}
		if !r.Since.Before(r.Until) {
			return r, errors.New("since: must be before until")
		}
		return r, nil
	}
	for _, p := range usageRanges {
		if p.Name == r.Range {
			r.Since, r.Until = now.Add(-p.D), now
			return r, nil
		}
	}
	return r, fmt.Errorf("range: %q is not one of 1h, 24h, 7d, 30d or custom", r.Range)
}

// parseLocal reads a point in time: a date or a date and time in loc, or
// an RFC 3339 time.
func parseLocal(s string, loc *time.Location) (time.Time, error) {
	for _, layout := range []string{localLayout, "2006-01-02T15:04:05", "2006-01-02 15:04", time.DateOnly} {
		if t, err := time.ParseInLocation(layout, s, loc); err == nil {
			return t, nil
		}
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%q is not a date (2030-03-04), a time (2030-03-04T05:00) or an RFC 3339 time", s)
}

// SinceInput and UntilInput are the range's bounds as the form's
// datetime-local fields show them: a preset's too, so that switching to
// custom starts from it. An open custom end (now) stays empty.
func (r timeRange) SinceInput() string {
	if r.Since.IsZero() {
		return r.SinceText
	}
	return r.Since.In(r.loc).Format(localLayout)
}

func (r timeRange) UntilInput() string {
	if r.Until.IsZero() || (r.Range == "custom" && r.UntilText == "") {
		return r.UntilText
	}
	return r.Until.In(r.loc).Format(localLayout)
}

// Zone names the range's time zone.
func (r timeRange) Zone() string { return r.loc.String() }

// values are the range's query parameters: a preset's name, or custom
// with its bounds.
func (r timeRange) values() url.Values {
	v := url.Values{"range": {r.Range}}
	if r.Range == "custom" {
		v.Set("since", r.SinceText)
		if r.UntilText != "" {
			v.Set("until", r.UntilText)
		}
	}
	if r.TZ != "" {
		v.Set("tz", r.TZ)
	}
	return v
}

// RangeQuery is the range as a query string, for links to the other
// usage pages (a URL part: built by url.Values, safe in an href).
func (r timeRange) RangeQuery() template.URL { return template.URL(r.values().Encode()) } //nolint:gosec // url.Values encoded it

// Presets are the preset names, for the form.
func (r timeRange) Presets() []string {
	out := make([]string, 0, len(usageRanges))
	for _, p := range usageRanges {
		out = append(out, p.Name)
	}
	return out
}

// fmtIn formats t in the range's zone.
func (r timeRange) fmtIn(t time.Time, layout string) string { return t.In(r.loc).Format(layout) }
