package bench

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/weirhq/weir/internal/sysmon"
)

// ApartReport is what an apart run concludes: each step beside the bare
// proxy's at the same rate.
type ApartReport struct {
	Results *ApartResults `json:"results"`
	Rows    []ApartRow    `json:"rows"`
}

// ApartRow is one step and what it adds over the bare proxy's step at the
// same rate (zero for the bare proxy itself, or when it did not run).
type ApartRow struct {
	ApartStep
	OverBare     Added `json:"latency_over_bare"`
	TTFBOverBare Added `json:"ttfb_over_bare,omitzero"`
	// CPUOverBare is the CPU per request beyond the bare proxy's.
	CPUOverBare time.Duration `json:"cpu_per_request_over_bare_ns"`
}

// NewApartReport derives the rows from r.
func NewApartReport(r *ApartResults) *ApartReport {
	rep := &ApartReport{Results: r}
	for _, s := range r.Steps {
		row := ApartRow{ApartStep: s}
		if i := slices.IndexFunc(r.Steps, func(b ApartStep) bool {
			return b.Target == targetBare && b.Rate == s.Rate && b.Stream == s.Stream
		}); i >= 0 && s.Target != targetBare {
			b := r.Steps[i]
			row.OverBare, row.CPUOverBare = added(s.Latency, b.Latency), s.CPUPerRequest-b.CPUPerRequest
			if s.Stream {
				row.TTFBOverBare = added(s.TTFB, b.TTFB)
			}
		}
		rep.Rows = append(rep.Rows, row)
	}
	return rep
}

// WriteFiles writes results.md, results.json and apart.svg into dir.
func (rep *ApartReport) WriteFiles(dir string) error {
	return writeResults(dir, rep, map[string]string{"results.md": rep.Markdown(), "apart.svg": rep.SVG()})
}

// parts is a step's CPU split by process, in µs per request.
func (s ApartStep) parts() string {
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range s.Parts {
			if !yield(k) {
				return
			}
		}
	})
	var out []string
	for _, n := range names {
		out = append(out, n+" "+us(s.Parts[n]))
	}
	if len(out) == 0 {
		return "–"
	}
	return strings.Join(out, " · ")
}

func pair(s Summary) string { return ms(s.P50) + " / " + ms(s.P99) }
func addedPair(a Added, bare bool) string {
	if bare {
		return "–"
	}
	return ms(a.P50) + " / " + ms(a.P99)
}

// Markdown is the report as tables.
func (rep *ApartReport) Markdown() string {
	r := rep.Results
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# weir bench apart — %s\n\n", r.Started.Format(time.RFC3339))
	p("%s, %d CPUs; each step %v measured after %v warm-up, open loop from a load generator process of its own; stream step at %d req/s; seed %d; %d API-key accounts; load average before / after: %s / %s; run took %v.\n\n",
		r.GoVersion, r.NumCPU, r.Config.Duration, r.Config.Warmup, r.Config.StreamRate, r.Config.Seed, r.Config.Accounts,
		r.LoadBefore, r.LoadAfter, r.Elapsed.Round(time.Second))
	p("Every target proxies to one `weir sim` process. Targets: ")
	var ts []string
	for _, t := range r.Config.Targets {
		switch t {
		case targetBare:
			ts = append(ts, "**bare** (`httputil.ReverseProxy`, a process of its own)")
		case targetBareSteady:
			ts = append(ts, "**bare-steady** (the same proxy with Go's monitor thread at the steady poll weir's serving commands run with, `GODEBUG="+sysmon.Setting+"`)")
		case targetWeirDev:
			ts = append(ts, "**weir-dev** (`weir dev`: one process and its embedded Postgres)")
		case targetWeirSplit:
			ts = append(ts, "**weir-split** (`weir controlplane` + `weir dataplane` + an embedded Postgres, three process trees)")
		}
	}
	for _, pr := range r.Config.Peers {
		ts = append(ts, fmt.Sprintf("**%s** (`%s`)", pr.Name, strings.Join(pr.Cmd, " ")))
	}
	p("%s.\n\n", strings.Join(ts, ", "))
	p("CPU is each target's whole process tree (`/proc/<pid>/stat` user + system, reaped children included) over the step, warm-up and the wait for idle after it included, divided by the requests it served; *of which* splits it by process. ")
	p("The generator's and the simulator's CPU are not billed to any target. Latencies in ms from each request's scheduled start; *over bare* is a difference of percentiles with the bare proxy at the same rate.\n\n")
	p("## Non-streaming /v1/messages\n\n")
	p("| rate/s | target | served | errors | CPU µs/req | of which | over bare | p50 / p99 | p50 / p99 over bare | generator µs/req | sim µs/req |\n")
	p("|---:|---|---:|---:|---:|---|---:|---|---|---:|---:|\n")
	for _, row := range rep.Rows {
		if row.Stream {
			continue
		}
		bare := row.Target == targetBare
		over := "–"
		if !bare {
			over = us(row.CPUOverBare)
		}
		p("| %d | %s | %d | %d%s | %s | %s | %s | %s | %s | %s | %s |\n", row.Rate, row.Target, row.Served, row.Errors, behind(row.ok()),
			us(row.CPUPerRequest), row.parts(), over, pair(row.Latency), addedPair(row.OverBare, bare),
			us(row.GeneratorCPUPerRequest), us(row.SimCPUPerRequest))
	}
	p("\n† fell behind (more than 0.1%% of measured requests failed or were dropped).\n\n")
	writes := false
	for _, row := range rep.Rows {
		writes = writes || row.WriteXactsPerRequest > 0
	}
	if writes {
		p("## Postgres writes per request\n\n")
		p("Where the harness started the target's Postgres: the transactions that wrote (transaction ids assigned) and the WAL bytes written over the step, per request served.\n\n")
		p("| rate/s | target | streams | write transactions / req | WAL bytes / req |\n|---:|---|---|---:|---:|\n")
		for _, row := range rep.Rows {
			if row.WriteXactsPerRequest > 0 {
				p("| %d | %s | %v | %.3f | %.0f |\n", row.Rate, row.Target, row.Stream, row.WriteXactsPerRequest, row.WALBytesPerRequest)
			}
		}
		p("\n")
	}
	first := true
	for _, row := range rep.Rows {
		if !row.Stream {
			continue
		}
		if first {
			p("## Streams at %d req/s (20–64 deltas, 10–20 ms apart)\n\n", row.Rate)
			p("TTFB is the first content_block_delta; gap is each later delta's delay beyond the simulator's pace.\n\n")
			p("| target | served | errors | CPU µs/stream | of which | TTFB p50 / p99 | TTFB over bare | gap p50 / p99 | whole stream p50 / p99 |\n")
			p("|---|---:|---:|---:|---|---|---|---|---|\n")
			first = false
		}
		p("| %s | %d | %d%s | %s | %s | %s | %s | %s | %s |\n", row.Target, row.Served, row.Errors, behind(row.ok()), us(row.CPUPerRequest),
			row.parts(), pair(row.TTFB), addedPair(row.TTFBOverBare, row.Target == targetBare), pair(row.Gap), pair(row.Latency))
	}
	if !first {
		p("\n")
	}
	for _, row := range rep.Rows {
		if row.FirstError != "" {
			p("First error of %s at %d/s%s: %s\n\n", row.Target, row.Rate, map[bool]string{true: " (streams)"}[row.Stream], row.FirstError)
		}
	}
	return b.String()
}

// apartColors are the targets' line colors, in run order.
var apartColors = []string{"#2471a3", "#c0392b", "#e67e22", "#27ae60", "#8e44ad", "#7f8c8d"}

// SVG plots, against rate, each target's CPU per request and its p99
// latency over the bare proxy.
func (rep *ApartReport) SVG() string {
	r := rep.Results
	cpu := chartPanel{attr: `data-panel="cpu"`, title: "CPU per request, whole process tree", yLabel: "µs per request", xs: r.Config.Rates}
	lat := chartPanel{attr: `data-panel="p99-over-bare"`, title: "p99 latency added over the bare proxy", yLabel: "added ms", xs: r.Config.Rates, yCap: yCapMs}
	for i, name := range r.targetOrder() {
		color := apartColors[i%len(apartColors)]
		c := chartLine{id: name + "-cpu", label: name, color: color}
		l := chartLine{id: name + "-p99", label: name, color: color}
		for _, rate := range r.Config.Rates {
			var row ApartRow
			for _, x := range rep.Rows {
				if x.Target == name && x.Rate == rate && !x.Stream {
					row = x
				}
			}
			c.ys = append(c.ys, float64(row.CPUPerRequest)/float64(time.Microsecond))
			l.ys = append(l.ys, float64(row.OverBare.P99)/float64(time.Millisecond))
		}
		cpu.lines = append(cpu.lines, c)
		if name != targetBare {
			lat.lines = append(lat.lines, l)
		}
	}
	return renderChart([]chartPanel{cpu, lat})
}
