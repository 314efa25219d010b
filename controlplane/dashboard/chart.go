package dashboard

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"
)

// Charts are inline SVG drawn here: no script, no library, and they print.
// The drawing is in a fixed 800×220 viewBox that scales with the page.

const (
	chartW, chartH         = 800.0, 220.0
	plotL, plotR           = 62.0, 790.0
	plotT, plotB           = 22.0, 190.0
	chartFontAttrs         = `font-size="11" fill="currentColor"`
	seriesClasses          = 5
	forecastHorizonDivisor = 4
)

// timeAxis maps times onto the plot's x.
type timeAxis struct{ from, to time.Time }

func (a timeAxis) x(t time.Time) float64 {
	span := a.to.Sub(a.from).Seconds()
	return plotL + (plotR-plotL)*t.Sub(a.from).Seconds()/span
}

// label formats an axis tick: clock time within a day, else the date.
func (a timeAxis) label(t time.Time) string {
	if a.to.Sub(a.from) > 36*time.Hour {
		return t.UTC().Format("Jan 2 15:04")
	}
	return t.UTC().Format("15:04")
}

func yFrac(f float64) float64 {
	return plotB - (plotB-plotT)*math.Max(0, math.Min(1.05, f))
}

// usageSeries is one window's line on a usage chart.
type usageSeries struct {
	Window string
	Class  int
	Points []usagePoint
	// Now and Full draw the forecast: from the current utilization now to
	// 100% at Full.
	Now  float64
	Full *time.Time
}

type usagePoint struct {
	At          time.Time
	Utilization float64
	// ResetsAt is when the window the reading was of resets (zero when
	// unknown): the chart marks each reset.
	ResetsAt time.Time
}

// resets are the distinct resets a series' readings name within the
// axis, in order.
func (s usageSeries) resets(ax timeAxis) []time.Time {
	var out []time.Time
	for _, p := range s.Points {
		r := p.ResetsAt
		if r.IsZero() || r.Before(ax.from) || r.After(ax.to) || (len(out) > 0 && out[len(out)-1].Equal(r)) {
			continue
		}
		out = append(out, r)
	}
	return out
}

// usageChart draws utilization 0..100% over [from, to] with a "now" line
// and each window's forecast dashed to its exhaustion.
func usageChart(id, title string, ax timeAxis, now time.Time, series []usageSeries) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %.0f %.0f" role="img" aria-label="%s">`, chartW, chartH, template.HTMLEscapeString(title))
	for _, f := range []float64{0, 0.5, 1} {
		y := yFrac(f)
		fmt.Fprintf(&b, `<line class="grid" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, plotL, y, plotR, y)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" %s>%.0f%%</text>`, plotL-4, y+4, chartFontAttrs, f*100)
	}
	timeTicks(&b, ax, now)
	fmt.Fprintf(&b, `<clipPath id="plot-%s"><rect x="%.1f" y="0" width="%.1f" height="%.1f"/></clipPath>`, template.HTMLEscapeString(id), plotL, plotR-plotL, plotB+2)
	fmt.Fprintf(&b, `<g clip-path="url(#plot-%s)">`, template.HTMLEscapeString(id))
	for _, s := range series {
		var pts []string
		for _, p := range s.Points {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", ax.x(p.At), yFrac(p.Utilization)))
		}
		if len(pts) == 1 {
			fmt.Fprintf(&b, `<circle class="s%d" cx="%s" r="3"/>`, s.Class, strings.Replace(pts[0], ",", `" cy="`, 1))
		} else if len(pts) > 1 {
			fmt.Fprintf(&b, `<polyline class="line s%d" points="%s"/>`, s.Class, strings.Join(pts, " "))
		}
		if s.Full != nil {
			fmt.Fprintf(&b, `<line class="forecast s%d" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"><title>%s full %s</title></line>`,
				s.Class, ax.x(now), yFrac(s.Now), ax.x(*s.Full), yFrac(1), template.HTMLEscapeString(s.Window), utc(*s.Full))
		}
		for _, r := range s.resets(ax) {
			fmt.Fprintf(&b, `<line class="reset s%d" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"><title>%s resets %s</title></line>`,
				s.Class, ax.x(r), plotT, ax.x(r), plotB, template.HTMLEscapeString(s.Window), utc(r))
		}
	}
	b.WriteString(`</g></svg>`)
	return template.HTML(b.String()) //nolint:gosec // built from numbers and escaped text
}

// timeTicks draws the start, middle and end labels and the "now" line.
func timeTicks(b *strings.Builder, ax timeAxis, now time.Time) {
	mid := ax.from.Add(ax.to.Sub(ax.from) / 2)
	for i, t := range []time.Time{ax.from, mid, ax.to} {
		anchor := [...]string{"start", "middle", "end"}[i]
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="%s" %s>%s</text>`, ax.x(t), plotB+20, anchor, chartFontAttrs, ax.label(t))
	}
	if now.After(ax.from) && !now.After(ax.to) {
		x := ax.x(now)
		fmt.Fprintf(b, `<line class="now" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, x, plotT, x, plotB)
		if now.Before(ax.to) {
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" %s>now</text>`, x, plotT-1, chartFontAttrs)
		}
	}
}

// poolBucket is one bucket of the pool chart.
type poolBucket struct {
	Start                   time.Time
	Requests, Holds, Errors int64
}

// poolChart draws requests per bucket as bars on the left axis, and the
// errors (a line) and holds (dots) on an axis of their own on the right:
// a handful of errors beside thousands of requests would not show on one.
func poolChart(ax timeAxis, bucket time.Duration, now time.Time, buckets []poolBucket) template.HTML {
	var top, topR int64 = 1, 1
	for _, k := range buckets {
		top = max(top, k.Requests)
		topR = max(topR, k.Errors, k.Holds)
	}
	top, topR = niceCeil(top), niceCeil(topR)
	y := func(n float64) float64 { return plotB - (plotB-plotT)*n/float64(top) }
	yR := func(n float64) float64 { return plotB - (plotB-plotT)*n/float64(topR) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %.0f %.0f" role="img" aria-label="requests, errors and holds over time">`, chartW, chartH)
	for _, n := range []float64{0, float64(top) / 2, float64(top)} {
		fmt.Fprintf(&b, `<line class="grid" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, plotL, y(n), plotR, y(n))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" %s>%g</text>`, plotL-4, y(n)+4, chartFontAttrs, n)
	}
	for _, n := range []float64{float64(topR) / 2, float64(topR)} {
		fmt.Fprintf(&b, `<text class="axis-right" x="%.1f" y="%.1f" text-anchor="end" %s>%g</text>`, plotR-2, yR(n)-3, chartFontAttrs, n)
	}
	timeTicks(&b, ax, now)
	w := math.Max(1, ax.x(ax.from.Add(bucket))-ax.x(ax.from)-1)
	var errLine []string
	for _, k := range buckets {
		x := ax.x(k.Start)
		req := float64(k.Requests)
		fmt.Fprintf(&b, `<rect class="req-bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %d requests, %d errors, %d holds</title></rect>`,
			x, y(req), w, plotB-y(req), utc(k.Start), k.Requests, k.Errors, k.Holds)
		errLine = append(errLine, fmt.Sprintf("%.1f,%.1f", x+w/2, yR(float64(k.Errors))))
		if k.Holds > 0 {
			fmt.Fprintf(&b, `<circle class="hold-dot" cx="%.1f" cy="%.1f" r="3.5"/>`, x+w/2, yR(float64(k.Holds)))
		}
	}
	if len(errLine) > 1 {
		fmt.Fprintf(&b, `<polyline class="err-line" points="%s"/>`, strings.Join(errLine, " "))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) //nolint:gosec // built from numbers
}

// niceCeil rounds n up to 1, 2 or 5 times a power of ten.
func niceCeil(n int64) int64 {
	p := int64(1)
	for {
		for _, m := range []int64{1, 2, 5} {
			if n <= m*p {
				return m * p
			}
		}
		p *= 10
	}
}

// The usage chart: two panels, tokens above and cost below, on one time
// axis whose ticks are dated in the page's time zone. It is drawn twice:
// wide, and narrow for phones (taller, larger type, fewer ticks), and the
// stylesheet shows the one that fits.

// stackGeom is one drawing of the usage chart.
type stackGeom struct {
	class                          string
	w, h, left, right              float64
	tokensT, tokensB, costT, costB float64
	font                           int
	ticks                          int
}

var stackGeoms = []stackGeom{
	{class: "wide", w: 800, h: 372, left: 62, right: 790, tokensT: 26, tokensB: 170, costT: 206, costB: 330, font: 11, ticks: 8},
	{class: "narrow", w: 420, h: 436, left: 50, right: 410, tokensT: 28, tokensB: 210, costT: 252, costB: 394, font: 13, ticks: 3},
}

// stackSeries is one group's part of every bucket.
type stackSeries struct {
	Label  string
	Class  int
	Tokens []int64
	Cost   []float64
}

// stackedUsage draws buckets (their starts; the last ends at end) as bars
// stacked by series, the first at the bottom, tokens above and cost
// below. per (hour or day) names a bucket in the bars' titles.
func stackedUsage(buckets []time.Time, end time.Time, loc *time.Location, per string, series []stackSeries) template.HTML {
	var b strings.Builder
	for _, g := range stackGeoms {
		g.draw(&b, buckets, end, loc, per, series)
	}
	return template.HTML(b.String()) //nolint:gosec // built from numbers and escaped text
}

func (g stackGeom) draw(b *strings.Builder, buckets []time.Time, end time.Time, loc *time.Location, per string, series []stackSeries) {
	from := buckets[0]
	x := func(t time.Time) float64 {
		return g.left + (g.right-g.left)*t.Sub(from).Seconds()/end.Sub(from).Seconds()
	}
	zone := template.HTMLEscapeString(loc.String())
	font := fmt.Sprintf(`font-size="%d" fill="currentColor"`, g.font)
	fmt.Fprintf(b, `<svg class="chart usage-stack %s" viewBox="0 0 %.0f %.0f" role="img" aria-label="tokens and cost per %s, times in %s">`,
		g.class, g.w, g.h, per, zone)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" %s>tokens</text>`, g.left, g.tokensT-10, font)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end" %s>times in %s</text>`, g.right, g.tokensT-10, font, zone)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" %s>cost (USD, API-equivalent)</text>`, g.left, g.costT-10, font)
	for _, t := range datedTicks(from, end, loc, g.ticks) {
		tx := x(t.at)
		anchor := "middle"
		switch half := float64(len(t.label)*g.font) * 0.3; {
		case tx-g.left < half:
			anchor = "start"
		case g.right-tx < half:
			anchor = "end"
		}
		fmt.Fprintf(b, `<line class="grid tick" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, tx, g.tokensT, tx, g.costB)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="%s" %s>%s</text>`, tx, g.costB+float64(g.font)*2, anchor, font, t.label)
	}
	label := func(t time.Time) string {
		if per == "day" {
			return t.In(loc).Format("Mon Jan 2")
		}
		return t.In(loc).Format("Jan 2 15:04")
	}
	panel := func(top, bottom float64, value func(stackSeries, int) float64, scale, tip func(float64) string) {
		var most float64
		for i := range buckets {
			var sum float64
			for _, s := range series {
				sum += value(s, i)
			}
			most = math.Max(most, sum)
		}
		ceil := niceCeilFloat(most)
		y := func(v float64) float64 { return bottom - (bottom-top)*v/ceil }
		for _, v := range []float64{0, ceil / 2, ceil} {
			fmt.Fprintf(b, `<line class="grid" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, g.left, y(v), g.right, y(v))
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end" %s>%s</text>`, g.left-4, y(v)+4, font, scale(v))
		}
		for i, start := range buckets {
			stop := end
			if i+1 < len(buckets) {
				stop = buckets[i+1]
			}
			bx, w := x(start), x(stop)-x(start)
			if w > 3 {
				w--
			}
			var sum float64
			for _, s := range series {
				v := value(s, i)
				if v <= 0 {
					continue
				}
				fmt.Fprintf(b, `<rect class="seg s%d" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s · %s: %s</title></rect>`,
					s.Class, bx, y(sum+v), math.Max(w, 0.5), math.Max(y(sum)-y(sum+v), 0.5),
					label(start), template.HTMLEscapeString(s.Label), tip(v))
				sum += v
			}
		}
	}
	panel(g.tokensT, g.tokensB, func(s stackSeries, i int) float64 { return float64(s.Tokens[i]) }, compactCount,
		func(v float64) string { return groupDigits(int64(v)) + " tokens" })
	panel(g.costT, g.costB, func(s stackSeries, i int) float64 { return s.Cost[i] },
		func(v float64) string { return "$" + strconv.FormatFloat(v, 'f', -1, 64) }, dollars)
	b.WriteString(`</svg>`)
}

// tick is a dated tick of the time axis.
type tick struct {
	at    time.Time
	label string
}

// tickSteps are the axis' steps, finest first: hours, days, months.
var tickSteps = []struct {
	hours, days, months int
	layout              string
}{
	{1, 0, 0, "Jan 2 15:04"}, {2, 0, 0, "Jan 2 15:04"}, {3, 0, 0, "Jan 2 15:04"}, {6, 0, 0, "Jan 2 15:04"}, {12, 0, 0, "Jan 2 15:04"},
	{0, 1, 0, "Mon Jan 2"}, {0, 2, 0, "Jan 2"}, {0, 7, 0, "Jan 2"}, {0, 14, 0, "Jan 2"},
	{0, 0, 1, "Jan 2006"}, {0, 0, 3, "Jan 2006"}, {0, 0, 6, "Jan 2006"}, {0, 0, 12, "2006"},
}

// datedTicks are about most ticks over [from, to] at whole hours,
// midnights (Mondays for weeks) or months' firsts in loc, each labelled
// with its date.
func datedTicks(from, to time.Time, loc *time.Location, most int) []tick {
	span := to.Sub(from)
	st := tickSteps[len(tickSteps)-1]
	for _, s := range tickSteps {
		approx := time.Duration(s.hours)*time.Hour + time.Duration(s.days)*24*time.Hour + time.Duration(s.months)*30*24*time.Hour
		if int(span/approx) <= most {
			st = s
			break
		}
	}
	f := from.In(loc)
	var t time.Time
	step := func(t time.Time) time.Time {
		switch {
		case st.hours > 0:
			return time.Date(t.Year(), t.Month(), t.Day(), t.Hour()+st.hours, 0, 0, 0, loc)
		case st.days > 0:
			return t.AddDate(0, 0, st.days)
		}
		return t.AddDate(0, st.months, 0)
	}
	aligned := func(t time.Time) bool {
		switch {
		case st.hours > 0:
			return t.Hour()%st.hours == 0
		case st.days == 7 || st.days == 14:
			return t.Weekday() == time.Monday
		case st.months > 0:
			return (int(t.Month())-1)%st.months == 0
		}
		return true
	}
	switch {
	case st.hours > 0:
		t = time.Date(f.Year(), f.Month(), f.Day(), f.Hour(), 0, 0, 0, loc)
		for t.Before(from) || !aligned(t) {
			t = t.Add(time.Hour)
		}
	case st.days > 0:
		t = time.Date(f.Year(), f.Month(), f.Day(), 0, 0, 0, 0, loc)
		for t.Before(from) || !aligned(t) {
			t = t.AddDate(0, 0, 1)
		}
	default:
		t = time.Date(f.Year(), f.Month(), 1, 0, 0, 0, 0, loc)
		for t.Before(from) || !aligned(t) {
			t = t.AddDate(0, 1, 0)
		}
	}
	var out []tick
	for ; !t.After(to) && len(out) <= most; t = step(t) {
		out = append(out, tick{at: t, label: t.Format(st.layout)})
	}
	return out
}

// niceCeilFloat rounds v up to 1, 2 or 5 times a power of ten; 1 for
// nothing.
func niceCeilFloat(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p*(1+1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// compactCount is a scale's count: 250k, 1.5M.
func compactCount(v float64) string {
	switch {
	case v >= 1e9:
		return strconv.FormatFloat(v/1e9, 'f', -1, 64) + "B"
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}
