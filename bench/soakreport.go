package bench

import (
	"fmt"
	"strings"
	"time"
)

// Markdown is the soak's report: the verdicts, the requests, what weir
// did, and every sample.
func (r *SoakResult) Markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	c := r.Config
	p("# weir soak — %s\n\n", r.Started.Format(time.RFC3339))
	p("%s, GOMAXPROCS %d; %v of traffic at %d req/s through two workers sharing one control plane (embedded Postgres); "+
		"a 429 burst on one account (the next each time) and a %v capacity storm every %v; sampled every %v; seed %d; run took %v.\n\n",
		r.GoVersion, r.GOMAXPROCS, c.Duration, c.Rate, c.StormLength, c.StormEvery, c.SampleEvery, c.Seed, r.Elapsed.Round(time.Second))
	p("Everything but Postgres (the load generator, the simulator, the control plane, both workers) runs in the one process sampled. " +
		"The baseline is that process idle before traffic, after a few requests of every kind; *settled* is it idle again once every request ended " +
		"and the idle keep-alive connections were closed (a bounded cache, not a leak)")
	p(", %v after the last request.\n\n", r.SettledAfter.Round(100*time.Millisecond))
	b.WriteString(r.Summary())

	p("## What weir did\n\nFrom the workers' and the control plane's metrics over the whole run.\n\n| | count |\n|---|---:|\n")
	for _, x := range r.Exercised {
		p("| %s | %d |\n", x.Name, x.Value)
	}
	p("\n")

	second, last := quarters(r.Samples, c.Duration)
	p("## Under traffic\n\nMedians of the samples in the second and in the last quarter of the traffic (the first is warm-up); %d and %d samples.\n\n", len(second), len(last))
	p("| | second quarter | last quarter |\n|---|---:|---:|\n")
	// unit: "" a count, "MiB" bytes shown in MiB, "/1000" thousandths.
	rows := []struct {
		name string
		f    func(Sample) int64
		unit string
	}{
		{"goroutines", func(s Sample) int64 { return int64(s.Goroutines) }, ""},
		{"open file descriptors", func(s Sample) int64 { return int64(s.FDs) }, ""},
		{"Go heap in use after GC (MiB)", func(s Sample) int64 { return s.HeapInuse }, "MiB"},
		{"RSS (MiB)", func(s Sample) int64 { return s.RSS }, "MiB"},
		{"live leases", func(s Sample) int64 { return int64(s.LiveLeases) }, ""},
		{"Postgres connections in use", func(s Sample) int64 { return int64(s.PGInUse) }, ""},
		{"requests in flight", func(s Sample) int64 { return int64(s.InFlight) }, ""},
		{"requests ended per sample", func(s Sample) int64 { return int64(s.OK + s.Cancelled + s.Failed) }, ""},
		{"CPU of this process (cores)", func(s Sample) int64 { return int64(1000 * s.CPU) }, "/1000"},
		{"machine load average", func(s Sample) int64 { return int64(1000 * s.Load) }, "/1000"},
	}
	for _, row := range rows {
		a, z := median(second, row.f), median(last, row.f)
		switch row.unit {
		case "MiB":
			p("| %s | %s | %s |\n", row.name, mib(a), mib(z))
		case "/1000":
			p("| %s | %.2f | %.2f |\n", row.name, float64(a)/1000, float64(z)/1000)
		default:
			p("| %s | %d | %d |\n", row.name, a, z)
		}
	}
	p("\n## Samples\n\nt from the start of traffic; requests are those that ended since the previous sample. ⚡ a storm was on. ")
	p("CPU: cores used since the previous sample by this process and by Postgres; load: the machine's one-minute load average.\n\n")
	p("| t (s) | | goroutines | FDs | heap MiB | RSS MiB | live leases | PG in use / open | ok | cancelled | failed | in flight | CPU / PG | load |\n")
	p("|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|---:|\n")
	row := func(label string, s Sample) {
		storm := ""
		if s.Storm {
			storm = "⚡"
		}
		p("| %s | %s | %d | %d | %s | %s | %d | %d / %d | %d | %d | %d | %d | %.2f / %.2f | %.1f |\n", label, storm, s.Goroutines, s.FDs,
			mib(s.HeapInuse), mib(s.RSS), s.LiveLeases, s.PGInUse, s.PGOpen, s.OK, s.Cancelled, s.Failed, s.InFlight, s.CPU, s.PGCPU, s.Load)
	}
	row("baseline", r.Baseline)
	for _, s := range r.Samples {
		row(fmt.Sprintf("%.1f", s.At.Seconds()), s)
	}
	row(fmt.Sprintf("settled (%.1f)", r.Settled.At.Seconds()), r.Settled)
	p("\n")
	return b.String()
}

// Summary is the verdicts and the requests: what `weir soak` prints.
func (r *SoakResult) Summary() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	if failed := r.Failed(); len(failed) > 0 {
		p("**FAIL**: %d of %d checks failed (%s).\n\n", len(failed), len(r.Checks), strings.Join(failed, "; "))
	} else {
		p("**PASS**: all %d checks passed.\n\n", len(r.Checks))
	}
	p("## Checks\n\n| check | tolerance | measured | verdict |\n|---|---|---|---|\n")
	for _, c := range r.Checks {
		v := "PASS"
		if !c.Pass {
			v = "**FAIL**"
		}
		p("| %s | %s | %s | %s |\n", c.Name, c.Tolerance, c.Measured, v)
	}
	q := r.Requests
	p("\n## Requests\n\n%d served, %d cancelled by their client as planned, %d failed; %d storms, ", q.OK, q.Cancelled, q.Failed, len(r.Storms))
	p("%d requests due during one served, %d failed; %d served with a session header.\n\n", q.StormServed, q.StormFailed, q.Sessions)
	p("| kind | share | served (cancelled, for the cancelling kind) |\n|---|---:|---:|\n")
	for _, k := range requestKinds {
		p("| %s | %.0f%% | %d |\n", k.name, 100*k.share, q.Served[k.name])
	}
	if len(q.Failures) > 0 {
		p("\nFailures, by kind (the first one's answer):\n\n| kind | count | first |\n|---|---:|---|\n")
		for _, f := range q.Failures {
			p("| %s | %d | %s |\n", f.What, f.Count, cell(f.First))
		}
	}
	p("\n")
	return b.String()
}

// cell makes text safe in a table cell.
func cell(s string) string {
	s = strings.NewReplacer("|", `\|`, "\n", " ", "\r", " ").Replace(s)
	if r := []rune(s); len(r) > 200 {
		s = string(r[:200]) + "…"
	}
	return s
}
