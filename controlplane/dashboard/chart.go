package dashboard

import (
	"fmt"
	"html/template"
	"math"
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

// poolChart draws requests per bucket as bars, the errors among them in
// front, and the holds as dots.
func poolChart(ax timeAxis, bucket time.Duration, now time.Time, buckets []poolBucket) template.HTML {
	var top int64 = 1
	for _, k := range buckets {
		top = max(top, k.Requests, k.Holds)
	}
	top = niceCeil(top)
	y := func(n float64) float64 { return plotB - (plotB-plotT)*n/float64(top) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %.0f %.0f" role="img" aria-label="requests, errors and holds over time">`, chartW, chartH)
	for _, n := range []float64{0, float64(top) / 2, float64(top)} {
		fmt.Fprintf(&b, `<line class="grid" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"/>`, plotL, y(n), plotR, y(n))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" %s>%g</text>`, plotL-4, y(n)+4, chartFontAttrs, n)
	}
	timeTicks(&b, ax, now)
	w := math.Max(1, ax.x(ax.from.Add(bucket))-ax.x(ax.from)-1)
	for _, k := range buckets {
		x := ax.x(k.Start)
		req, errs, holds := float64(k.Requests), float64(k.Errors), float64(k.Holds)
		fmt.Fprintf(&b, `<rect class="req-bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f"><title>%s: %d requests, %d errors, %d holds</title></rect>`,
			x, y(req), w, plotB-y(req), utc(k.Start), k.Requests, k.Errors, k.Holds)
		if k.Errors > 0 {
			fmt.Fprintf(&b, `<rect class="err-bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f"/>`, x, y(errs), w, plotB-y(errs))
		}
		if k.Holds > 0 {
			fmt.Fprintf(&b, `<circle class="hold-dot" cx="%.1f" cy="%.1f" r="3.5"/>`, x+w/2, y(holds))
		}
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
