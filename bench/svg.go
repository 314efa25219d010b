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
	var panels []chartPanel
	for _, lat := range rep.Results.Config.SimLatencies {
		p := chartPanel{attr: fmt.Sprintf(`data-sim-latency="%s"`, lat), title: "Added latency over direct, sim latency " + lat.String(),
			yLabel: "added ms", yCap: yCapMs}
		var rows []Comparison
		for _, c := range rep.Comparisons {
			if c.SimLatency == lat && !c.Stream {
				rows = append(rows, c)
				p.xs = append(p.xs, c.Rate)
			}
		}
		for _, s := range plotSeries {
			l := chartLine{id: s.id, label: s.label, color: s.color, dash: s.dash}
			for _, c := range rows {
				l.ys = append(l.ys, float64(s.pick(c))/float64(time.Millisecond))
			}
			p.lines = append(p.lines, l)
		}
		panels = append(panels, p)
	}
	return renderChart(panels)
}

// chartPanel is one plot of lines against request rate (log scale).
type chartPanel struct {
	// attr is added to the panel's <g> (data attributes for readers).
	attr          string
	title, yLabel string
	xs            []int
	lines         []chartLine
	// yCap, when positive, is the highest value drawn: a target falling
	// behind adds seconds, and past the cap its line runs along the top so
	// the region that matters stays legible.
	yCap float64
}

// chartLine is one series of a panel, a value per x.
type chartLine struct {
	id, label, color string
	dash             bool
	ys               []float64
}

// renderChart draws the panels side by side as one SVG.
func renderChart(panels []chartPanel) string {
	const (
		pw, ph         = 440.0, 300.0 // panel
		ml, mr, mt, mb = 60.0, 20.0, 40.0, 50.0
	)
	w := float64(max(len(panels), 1)) * (pw + ml + mr)
	h := ph + mt + mb + 30
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	for pi, pn := range panels {
		x0 := float64(pi)*(pw+ml+mr) + ml
		p(`<g class="panel" %s>`+"\n", pn.attr)
		p(`<text x="%.1f" y="20" font-weight="bold">%s</text>`+"\n", x0, html.EscapeString(pn.title))
		if len(pn.xs) == 0 {
			p("</g>\n")
			continue
		}
		lo, hi := 0.0, 0.0
		for _, l := range pn.lines {
			for _, v := range l.ys {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
		clipped := pn.yCap > 0 && hi > pn.yCap
		if clipped {
			hi = pn.yCap
		}
		if hi-lo < 0.1 {
			hi = lo + 0.1
		}
		if !clipped {
			hi += (hi - lo) * 0.05
		}
		rmin, rmax := math.Log(float64(pn.xs[0])), math.Log(float64(pn.xs[len(pn.xs)-1]))
		if rmax == rmin {
			rmin, rmax = rmin-1, rmax+1
		}
		xOf := func(rate int) float64 { return x0 + (math.Log(float64(rate))-rmin)/(rmax-rmin)*pw }
		yOf := func(v float64) float64 { return mt + ph - (min(v, hi)-lo)/(hi-lo)*ph }
		if clipped {
			p(`<text x="%.1f" y="%.1f" font-size="10">values above %.0f (a target falling behind) are drawn at the top</text>`+"\n", x0+5, mt-6, pn.yCap)
		}
		// Axes, ticks and the zero line.
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", x0, mt+ph, x0+pw, mt+ph)
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", x0, mt, x0, mt+ph)
		for _, rate := range pn.xs {
			x := xOf(rate)
			p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/><text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`+"\n", x, mt+ph, x, mt+ph+5, x, mt+ph+18, rate)
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
		p(`<text transform="translate(%.1f %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", x0-45, mt+ph/2, html.EscapeString(pn.yLabel))
		for li, l := range pn.lines {
			var pts []string
			for i, v := range l.ys {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(pn.xs[i]), yOf(v)))
			}
			dash := ""
			if l.dash {
				dash = ` stroke-dasharray="5 3"`
			}
			p(`<polyline class="series" data-series="%s" fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", html.EscapeString(l.id), l.color, dash, strings.Join(pts, " "))
			ly := mt + ph + 52
			lx := x0 + float64(li)*110
			p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/><text x="%.1f" y="%.1f">%s</text>`+"\n", lx, ly-4, lx+20, ly-4, l.color, dash, lx+24, ly, html.EscapeString(l.label))
		}
		p("</g>\n")
	}
	p("</svg>\n")
	return b.String()
}
