package bench

import (
	"fmt"
	"html"
	"math"
	"strings"
	"time"
)

// series is one line of the plot.
type series struct {
	id, label, color string
	dash             bool
	pick             func(Comparison) time.Duration
}

var plotSeries = []series{
	{"weir-p50", "weir p50", "#c0392b", true, func(c Comparison) time.Duration { return c.WeirOverDirect.P50 }},
	{"weir-p99", "weir p99", "#c0392b", false, func(c Comparison) time.Duration { return c.WeirOverDirect.P99 }},
	{"bare-p50", "bare proxy p50", "#2471a3", true, func(c Comparison) time.Duration { return c.BareOverDirect.P50 }},
	{"bare-p99", "bare proxy p99", "#2471a3", false, func(c Comparison) time.Duration { return c.BareOverDirect.P99 }},
}

// yCapMs is the plot's highest added latency, in ms.
const yCapMs = 50.0

// SVG plots added latency over direct (ms) against rate (log scale), one
// panel per simulator latency, for weir and the bare proxy.
func (rep *Report) SVG() string {
	const (
		pw, ph         = 440.0, 300.0 // panel
		ml, mr, mt, mb = 60.0, 20.0, 40.0, 50.0
	)
	lats := rep.Results.Config.SimLatencies
	w := float64(max(len(lats), 1)) * (pw + ml + mr)
	h := ph + mt + mb + 30
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	for li, lat := range lats {
		var rows []Comparison
		for _, c := range rep.Comparisons {
			if c.SimLatency == lat && !c.Stream {
				rows = append(rows, c)
			}
		}
		x0 := float64(li)*(pw+ml+mr) + ml
		p(`<g class="panel" data-sim-latency="%s">`+"\n", lat)
		p(`<text x="%.1f" y="20" font-weight="bold">Added latency over direct, sim latency %s</text>`+"\n", x0, html.EscapeString(lat.String()))
		if len(rows) == 0 {
			p("</g>\n")
			continue
		}
		lo, hi := 0.0, 0.0
		for _, c := range rows {
			for _, s := range plotSeries {
				v := float64(s.pick(c)) / float64(time.Millisecond)
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
		// A target that fell behind adds seconds; past yCapMs the lines
		// are drawn along the top so the region that matters stays legible.
		clipped := hi > yCapMs
		hi = min(hi, yCapMs)
		if hi-lo < 0.1 {
			hi = lo + 0.1
		}
		if !clipped {
			hi += (hi - lo) * 0.05
		}
		rmin, rmax := math.Log(float64(rows[0].Rate)), math.Log(float64(rows[len(rows)-1].Rate))
		if rmax == rmin {
			rmin, rmax = rmin-1, rmax+1
		}
		xOf := func(rate int) float64 { return x0 + (math.Log(float64(rate))-rmin)/(rmax-rmin)*pw }
		yOf := func(v float64) float64 { return mt + ph - (min(v, hi)-lo)/(hi-lo)*ph }
		if clipped {
			p(`<text x="%.1f" y="%.1f" font-size="10">values above %.0f ms (a target falling behind) are drawn at the top</text>`+"\n", x0+5, mt-6, yCapMs)
		}
		// Axes, ticks and the zero line.
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", x0, mt+ph, x0+pw, mt+ph)
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", x0, mt, x0, mt+ph)
		for _, c := range rows {
			x := xOf(c.Rate)
			p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/><text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`+"\n", x, mt+ph, x, mt+ph+5, x, mt+ph+18, c.Rate)
		}
		for i := 0; i <= 4; i++ {
			v := lo + (hi-lo)*float64(i)/4
			y := yOf(v)
			p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/><text x="%.1f" y="%.1f" text-anchor="end">%.2f</text>`+"\n", x0, y, x0+pw, y, x0-5, y+4, v)
		}
		if lo < 0 {
			p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#888"/>`+"\n", x0, yOf(0), x0+pw, yOf(0))
		}
		p(`<text x="%.1f" y="%.1f" text-anchor="middle">requests per second (log)</text>`+"\n", x0+pw/2, mt+ph+36)
		p(`<text transform="translate(%.1f %.1f) rotate(-90)" text-anchor="middle">added ms</text>`+"\n", x0-45, mt+ph/2)
		for si, s := range plotSeries {
			var pts []string
			for _, c := range rows {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(c.Rate), yOf(float64(s.pick(c))/float64(time.Millisecond))))
			}
			dash := ""
			if s.dash {
				dash = ` stroke-dasharray="5 3"`
			}
			p(`<polyline class="series" data-series="%s" fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", s.id, s.color, dash, strings.Join(pts, " "))
			ly := mt + ph + 52
			lx := x0 + float64(si)*110
			p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/><text x="%.1f" y="%.1f">%s</text>`+"\n", lx, ly-4, lx+20, ly-4, s.color, dash, lx+24, ly, html.EscapeString(s.label))
		}
		p("</g>\n")
	}
	p("</svg>\n")
	return b.String()
}
