package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Comparison puts the three targets side by side at one rate.
type Comparison struct {
	SimLatency time.Duration `json:"sim_latency_ns"`
	Rate       int           `json:"rate"`
	Stream     bool          `json:"stream"`
	// Direct, Bare and Weir are the steps; the Added fields are
	// differences of their latency percentiles.
	Direct, Bare, Weir Step  `json:"-"`
	WeirOverDirect     Added `json:"weir_over_direct"`
	WeirOverBare       Added `json:"weir_over_bare"`
	BareOverDirect     Added `json:"bare_over_direct"`
	// Streams: the same for time to first token, and each target's gap
	// excess (how much later than the pace each delta arrived).
	TTFBWeirOverDirect Added `json:"ttfb_weir_over_direct,omitzero"`
	TTFBWeirOverBare   Added `json:"ttfb_weir_over_bare,omitzero"`
	TTFBBareOverDirect Added `json:"ttfb_bare_over_direct,omitzero"`
	// CPU attributed by difference with the direct step at the same rate:
	// the generator and the simulator cost the same in all three.
	BareCPUPerRequest   time.Duration `json:"bare_cpu_per_request_ns"`
	WeirCPUPerRequest   time.Duration `json:"weir_cpu_per_request_ns"`
	WeirPGCPUPerRequest time.Duration `json:"weir_pg_cpu_per_request_ns"`
	DirectCPUPerRequest time.Duration `json:"direct_cpu_per_request_ns"`
	OK                  [3]bool       `json:"ok"` // direct, bare, weir kept up
}

// Sustained is, at one simulator latency, the highest rate (of those run)
// each criterion held up to.
type Sustained struct {
	SimLatency time.Duration `json:"sim_latency_ns"`
	// WeirOverBareUnder maps 1, 5, 10 (ms) to the highest rate whose weir
	// p99 was within that of the bare proxy's.
	WeirOverBareUnder map[int]int `json:"weir_over_bare_p99_under_ms"`
	// Weir and Bare: the highest rate with p99 added over direct ≤ 10 ms.
	Weir  int     `json:"weir_10ms"`
	Bare  int     `json:"bare_10ms"`
	Ratio float64 `json:"ratio"`
	// Capped says the bare proxy held at the highest rate run: the ratio
	// is then a lower bound on the bare proxy's side only.
	Capped bool `json:"capped"`
}

// IdlePerStream is memory per open idle stream, attributed by
// difference with the same count opened directly.
type IdlePerStream struct {
	N                 int    `json:"n"`
	WeirPerStream     int64  `json:"weir_bytes_per_stream"`
	BarePerStream     int64  `json:"bare_bytes_per_stream"`
	WeirPeakPerStream int64  `json:"weir_peak_bytes_per_stream"`
	BarePeakPerStream int64  `json:"bare_peak_bytes_per_stream"`
	DirectPerStream   int64  `json:"direct_bytes_per_stream"`
	Opened            [3]int `json:"opened"`
	// Worker* are the same streams opened through a worker child: that
	// process's own RSS per stream (bare proxy, weir data plane).
	WorkerBarePerStream     int64  `json:"worker_bare_bytes_per_stream,omitempty"`
	WorkerWeirPerStream     int64  `json:"worker_weir_bytes_per_stream,omitempty"`
	WorkerBarePeakPerStream int64  `json:"worker_bare_peak_bytes_per_stream,omitempty"`
	WorkerWeirPeakPerStream int64  `json:"worker_weir_peak_bytes_per_stream,omitempty"`
	WorkerOpened            [2]int `json:"worker_opened,omitempty"`
}

// Report is what a run concludes, derived from its Results.
type Report struct {
	Results     *Results        `json:"results"`
	Comparisons []Comparison    `json:"comparisons"`
	Sustained   []Sustained     `json:"sustained"`
	Idle        []IdlePerStream `json:"idle_per_stream"`
	Translation []Translation   `json:"translation,omitempty"`
}

// Translation is what translation adds at one rate: weir's cost onto the
// simulator's Chat Completions (weir-translated over direct-chat) less
// its cost untranslated (weir over direct), the same run and rate. The
// difference holds what differs between the two paths: the translation
// both ways, and the Chat answer's own shape.
type Translation struct {
	SimLatency time.Duration `json:"sim_latency_ns"`
	Rate       int           `json:"rate"`
	Stream     bool          `json:"stream"`
	// CPUPerRequest is the translated path's CPU over its direct
	// reference, and Untranslated the same of the untranslated path.
	CPUPerRequest, Untranslated time.Duration `json:"-"`
	CPUAdded                    time.Duration `json:"cpu_added_per_request_ns"`
	// Latency (or, for streams, time to first token) added over each
	// path's direct reference, p50 and p99.
	Over, UntranslatedOver Added         `json:"-"`
	AddedP50               time.Duration `json:"added_p50_ns"`
	AddedP99               time.Duration `json:"added_p99_ns"`
	OK                     bool          `json:"ok"`
}

var thresholds = []int{1, 5, 10}

// NewReport derives the comparisons from r.
func NewReport(r *Results) *Report {
	rep := &Report{Results: r}
	find := func(lat time.Duration, rate int, stream bool, name string) (Step, bool) {
		for _, s := range r.Steps {
			if s.SimLatency == lat && s.Rate == rate && s.Stream == stream && s.Target == name {
				return s, true
			}
		}
		return Step{}, false
	}
	for _, lat := range r.Config.SimLatencies {
		var rows []Comparison
		for _, stream := range []bool{false, true} {
			rates := r.Config.Rates
			if stream {
				rates = []int{r.Config.StreamRate}
			}
			for _, rate := range rates {
				d, ok1 := find(lat, rate, stream, "direct")
				b, ok2 := find(lat, rate, stream, "bare")
				w, ok3 := find(lat, rate, stream, "weir")
				if !ok1 || !ok2 || !ok3 {
					continue
				}
				c := compare(d, b, w)
				c.SimLatency = lat
				rep.Comparisons = append(rep.Comparisons, c)
				if !stream {
					rows = append(rows, c)
				}
			}
		}
		if len(rows) > 0 {
			rep.Sustained = append(rep.Sustained, sustain(lat, rows))
		}
	}
	rep.Idle = idlePerStream(r.Idle)
	for _, lat := range r.Config.SimLatencies {
		rates := append(slices.Clone(r.Config.Rates), r.Config.StreamRate)
		for i, rate := range rates {
			stream := i == len(rates)-1
			d, ok1 := find(lat, rate, stream, "direct")
			w, ok2 := find(lat, rate, stream, "weir")
			dc, ok3 := find(lat, rate, stream, "direct-chat")
			wt, ok4 := find(lat, rate, stream, "weir-translated")
			if !ok1 || !ok2 || !ok3 || !ok4 {
				continue
			}
			x := Translation{SimLatency: lat, Rate: rate, Stream: stream,
				CPUPerRequest: wt.CPUPerRequest - dc.CPUPerRequest, Untranslated: w.CPUPerRequest - d.CPUPerRequest,
				OK: w.ok() && wt.ok() && d.ok() && dc.ok()}
			x.CPUAdded = x.CPUPerRequest - x.Untranslated
			if stream {
				x.Over, x.UntranslatedOver = added(wt.TTFB, dc.TTFB), added(w.TTFB, d.TTFB)
			} else {
				x.Over, x.UntranslatedOver = added(wt.Latency, dc.Latency), added(w.Latency, d.Latency)
			}
			x.AddedP50, x.AddedP99 = x.Over.P50-x.UntranslatedOver.P50, x.Over.P99-x.UntranslatedOver.P99
			rep.Translation = append(rep.Translation, x)
		}
	}
	return rep
}

func compare(d, b, w Step) Comparison {
	c := Comparison{Rate: d.Rate, Stream: d.Stream, Direct: d, Bare: b, Weir: w,
		WeirOverDirect: added(w.Latency, d.Latency), WeirOverBare: added(w.Latency, b.Latency), BareOverDirect: added(b.Latency, d.Latency),
		DirectCPUPerRequest: d.CPUPerRequest,
		BareCPUPerRequest:   b.CPUPerRequest - d.CPUPerRequest,
		WeirCPUPerRequest:   w.CPUPerRequest - d.CPUPerRequest,
		WeirPGCPUPerRequest: w.PGCPUPerRequest - d.PGCPUPerRequest,
		OK:                  [3]bool{d.ok(), b.ok(), w.ok()},
	}
	if d.Stream {
		c.TTFBWeirOverDirect, c.TTFBWeirOverBare, c.TTFBBareOverDirect = added(w.TTFB, d.TTFB), added(w.TTFB, b.TTFB), added(b.TTFB, d.TTFB)
	}
	return c
}

func sustain(lat time.Duration, rows []Comparison) Sustained {
	rates := make([]int, len(rows))
	for i, c := range rows {
		rates[i] = c.Rate
	}
	s := Sustained{SimLatency: lat, WeirOverBareUnder: map[int]int{}}
	for _, ms := range thresholds {
		limit := time.Duration(ms) * time.Millisecond
		s.WeirOverBareUnder[ms] = sustained(rates, func(i int) bool {
			return rows[i].OK[1] && rows[i].OK[2] && rows[i].WeirOverBare.P99 < limit
		})
	}
	budget := 10 * time.Millisecond
	s.Weir = sustained(rates, func(i int) bool { return rows[i].OK[2] && rows[i].WeirOverDirect.P99 <= budget })
	s.Bare = sustained(rates, func(i int) bool { return rows[i].OK[1] && rows[i].BareOverDirect.P99 <= budget })
	if s.Bare > 0 {
		s.Ratio = float64(s.Weir) / float64(s.Bare)
	}
	s.Capped = s.Bare == rates[len(rates)-1]
	return s
}

func idlePerStream(rs []IdleResult) []IdlePerStream {
	// A result is this process's (Process "") or a worker child's.
	type where struct{ process, target string }
	byN := map[int]map[where]IdleResult{}
	var ns []int
	for _, r := range rs {
		if byN[r.N] == nil {
			byN[r.N] = map[where]IdleResult{}
			ns = append(ns, r.N)
		}
		byN[r.N][where{r.Process, r.Target}] = r
	}
	slices.Sort(ns)
	per := func(x IdleResult) int64 {
		if x.Opened == 0 {
			return 0
		}
		return x.RSSGrowth / int64(x.Opened)
	}
	peak := func(x IdleResult) int64 {
		if x.Opened == 0 {
			return 0
		}
		return x.PeakGrowth / int64(x.Opened)
	}
	var out []IdlePerStream
	for _, n := range ns {
		d, b, w := byN[n][where{"", "direct"}], byN[n][where{"", "bare"}], byN[n][where{"", "weir"}]
		wb, ww := byN[n][where{"worker", "bare"}], byN[n][where{"worker", "weir"}]
		i := IdlePerStream{N: n, Opened: [3]int{d.Opened, b.Opened, w.Opened},
			WorkerBarePerStream: per(wb), WorkerWeirPerStream: per(ww),
			WorkerBarePeakPerStream: peak(wb), WorkerWeirPeakPerStream: peak(ww),
			WorkerOpened: [2]int{wb.Opened, ww.Opened}}
		if d.Opened > 0 {
			i.DirectPerStream, i.WeirPerStream, i.BarePerStream = per(d), per(w)-per(d), per(b)-per(d)
			i.WeirPeakPerStream, i.BarePeakPerStream = peak(w)-peak(d), peak(b)-peak(d)
		}
		out = append(out, i)
	}
	return out
}

// WriteFiles writes results.md, results.json and latency.svg into dir.
func (rep *Report) WriteFiles(dir string) error {
	return writeResults(dir, rep, map[string]string{"results.md": rep.Markdown(), "latency.svg": rep.SVG()})
}

// writeResults writes rep as results.json into dir, and the other files.
func writeResults(dir string, rep any, files map[string]string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	files["results.json"] = string(js) + "\n"
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(b), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }
func us(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d)/float64(time.Microsecond)) }
func kib(b int64) string        { return fmt.Sprintf("%.1f", float64(b)/1024) }

func triple(s Summary) string { return ms(s.P50) + " / " + ms(s.P99) + " / " + ms(s.Max) }
func addedTriple(a Added) string {
	return ms(a.P50) + " / " + ms(a.P99) + " / " + ms(a.Max)
}

// behind marks a step that did not keep up.
func behind(ok bool) string {
	if ok {
		return ""
	}
	return " †"
}

func errCell(c Comparison) string {
	return fmt.Sprintf("%d / %d / %d", c.Direct.Errors, c.Bare.Errors, c.Weir.Errors)
}

// Markdown is the report as tables.
func (rep *Report) Markdown() string {
	r := rep.Results
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# weir bench — %s\n\n", r.Started.Format(time.RFC3339))
	reuse := "on"
	if r.Config.NoLeaseReuse {
		reuse = "off (--no-lease-reuse)"
	}
	p("%s, GOMAXPROCS %d; each step %v measured after %v warm-up, open loop; stream step at %d req/s; seed %d; lease reuse %s; run took %v.\n",
		r.GoVersion, r.GOMAXPROCS, r.Config.Duration, r.Config.Warmup, r.Config.StreamRate, r.Config.Seed, reuse, r.Elapsed.Round(time.Second))
	p("Targets: **direct** (the simulator), **bare** (`httputil.ReverseProxy`), **weir** (data plane → control plane → Postgres → simulator). ")
	p("Latencies in ms as p50 / p99 / max from each request's scheduled start; *added* is a difference of percentiles. Errors: direct / bare / weir.\n\n")

	rep.headline(p)
	for _, s := range rep.Sustained {
		p("## Sim latency %v: non-streaming /v1/messages\n\n", s.SimLatency)
		p("| rate/s | direct | bare | weir | bare − direct | weir − direct | weir − bare | errors |\n|---:|---|---|---|---|---|---|---|\n")
		for _, c := range rep.Comparisons {
			if c.SimLatency != s.SimLatency || c.Stream {
				continue
			}
			p("| %d | %s | %s | %s | %s | %s | %s | %s |\n", c.Rate, triple(c.Direct.Latency), triple(c.Bare.Latency), triple(c.Weir.Latency),
				addedTriple(c.BareOverDirect), addedTriple(c.WeirOverDirect), addedTriple(c.WeirOverBare), errCell(c))
		}
		p("\nHighest rate with weir's p99 within 1 / 5 / 10 ms of the bare proxy's: **%d / %d / %d** req/s. ",
			s.WeirOverBareUnder[1], s.WeirOverBareUnder[5], s.WeirOverBareUnder[10])
		capped := ""
		if s.Capped {
			capped = " (the bare proxy held at the highest rate run: a lower bound)"
		}
		p("Sustained with p99 added over direct ≤ 10 ms: weir **%d**, bare **%d** req/s, ratio **%.0f%%**%s.\n\n", s.Weir, s.Bare, 100*s.Ratio, capped)

		p("CPU µs per request (this process; by difference with direct at the same rate), and the LeaseService calls as the data plane timed them: calls per request sent, then ms p50 / p99 (a reused lease makes no Acquire; successes settle in ReleaseBatch, off the request path):\n\n")
		p("| rate/s | direct (generator + sim) | bare − direct | weir − direct | weir's Postgres | Acquire | Release | ReleaseBatch |\n|---:|---:|---:|---:|---:|---|---|---|\n")
		for _, c := range rep.Comparisons {
			if c.SimLatency != s.SimLatency || c.Stream {
				continue
			}
			p("| %d | %s | %s%s | %s%s | %s%s | %s | %s | %s |\n", c.Rate, us(c.DirectCPUPerRequest), us(c.BareCPUPerRequest), behind(c.OK[1]),
				us(c.WeirCPUPerRequest), behind(c.OK[2]), us(c.WeirPGCPUPerRequest), behind(c.OK[2]),
				rpcCell(c.Weir.Acquire, c.Weir.Sent), rpcCell(c.Weir.Release, c.Weir.Sent), rpcCell(c.Weir.ReleaseBatch, c.Weir.Sent))
		}
		p("\n† fell behind (more than 0.1%% of requests failed or were dropped): CPU is divided by requests sent, not served, and latencies are those of the requests that were served.\n\n")
		for _, c := range rep.Comparisons {
			if c.SimLatency != s.SimLatency || !c.Stream {
				continue
			}
			p("Streams at %d req/s (20–64 deltas, 10–20 ms apart). TTFB is the first content_block_delta; gap is each later delta's delay beyond the simulator's pace (ms, p50 / p99 / max):\n\n", c.Rate)
			p("| | direct | bare | weir | bare − direct | weir − direct | weir − bare |\n|---|---|---|---|---|---|---|\n")
			p("| TTFB | %s | %s | %s | %s | %s | %s |\n", triple(c.Direct.TTFB), triple(c.Bare.TTFB), triple(c.Weir.TTFB),
				addedTriple(c.TTFBBareOverDirect), addedTriple(c.TTFBWeirOverDirect), addedTriple(c.TTFBWeirOverBare))
			p("| gap | %s | %s | %s | %s | %s | %s |\n", triple(c.Direct.Gap), triple(c.Bare.Gap), triple(c.Weir.Gap),
				addedTriple(added(c.Bare.Gap, c.Direct.Gap)), addedTriple(added(c.Weir.Gap, c.Direct.Gap)), addedTriple(added(c.Weir.Gap, c.Bare.Gap)))
			p("| whole stream | %s | %s | %s | %s | %s | %s |\n", triple(c.Direct.Latency), triple(c.Bare.Latency), triple(c.Weir.Latency),
				addedTriple(c.BareOverDirect), addedTriple(c.WeirOverDirect), addedTriple(c.WeirOverBare))
			p("\nErrors (direct / bare / weir): %s; CPU µs per stream: bare − direct %s, weir − direct %s (+ Postgres %s).\n\n", errCell(c),
				us(c.BareCPUPerRequest), us(c.WeirCPUPerRequest), us(c.WeirPGCPUPerRequest))
		}
	}
	if len(rep.Translation) > 0 {
		p("## Translation\n\n")
		p("A Messages client served by OpenAI accounts through a translating alias (Messages → Chat Completions and back), beside the untranslated path. ")
		p("Each path is measured over its own direct reference (the simulator's Messages, its Chat Completions), the same run and rate; *added* is the translated path's less the untranslated one's. ")
		p("Latency is the whole answer's (non-streaming) or the time to first token (streams), ms p50 / p99; CPU µs per request.\n\n")
		p("| sim latency | rate/s | | untranslated over direct | translated over direct | added p50 / p99 | CPU untranslated | CPU translated | CPU added |\n|---|---:|---|---|---|---|---:|---:|---:|\n")
		for _, x := range rep.Translation {
			kind := "whole"
			if x.Stream {
				kind = "TTFB"
			}
			p("| %v | %d | %s | %s | %s | %s / %s | %s | %s | %s%s |\n", x.SimLatency, x.Rate, kind,
				addedTriple(x.UntranslatedOver), addedTriple(x.Over), ms(x.AddedP50), ms(x.AddedP99),
				us(x.Untranslated), us(x.CPUPerRequest), us(x.CPUAdded), behind(x.OK))
		}
		p("\n")
	}
	if len(rep.Idle) > 0 {
		p("## Open idle streams\n\n")
		p("Streams held open and silent after their first delta; KiB of this process's RSS per stream, by difference with the same count opened directly (peak: VmHWM).")
		for _, c := range r.StreamsCapped {
			p(" %d streams were asked for and %d opened: a proxied stream holds four descriptors in this one process and RLIMIT_NOFILE is %d.", c[0], c[1], r.FileLimit)
		}
		p("\n\n")
		p("| streams | opened (d / b / w) | direct (client + sim) | bare − direct | weir − direct | bare − direct, peak | weir − direct, peak |\n|---:|---|---:|---:|---:|---:|---:|\n")
		for _, i := range rep.Idle {
			if i.Opened[0] == 0 {
				continue
			}
			p("| %d | %d / %d / %d | %s | %s | %s | %s | %s |\n", i.N, i.Opened[0], i.Opened[1], i.Opened[2], kib(i.DirectPerStream),
				kib(i.BarePerStream), kib(i.WeirPerStream), kib(i.BarePeakPerStream), kib(i.WeirPeakPerStream))
		}
		p("\n")
		if rep.hasWorkers() {
			p("The same streams through a worker process of its own (this binary re-executed as the bare proxy, or as a weir data plane " +
				"against the control plane here): KiB of that process's RSS per stream, read after it collected its garbage; nothing to subtract.\n\n")
			p("| streams | opened (b / w) | bare proxy | weir worker | bare proxy, peak | weir worker, peak |\n|---:|---|---:|---:|---:|---:|\n")
			for _, i := range rep.Idle {
				if i.WorkerOpened == [2]int{} {
					continue
				}
				p("| %d | %d / %d | %s | %s | %s | %s |\n", i.N, i.WorkerOpened[0], i.WorkerOpened[1], kib(i.WorkerBarePerStream),
					kib(i.WorkerWeirPerStream), kib(i.WorkerBarePeakPerStream), kib(i.WorkerWeirPeakPerStream))
			}
			p("\n")
		}
	}
	if st := r.Storm; st != nil {
		p("## Capacity storm\n\n")
		p("%d requests sent to weir at once while every account answers 529; after %v to settle into their holds, measured for %v: "+
			"%d still held at the end, %d upstream attempts in the window (the breaker's probes), CPU %s ms in this process and %s ms in Postgres: **%.1f%% of one core**.\n\n",
			st.N, min(stormRamp, st.Window), st.Window, st.Held, st.UpstreamAttempts, ms(st.CPU), ms(st.Postgres), st.CorePercent())
	}
	if r.Profile != "" {
		p("CPU profile: %s.\n", r.Profile)
	}
	return b.String()
}

// headline is issue 7's targets against this run.
func (rep *Report) headline(p func(string, ...any)) {
	p("## Headline (issue 7's targets)\n\n| measure | target | measured |\n|---|---|---|\n")
	for _, s := range rep.Sustained {
		for _, c := range rep.Comparisons {
			if c.SimLatency == s.SimLatency && !c.Stream && c.Rate == 500 {
				p("| added over bare proxy at 500 req/s, sim %v: p50 / p99 | ≤ 0.3 / ≤ 1 ms | %s / %s ms (weir errors %d) |\n",
					s.SimLatency, ms(c.WeirOverBare.P50), ms(c.WeirOverBare.P99), c.Weir.Errors)
			}
		}
		p("| sustained rate with p99 added ≤ 10 ms, sim %v: weir / bare | ≥ 70%% | %d / %d req/s = %.0f%% |\n", s.SimLatency, s.Weir, s.Bare, 100*s.Ratio)
	}
	for _, c := range rep.Comparisons {
		if c.Stream {
			p("| stream TTFB added over bare p99, sim %v, %d streams/s | ≤ 1 ms | %s ms |\n", c.SimLatency, c.Rate, ms(c.TTFBWeirOverBare.P99))
			p("| inter-event gap p99 change over bare, sim %v | within noise | %s ms |\n", c.SimLatency, ms(c.Weir.Gap.P99-c.Bare.Gap.P99))
		}
	}
	for _, i := range rep.Idle {
		if i.Opened[0] > 0 {
			p("| RSS per open idle stream over direct, %d streams | ≤ 64 KiB | %s KiB (bare proxy: %s) |\n", i.N, kib(i.WeirPerStream), kib(i.BarePerStream))
		}
	}
	for _, i := range rep.Idle {
		if i.WorkerOpened != [2]int{} {
			p("| RSS per open idle stream in the worker's own process, %d streams | ≤ 64 KiB | %s KiB (bare proxy: %s) |\n", i.N,
				kib(i.WorkerWeirPerStream), kib(i.WorkerBarePerStream))
		}
	}
	if st := rep.Results.Storm; st != nil {
		p("| %d held requests in a storm: CPU | < 5%% of a core | %.1f%% (%d still held) |\n", st.N, st.CorePercent(), st.Held)
	}
	p("\n")
}

// rpcCell is one LeaseService method's column: calls per request sent,
// then p50 / p99 in ms; "–" when it was not called.
func rpcCell(s Summary, sent int) string {
	if s.N == 0 || sent <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f × %s / %s", float64(s.N)/float64(sent), ms(s.P50), ms(s.P99))
}

func (rep *Report) hasWorkers() bool {
	for _, i := range rep.Idle {
		if i.WorkerOpened != [2]int{} {
			return true
		}
	}
	return false
}
